"""
A three-node cluster of real ``twistd brokerd`` processes and etcd, driven with pika: one node is
elected and serves, its confirms wait for the in-sync set, and when it is killed under load (or
stopped past its lease) another takes over with every message it confirmed, the old one never
confirming again once the new one has.
"""

import time

from tests.support.cluster import (
    TAKEOVER_MARGIN,
    TTL,
    ConfirmedPublisher,
    make_cluster,  # noqa: F401 (fixture)
    read_queue,
)
from tests.support.etcd import needs_etcd

pytestmark = needs_etcd

HELD_UNACKED = 20


def test_one_of_three_is_elected_its_confirms_go_through_and_all_three_are_in_sync(make_cluster):
    cluster = make_cluster(ttl=TTL, min_isr=2).start()
    leader = cluster.wait_leader()
    assert sum(node.says_it_serves() for node in cluster.nodes.values()) == 1
    publisher = ConfirmedPublisher(lambda: [leader.amqp_address()], "orders", limit=50)
    publisher.start()
    publisher.wait_confirms(50)
    publisher.finish()
    assert not publisher.unconfirmed, publisher.failures
    cluster.wait_in_sync_set(["a", "b", "c"])
    taken, _ = read_queue(leader.amqp_address(), "orders")
    assert sorted(body for body, _ in taken) == sorted(publisher.confirmed_bodies())


def test_a_killed_leader_is_replaced_within_its_lease_with_every_confirmed_message(make_cluster):
    # min-isr 1: the new leader confirms alone until the surviving follower rejoins it.
    cluster = make_cluster(ttl=TTL, min_isr=1).start()
    old = cluster.wait_leader()
    cluster.wait_in_sync_set(["a", "b", "c"])
    publisher = ConfirmedPublisher(cluster.amqp_addresses, "orders")
    publisher.start()
    publisher.wait_confirms(100)
    # A consumer holds messages it has not acknowledged when the leader dies.
    held, _ = read_queue(old.amqp_address(), "orders", ack=False, limit=HELD_UNACKED)
    assert len(held) == HELD_UNACKED
    publisher.wait_confirms(publisher.confirms() + 50)
    killed_at = time.monotonic()
    old.kill()
    new = cluster.wait_leader(timeout=TTL + TAKEOVER_MARGIN, other_than=old)
    serving_after = time.monotonic() - killed_at
    publisher.wait_confirms(publisher.confirms() + 50)
    publisher.finish()
    first_confirm = publisher.first_confirm_after(killed_at) - killed_at
    print(f"kill to serving: {serving_after:.2f} s; kill to first confirm: {first_confirm:.2f} s")
    assert serving_after <= TTL + TAKEOVER_MARGIN

    taken, _ = read_queue(new.amqp_address(), "orders")
    bodies = [body for body, _ in taken]
    confirmed = publisher.confirmed_bodies()
    missing = confirmed - set(bodies)
    assert not missing, f"{len(missing)} confirmed messages lost: {sorted(missing)[:10]}\n{cluster.describe()}"
    assert len(bodies) == len(set(bodies)), "a message came back twice"
    assert set(bodies) <= confirmed | set(publisher.unconfirmed)
    redelivered = {body for body, flag in taken if flag}
    assert {body for body, _ in held} <= redelivered


def test_a_leader_stopped_past_its_lease_never_confirms_once_its_successor_has(make_cluster):
    cluster = make_cluster(ttl=TTL, min_isr=1).start()
    old = cluster.wait_leader()
    cluster.wait_in_sync_set(["a", "b", "c"])
    # One publisher per node, each only ever to that node: the old leader's first incarnation's
    # address, the others' current ones (relayed to the leader while they follow).
    old_address = old.amqp_address()
    publishers = {
        node.name: ConfirmedPublisher(
            (lambda: [old_address]) if node is old else (lambda node=node: [node.amqp_address()]),
            "fenced", prefix=node.name)
        for node in cluster.nodes.values()
    }
    for publisher in publishers.values():
        publisher.start()
    publishers[old.name].wait_confirms(30)
    old.pause()
    paused_at = time.monotonic()
    new = cluster.wait_leader(timeout=TTL + TAKEOVER_MARGIN, other_than=old)
    publishers[new.name].wait_confirms(30)
    old.resume()
    old.process.wait_for_output("starts again as a follower", timeout=TTL + TAKEOVER_MARGIN)
    old.wait_joined()
    publishers[new.name].wait_confirms(publishers[new.name].confirms() + 30)
    for publisher in publishers.values():
        publisher.finish()

    # Clients of a follower are relayed to the leader: count each confirm for the node that sent it.
    old_times = [when for publisher in publishers.values() for when in publisher.confirm_times_of(old.name)]
    new_times = [when for publisher in publishers.values() for when in publisher.confirm_times_of(new.name)]
    print(f"old leader's last confirm {max(old_times) - paused_at:+.3f} s after SIGSTOP;"
          f" new leader's first {min(new_times) - paused_at:+.3f} s after")
    assert max(old_times) < min(new_times), cluster.describe()
    others = [name for name in publishers if name not in (old.name, new.name)]
    assert not [when for publisher in publishers.values() for name in others
                for when in publisher.confirm_times_of(name)], "only leaders confirm"
    assert old_times and new_times
    # Every message either leader confirmed is on the new one.
    taken, _ = read_queue(new.amqp_address(), "fenced")
    confirmed = publishers[old.name].confirmed_bodies() | publishers[new.name].confirmed_bodies()
    assert confirmed <= {body for body, _ in taken}
