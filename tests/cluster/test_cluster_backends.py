"""
Failover between nodes of different backends: a chunked leader's confirmed messages are all on
its sqlite or filelog follower when it takes over, and those a consumer held unacknowledged
come back flagged redelivered.
"""

import time

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

HELD_UNACKED = 10


@pytest.mark.parametrize("follower_backend", ["sqlite", "filelog"])
def test_a_chunked_leader_fails_over_to_another_backend_with_every_confirmed_message(
        make_cluster, follower_backend):
    cluster = make_cluster(ttl=TTL, min_isr=2).start(names=("a", "b"), backends={"b": follower_backend})
    leader, follower = cluster["a"], cluster["b"]
    assert cluster.leader() is leader
    cluster.wait_in_sync_set(["a", "b"])
    publisher = ConfirmedPublisher(lambda: [leader.amqp_address()], "orders", arguments={"x-queue-type": "quorum"})
    publisher.start()
    publisher.wait_confirms(100)
    held, _ = read_queue(leader.amqp_address(), "orders", ack=False, limit=HELD_UNACKED)
    publisher.wait_confirms(publisher.confirms() + 50)
    killed_at = time.monotonic()
    leader.kill()
    publisher.finish()
    assert cluster.wait_leader(timeout=TTL + TAKEOVER_MARGIN, other_than=leader) is follower

    taken, _ = read_queue(follower.amqp_address(), "orders")
    bodies = [body for body, _ in taken]
    missing = publisher.confirmed_bodies() - set(bodies)
    assert not missing, f"{len(missing)} confirmed messages lost: {sorted(missing)[:10]}\n{cluster.describe()}"
    assert len(bodies) == len(set(bodies))
    assert {body for body, _ in held} <= {body for body, redelivered in taken if redelivered}
    print(f"{follower_backend} follower served {time.monotonic() - killed_at:.2f} s after the kill")
