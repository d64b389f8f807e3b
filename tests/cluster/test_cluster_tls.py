"""
Replication over TLS: the leader's replication port serves TLS (an ssl: endpoint, as --amqps), its
followers check its certificate's chain and name before they say anything, and a node that does
not trust the certificate's authority never follows (nor joins the in-sync set).
"""

import trustme

from brokerd.testing import poll_until
from tests.support.cluster import (
    ConfirmedPublisher,
    make_cluster,  # noqa: F401 (fixture)
    read_queue,
)
from tests.support.etcd import needs_etcd

pytestmark = needs_etcd


def tls_options(directory, trusted=True):
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    key, cert, roots = directory / "key.pem", directory / "cert.pem", directory / "roots"
    server.private_key_pem.write_to_path(str(key))
    server.cert_chain_pems[0].write_to_path(str(cert))
    roots.mkdir()
    (ca if trusted else trustme.CA()).cert_pem.write_to_path(str(roots / "ca.pem"))
    return ca, ["--replication", f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}",
                "--replication-trust-roots", str(roots)]


def test_followers_replicate_over_tls_and_one_that_does_not_trust_the_leader_stays_out(make_cluster, tmp_path):
    ca, options = tls_options(tmp_path)
    cluster = make_cluster(ttl=3, min_isr=2).start(names=("a", "b"), options=options)
    leader = cluster.wait_leader()
    cluster.wait_in_sync_set(["a", "b"])
    assert "replication=tls:127.0.0.1:" in " ".join(leader.lines())
    publisher = ConfirmedPublisher(lambda: [leader.amqp_address()], "secure", limit=30)
    publisher.start()
    publisher.wait_confirms(30)
    publisher.finish()

    stranger_dir = tmp_path / "stranger"
    stranger_dir.mkdir()
    _, untrusting = tls_options(stranger_dir, trusted=False)
    stranger = cluster.add("c", options=untrusting).start()
    stranger.wait_joined()
    poll_until(lambda: any("certificate verify failed" in line or "CERTIFICATE_VERIFY_FAILED" in line
                           for line in stranger.lines()) or None, 30, "the untrusting node's refusal")
    assert sorted(cluster.in_sync_set()) == ["a", "b"]
    cluster.leader().kill()
    survivor = cluster.wait_leader(timeout=10, other_than=leader)
    assert survivor.name == "b", "only an in-sync follower may take the lead"
    taken, _ = read_queue(survivor.amqp_address(), "secure")
    assert {body for body, _ in taken} == publisher.confirmed_bodies()
