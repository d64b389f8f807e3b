"""
Flow on a cluster of real processes: while the leader's in-sync set holds fewer nodes than
--cluster-min-isr, its publishers are blocked (pika gets connection.blocked naming the count) rather
than confirmed or left to fill the leader's memory, at the leader's start until a follower is in sync
and again once a follower is stopped past the lag bound; a consumer gets and acks meanwhile, the
management API shows the alarm, connection.unblocked follows once the follower is back, and every
confirmed message is kept. (The alarm on a task.Clock: tests/model/test_in_sync_alarm.py.)
"""

import pika

from tests.support.cluster import (
    START_SECONDS,
    LAG_MARGIN,
    MAX_LAG,
    TTL,
    ConfirmedPublisher,
    connect,
    declare,
    make_cluster,  # noqa: F401 (fixture)
    read_queue,
)
from tests.support.etcd import needs_etcd
from tests.support.httpapi import Api
from tests.support.pika_clients import pump

pytestmark = needs_etcd

REASON = "replication: 1 in-sync node of the 2 --cluster-min-isr asks for"
PERSISTENT = pika.BasicProperties(delivery_mode=2)
WORK = 10  # messages a consumer takes while publishers are blocked


def notices_of(connection):
    """The connection.blocked (with its reason) and connection.unblocked pika reports, in order."""
    notices = []
    connection.add_on_connection_blocked_callback(
        lambda _, frame: notices.append(("blocked", frame.method.reason)))
    connection.add_on_connection_unblocked_callback(lambda _, frame: notices.append(("unblocked", None)))
    return notices


def in_sync_alarms(node):
    """Each node's in_sync_alarm as C{node}'s /api/nodes shows it."""
    host, port = node.addresses()["http"]
    return {entry["name"]: entry["in_sync_alarm"] for entry in Api(f"tcp:{host}:{port}").get("/api/nodes")}


def consume_and_ack(address, queue, count):
    """A consumer on its own connection gets C{count} messages of C{queue} and acks each."""
    connection = connect(address)
    channel = connection.channel()
    acked = []

    def on_message(channel, method, properties, body):
        channel.basic_ack(method.delivery_tag)
        acked.append(body.decode())

    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(acked) >= count, f"{count} deliveries to a consumer", timeout=START_SECONDS)
    connection.close()
    return acked


def test_publishers_are_blocked_while_too_few_nodes_are_in_sync_and_consumers_go_on(make_cluster):
    cluster = make_cluster(ttl=TTL, min_isr=2, max_lag_seconds=MAX_LAG).start(names=("a",))
    leader = cluster.wait_leader()
    publisher = connect(leader.amqp_address(), blocked_timeout=None)
    notices = notices_of(publisher)
    plain = publisher.channel()
    declare(plain, "work")
    declare(plain, "orders")

    # A new leader's set is itself alone: its first publisher is held until a follower is in sync.
    plain.basic_publish("", "work", b"work-0", PERSISTENT)
    pump(publisher, lambda: notices, "connection.blocked at the leader's start", timeout=START_SECONDS)
    assert notices == [("blocked", REASON)]
    follower = cluster.add("b").start()
    follower.wait_joined()
    cluster.wait_in_sync_set(["a", "b"])
    pump(publisher, lambda: len(notices) == 2, "connection.unblocked once b is in sync", timeout=START_SECONDS)
    assert notices[1] == ("unblocked", None)
    confirmed = publisher.channel()
    confirmed.confirm_delivery()
    for number in range(1, WORK):
        confirmed.basic_publish("", "work", f"work-{number}".encode(), PERSISTENT)
    flow = ConfirmedPublisher(lambda: [leader.amqp_address()], "orders", prefix="flow", pause=0.01)
    flow.start()
    flow.wait_confirms(20)

    # The follower stops: past the lag bound it leaves the set, and the next publish is the last read.
    follower.pause()
    cluster.wait_in_sync_set(["a"], timeout=MAX_LAG + LAG_MARGIN)
    plain.basic_publish("", "orders", b"taken", PERSISTENT)
    pump(publisher, lambda: len(notices) == 3, "connection.blocked once b left the set", timeout=START_SECONDS)
    assert notices[2] == ("blocked", REASON)
    assert in_sync_alarms(leader) == {"brokerd@a": True, "brokerd@b": False}
    held_at = flow.confirms()
    # A consumer gets and acks meanwhile; no publisher gets a confirm.
    assert sorted(consume_and_ack(leader.amqp_address(), "work", WORK)) == sorted(f"work-{n}" for n in range(WORK))
    assert flow.confirms() == held_at, "a confirm went out with one node in sync of 2"

    follower.resume()
    cluster.wait_in_sync_set(["a", "b"])
    pump(publisher, lambda: len(notices) == 4, "connection.unblocked once b is back", timeout=START_SECONDS)
    assert notices[3] == ("unblocked", None)
    assert in_sync_alarms(leader) == {"brokerd@a": False, "brokerd@b": False}
    confirmed.basic_publish("", "orders", b"after", PERSISTENT)
    flow.wait_confirms(held_at + 5)
    flow.finish()
    publisher.close()
    assert not flow.unconfirmed, flow.failures
    taken, _ = read_queue(leader.amqp_address(), "orders")
    assert sorted(body for body, _ in taken) == sorted(flow.confirmed_bodies() | {"taken", "after"})
    assert read_queue(leader.amqp_address(), "work")[0] == [], "the consumer's acks were lost"
