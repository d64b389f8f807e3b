"""Who may do what: users, virtual hosts and permissions, free of any wire protocol.

L{brokerd.access.database.AccessDatabase} keeps them durably in the broker's
data directory (apart from the message store); L{brokerd.access.passwords}
hashes passwords as RabbitMQ does; L{brokerd.access.login} checks logins and
vhost access for both protocols; L{brokerd.access.permissions} checks an
operation against a user's configure / write / read expressions in one place
for every protocol; L{brokerd.access.vhosts} creates and deletes vhosts in the
database and the running broker together; L{brokerd.access.commands} carries
out rabbitmqctl's user, vhost and permission commands for an administrator;
L{brokerd.access.parameters} keeps runtime and global parameters and checks
limits in RabbitMQ's words, L{brokerd.access.limits} enforces the vhosts' and
users' limits; L{brokerd.access.interfaces} names their roles.
"""
