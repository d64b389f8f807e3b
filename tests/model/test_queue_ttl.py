"""Message TTL (expiration, x-message-ttl) and queue TTL (x-expires), on the broker's fake clock."""

import datetime

import pytest

from brokerd.errors import PreconditionFailed
from tests.support.broker import make_broker, open_channel, properties, ready


def send(channel, queue, body, expiration=None, persistent=False, exchange=""):
    props = properties(persistent) if expiration is None else properties(persistent, expiration=expiration)
    channel.basic_publish(exchange, queue, props, body)


def drain(channel, queue):
    bodies = []
    while (result := channel.basic_get(queue, no_ack=True)) is not None:
        bodies.append(result[2].body)
    return bodies


def with_dead_letters(channel, **arguments):
    """Queue "q" dead-lettering to fanout "dlx", which feeds queue "dead"."""
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx")
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "dlx", **arguments})


def at(seconds):
    """The x-death time of a death C{seconds} after the fake clock's start (the epoch)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


# -- per-message and per-queue TTL


def test_a_message_expires_after_its_expiration(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    send(channel, "q", b"short", expiration="1000")
    send(channel, "q", b"forever")
    clock.advance(0.999)
    assert ready(broker, "q") == 2
    clock.advance(0.001)
    assert ready(broker, "q") == 1
    assert drain(channel, "q") == [b"forever"]


def test_a_queue_ttl_expires_every_message_that_long_after_it_arrived(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    send(channel, "q", b"first")
    clock.advance(0.5)
    send(channel, "q", b"second")
    clock.advance(0.5)
    assert channel.queue_declare("q", passive=True) == ("q", 1, 0)
    clock.advance(0.5)
    assert channel.queue_declare("q", passive=True) == ("q", 0, 0)
    assert channel.basic_get("q") is None


@pytest.mark.parametrize("queue_ttl, expiration", [(5000, "1000"), (1000, "5000")])
def test_the_smaller_of_message_and_queue_ttl_wins(broker, clock, queue_ttl, expiration):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-message-ttl": queue_ttl})
    send(channel, "q", b"m", expiration=expiration)
    clock.advance(0.999)
    assert ready(broker, "q") == 1
    clock.advance(0.001)
    assert ready(broker, "q") == 0


def test_expired_messages_are_not_delivered_to_a_late_consumer(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    send(channel, "q", b"old")
    clock.advance(1)
    send(channel, "q", b"new")
    channel.basic_consume("q")
    clock.advance(0)
    assert peer.bodies() == [b"new"]


def test_a_short_lived_message_behind_a_long_lived_head_expires_on_time(broker, clock):
    channel, _ = open_channel(broker)
    with_dead_letters(channel)
    send(channel, "q", b"long", expiration="10000")
    send(channel, "q", b"short", expiration="1000")
    send(channel, "q", b"none")
    clock.advance(0.999)
    assert ready(broker, "q") == 3
    assert ready(broker, "dead") == 0
    clock.advance(0.001)
    assert ready(broker, "q") == 2
    _tag, _redelivered, dead, _left = channel.basic_get("dead", no_ack=True)
    assert dead.body == b"short"
    assert dead.headers["x-death"][0]["reason"] == "expired"
    assert dead.headers["x-death"][0]["time"] == at(1)
    assert drain(channel, "q") == [b"long", b"none"]


def test_messages_behind_the_head_expire_in_a_priority_queue_too(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-priority": 5})
    channel.basic_publish("", "q", properties(priority=5, expiration="10000"), b"high-long")
    channel.basic_publish("", "q", properties(priority=5, expiration="1000"), b"high-short")
    channel.basic_publish("", "q", properties(priority=1, expiration="2000"), b"low-short")
    clock.advance(1)
    assert ready(broker, "q") == 2
    clock.advance(1)
    assert ready(broker, "q") == 1
    assert drain(channel, "q") == [b"high-long"]


def test_a_message_expiring_while_a_consumer_has_no_room_is_never_delivered(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    channel.basic_qos(1)
    channel.basic_consume("q")
    clock.advance(0)
    send(channel, "q", b"held")
    send(channel, "q", b"waits-too-long")
    clock.advance(1)
    assert ready(broker, "q") == 0
    channel.basic_ack(peer.deliveries[0][1])
    assert peer.bodies() == [b"held"]


def test_ttl_counts_from_arrival_and_a_requeue_does_not_restart_it(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    send(channel, "q", b"m")
    clock.advance(0.5)
    tag = channel.basic_get("q")[0]
    channel.basic_nack(tag, requeue=True)
    assert ready(broker, "q") == 1
    clock.advance(0.5)
    assert ready(broker, "q") == 0


def test_a_message_requeued_after_its_ttl_passed_is_dead_lettered_at_once(broker, clock):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-message-ttl": 1000})
    send(channel, "q", b"m")
    tag = channel.basic_get("q")[0]
    clock.advance(2)  # expires while delivered and not acked: it is not the queue's to expire yet
    assert ready(broker, "dead") == 0
    channel.basic_nack(tag, requeue=True)
    clock.advance(0)
    assert ready(broker, "q") == 0, "an expired message came back and is counted as ready"
    assert ready(broker, "dead") == 1


def test_a_message_expires_in_each_queue_by_that_queues_ttl(broker, clock):
    channel, _ = open_channel(broker)
    channel.exchange_declare("fan", "fanout")
    channel.queue_declare("fast", arguments={"x-message-ttl": 1000})
    channel.queue_declare("slow", arguments={"x-message-ttl": 3000})
    channel.queue_declare("keeps")
    for name in ("fast", "slow", "keeps"):
        channel.queue_bind(name, "fan")
    send(channel, "", b"m", exchange="fan")
    clock.advance(1)
    assert [ready(broker, name) for name in ("fast", "slow", "keeps")] == [0, 1, 1]
    clock.advance(2)
    assert [ready(broker, name) for name in ("fast", "slow", "keeps")] == [0, 0, 1]


# -- TTL 0


@pytest.mark.parametrize("arguments, expiration", [({"x-message-ttl": 0}, None), ({}, "0")])
def test_ttl_zero_delivers_to_a_waiting_consumer(broker, clock, arguments, expiration):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments=arguments)
    channel.basic_consume("q")
    clock.advance(0)
    send(channel, "q", b"now-or-never", expiration=expiration)
    assert peer.bodies() == [b"now-or-never"]


@pytest.mark.parametrize("arguments, expiration", [({"x-message-ttl": 0}, None), ({}, "0")])
def test_ttl_zero_without_a_consumer_drops_the_message(broker, clock, arguments, expiration):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **arguments)
    send(channel, "q", b"now-or-never", expiration=expiration)
    assert ready(broker, "q") == 0
    assert channel.basic_get("q") is None
    _tag, _redelivered, dead, _left = channel.basic_get("dead", no_ack=True)
    assert dead.body == b"now-or-never"
    assert dead.headers["x-death"][0]["reason"] == "expired"


def test_ttl_zero_with_a_consumer_that_has_no_room_drops_the_message(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(1)
    channel.basic_consume("q")
    clock.advance(0)
    send(channel, "q", b"held")
    send(channel, "q", b"dropped", expiration="0")
    assert ready(broker, "q") == 0
    channel.basic_ack(peer.deliveries[0][1])
    assert peer.bodies()[1:] == []


# -- the expiration property


@pytest.mark.parametrize("expiration", ["abc", "-1", "1.5", "", " 10", "1e3", "\uff11"])
def test_an_invalid_expiration_is_refused(broker, expiration):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    with pytest.raises(PreconditionFailed) as raised:
        send(channel, "q", b"m", expiration=expiration)
    assert raised.value.reply_code == 406
    assert ready(broker, "q") == 0


def test_an_invalid_expiration_is_refused_even_if_the_message_is_unroutable(broker):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed):
        send(channel, "nowhere", b"m", expiration="abc")


def test_an_invalid_expiration_leaves_nothing_in_the_store(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True)
    with pytest.raises(PreconditionFailed):
        send(channel, "q", b"m", expiration="abc", persistent=True)
    assert broker.store.stats()["messages"] == 0, "the refused message was written to the store"


def test_an_invalid_expiration_does_not_stop_the_broker_from_restarting(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True)
    with pytest.raises(PreconditionFailed):
        send(channel, "q", b"m", expiration="abc", persistent=True)
    restarted, _ = make_broker(broker.store)
    restarted.recover()
    assert restarted.vhost("/").queues["q"].message_count == 0


@pytest.mark.parametrize("value", [-1, "1000", 1.5, True])
def test_an_invalid_queue_message_ttl_is_refused_naming_it(broker, value):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed) as raised:
        channel.queue_declare("q", arguments={"x-message-ttl": value})
    assert "x-message-ttl" in raised.value.text
    assert "q" not in broker.vhost("/").queues


# -- x-expires


def exists(broker, name="q"):
    return name in broker.vhost("/").queues


def test_an_unused_queue_is_deleted_after_x_expires(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    send(channel, "q", b"goes-with-it")
    clock.advance(0.999)
    assert exists(broker)
    clock.advance(0.001)
    assert not exists(broker)


def test_a_consumer_keeps_an_expiring_queue_alive(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    channel.basic_consume("q", "c")
    clock.advance(60)
    assert exists(broker)
    channel.basic_cancel("c")
    clock.advance(0.999)
    assert exists(broker)
    clock.advance(0.001)
    assert not exists(broker)


def test_the_countdown_starts_when_the_last_consumer_goes_with_its_channel(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    channel.basic_consume("q")
    clock.advance(5)
    channel.connection.close_channel(channel.id)
    clock.advance(0.999)
    assert exists(broker)
    clock.advance(0.001)
    assert not exists(broker)


def test_basic_get_resets_the_countdown(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    clock.advance(0.6)
    assert channel.basic_get("q") is None  # even a get on an empty queue uses it
    clock.advance(0.6)
    assert exists(broker)
    clock.advance(0.4)
    assert not exists(broker)


def test_redeclaring_resets_the_countdown(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    clock.advance(0.6)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    clock.advance(0.6)
    assert exists(broker)
    clock.advance(0.4)
    assert not exists(broker)


def test_an_expired_queue_can_be_declared_afresh(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    send(channel, "q", b"old")
    clock.advance(1)
    assert channel.queue_declare("q", arguments={"x-expires": 1000}) == ("q", 0, 0)
    clock.advance(1)
    assert not exists(broker)


def test_a_deleted_queue_expires_no_later_queue_of_the_same_name(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-expires": 1000})
    channel.queue_delete("q")
    channel.queue_declare("q")
    clock.advance(5)
    assert exists(broker)


@pytest.mark.parametrize("value", [0, -5, "1000", True])
def test_an_invalid_x_expires_is_refused_naming_it(broker, value):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed) as raised:
        channel.queue_declare("q", arguments={"x-expires": value})
    assert raised.value.reply_code == 406
    assert "x-expires" in raised.value.text
