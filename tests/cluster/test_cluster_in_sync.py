"""
The in-sync set of a cluster of real processes, as etcd holds it: a follower that stops
answering leaves it within --cluster-max-lag-seconds and the leader's confirms go on without it,
unless that leaves fewer nodes in sync than --cluster-min-isr, when confirms wait for it.
"""

import time

from tests.support.cluster import (
    LAG_MARGIN,
    MAX_LAG,
    TTL,
    ConfirmedPublisher,
    make_cluster,  # noqa: F401 (fixture)
    read_queue,
)
from tests.support.etcd import needs_etcd

pytestmark = needs_etcd

HELD_SECONDS = 3.0  # how long a held confirm is watched not to arrive


def test_a_stopped_follower_leaves_the_in_sync_set_and_confirms_go_on(make_cluster):
    cluster = make_cluster(ttl=TTL, min_isr=2, max_lag_seconds=MAX_LAG).start()
    leader = cluster.wait_leader()
    cluster.wait_in_sync_set(["a", "b", "c"])
    publisher = ConfirmedPublisher(lambda: [leader.amqp_address()], "orders")
    publisher.start()
    publisher.wait_confirms(30)
    follower, other = cluster.followers(leader)
    follower.pause()
    paused_at = time.monotonic()
    cluster.wait_in_sync_set([leader.name, other.name], timeout=MAX_LAG + LAG_MARGIN)
    left_after = time.monotonic() - paused_at
    publisher.wait_confirms(publisher.confirms() + 30)
    print(f"follower left the in-sync set {left_after:.2f} s after SIGSTOP")
    follower.resume()
    cluster.wait_in_sync_set(["a", "b", "c"])
    publisher.finish()
    assert not publisher.unconfirmed, publisher.failures
    taken, _ = read_queue(leader.amqp_address(), "orders")
    assert sorted(body for body, _ in taken) == sorted(publisher.confirmed_bodies())


def test_with_fewer_in_sync_than_min_isr_confirms_wait_for_the_follower(make_cluster):
    cluster = make_cluster(ttl=TTL, min_isr=2, max_lag_seconds=MAX_LAG).start(names=("a", "b"))
    leader = cluster.wait_leader()
    follower, = cluster.followers(leader)
    cluster.wait_in_sync_set(["a", "b"])
    before = ConfirmedPublisher(lambda: [leader.amqp_address()], "orders", prefix="before", limit=10)
    before.start()
    before.wait_confirms(10)
    before.finish()

    follower.pause()
    held = ConfirmedPublisher(lambda: [leader.amqp_address()], "orders", prefix="held", limit=1)
    held.start()
    cluster.wait_in_sync_set([leader.name], timeout=MAX_LAG + LAG_MARGIN)
    held.join(HELD_SECONDS)
    assert held.confirms() == 0 and held.is_alive(), "a confirm went out with one node in sync of 2"
    follower.resume()
    held.wait_confirms(1, timeout=MAX_LAG + LAG_MARGIN + 10)
    held.finish()
    cluster.wait_in_sync_set(["a", "b"])
    taken, _ = read_queue(leader.amqp_address(), "orders")
    assert sorted(body for body, _ in taken) == sorted(before.confirmed_bodies() | {"held-0"})
