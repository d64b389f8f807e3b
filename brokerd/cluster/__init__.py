"""
A cluster's footing in etcd: a bounded client of etcd's v3 JSON gateway (L{etcd}, L{watch}),
a lease kept alive with a fencing deadline (L{lease}), and leadership and membership built on
them (L{leadership}). brokerd never votes: etcd decides who leads.
"""
