"""
etcd lost under a running cluster: the leader stops confirming once its lease can no longer be
trusted and every node starts again, waiting for etcd; when etcd is back an election follows and
every message confirmed before the loss is on the new leader.
"""

import time

from brokerd.testing import poll_until
from tests.support.cluster import (
    TTL,
    ConfirmedPublisher,
    make_cluster,  # noqa: F401 (fixture)
    read_queue,
)
from tests.support.etcd import needs_etcd

pytestmark = needs_etcd


def test_while_etcd_is_gone_nothing_is_confirmed_and_once_it_is_back_a_leader_serves_all(make_cluster):
    cluster = make_cluster(ttl=TTL, min_isr=2).start()
    leader = cluster.wait_leader()
    cluster.wait_in_sync_set(["a", "b", "c"])
    publisher = ConfirmedPublisher(lambda: cluster.amqp_addresses(), "kept")
    publisher.start()
    publisher.wait_confirms(40)
    cluster.etcd.kill()
    lost_at = time.monotonic()
    # The leader fences itself within 2/3 of its lease and starts again as a follower.
    leader.process.wait_for_output("starts again as a follower", timeout=TTL + 5)
    assert all(when < lost_at + TTL * 2 / 3 + 0.5 for _, when, _ in publisher.confirmed), \
        "no confirm once the lease could no longer be trusted"
    quiet = publisher.confirms()
    cluster.etcd.restart()
    back_at = time.monotonic()
    new = cluster.wait_leader(timeout=30)
    publisher.wait_confirms(quiet + 20, timeout=60)
    publisher.finish()
    first_after = publisher.first_confirm_after(back_at)
    print(f"etcd back: a leader ({new.name}) confirmed {first_after - back_at:.2f} s later")
    taken, _ = read_queue(new.amqp_address(), "kept")
    assert publisher.confirmed_bodies() <= {body for body, _ in taken}, cluster.describe()
    poll_until(lambda: sorted(cluster.in_sync_set() or []) == ["a", "b", "c"] or None, 60,
               "all three back in the in-sync set")
