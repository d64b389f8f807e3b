"""
Nodes that come back: a follower killed and restarted resumes from what it holds and rejoins
the in-sync set, one whose data directory was wiped copies the leader's stores afresh, and a
killed leader returns as a follower of its successor; each then takes over with every message
confirmed while it was away, and none of those acknowledged meanwhile.
"""

import pytest

from tests.support.cluster import (
    TAKEOVER_MARGIN,
    TTL,
    ConfirmedPublisher,
    make_cluster,  # noqa: F401 (fixture)
    read_queue,
)
from tests.support.etcd import needs_etcd

pytestmark = needs_etcd

CATCH_UP_SECONDS = 20


def publish(node, prefix, count=30):
    """Publishes C{count} confirmed messages to node C{node}; their bodies."""
    publisher = ConfirmedPublisher(lambda: [node.amqp_address()], "orders", prefix=prefix, limit=count)
    publisher.start()
    publisher.wait_confirms(count)
    publisher.finish()
    return publisher.confirmed_bodies()


def consume(node):
    """Takes and acknowledges every message of the queue at C{node}; their bodies."""
    taken, _ = read_queue(node.amqp_address(), "orders")
    return {body for body, _ in taken}


def takes_over_with(cluster, node, confirmed):
    """Kills the leader, waits for C{node} to serve, and checks it holds exactly the C{confirmed}
    messages (those acknowledged meanwhile are not among them)."""
    leader = cluster.leader()
    leader.kill()
    assert cluster.wait_leader(timeout=TTL + TAKEOVER_MARGIN, other_than=leader) is node
    taken, _ = read_queue(node.amqp_address(), "orders")
    bodies = [body for body, _ in taken]
    missing = confirmed - set(bodies)
    assert not missing, f"{len(missing)} confirmed messages lost: {sorted(missing)[:10]}\n{cluster.describe()}"
    assert len(bodies) == len(set(bodies))
    back = set(bodies) - confirmed
    assert not back, f"{len(back)} acknowledged messages came back: {sorted(back)[:10]}"


@pytest.mark.parametrize("wiped", [False, True], ids=["resumes", "wiped-resyncs"])
def test_a_follower_restarted_catches_up_and_rejoins_the_in_sync_set(make_cluster, wiped):
    cluster = make_cluster(ttl=TTL, min_isr=1).start(names=("a", "b"))
    leader, follower = cluster["a"], cluster["b"]
    cluster.wait_in_sync_set(["a", "b"])
    confirmed = publish(leader, "before")
    follower.kill()
    cluster.wait_in_sync_set(["a"])
    assert consume(leader) == confirmed
    confirmed = publish(leader, "away")
    if wiped:
        follower.wipe()
    follower.start()
    cluster.wait_in_sync_set(["a", "b"], timeout=CATCH_UP_SECONDS)
    confirmed |= publish(leader, "after")
    takes_over_with(cluster, follower, confirmed)


def test_a_killed_leader_returns_as_a_follower_of_its_successor(make_cluster):
    cluster = make_cluster(ttl=TTL, min_isr=1).start(names=("a", "b"))
    old, new = cluster["a"], cluster["b"]
    cluster.wait_in_sync_set(["a", "b"])
    confirmed = publish(old, "first")
    old.kill()
    assert cluster.wait_leader(timeout=TTL + TAKEOVER_MARGIN, other_than=old) is new
    assert consume(new) == confirmed
    confirmed = publish(new, "second")
    old.start()
    cluster.wait_in_sync_set(["a", "b"], timeout=CATCH_UP_SECONDS)
    confirmed |= publish(new, "third")
    takes_over_with(cluster, old, confirmed)
