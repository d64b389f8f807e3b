"""Delayed delivery on the broker's fake clock: the x-delayed-message exchange
type, the x-delay header, and the scheduler's due-time windows over the store."""

import pytest

from brokerd.errors import CommandInvalid, PreconditionFailed
from brokerd.model import delayeddelivery
from brokerd.proto.tables import dict_to_table
from tests.support.broker import open_channel, properties, ready


def delayed_exchange(channel, name="later", delayed_type="direct", durable=False):
    channel.exchange_declare(name, "x-delayed-message", durable=durable, arguments={"x-delayed-type": delayed_type})
    channel.queue_declare("due", durable=durable)
    channel.queue_bind("due", name, "k")


def with_delay(delay, persistent=False):
    """Properties with an x-delay header (any value, for the odd ones), or none if C{delay} is None."""
    props = properties(persistent)
    if delay is not None:
        dict_to_table({"x-delay": delay}, props.headers)
    return props


def send(channel, body, delay=None, exchange="later", routing_key="k", persistent=False):
    channel.basic_publish(exchange, routing_key, with_delay(delay, persistent), body)


def drain(channel, queue="due"):
    bodies = []
    while (result := channel.basic_get(queue, no_ack=True)) is not None:
        bodies.append(result[2].body)
    return bodies


def test_a_delayed_message_is_routed_once_due_and_not_before(broker, clock):
    channel, _ = open_channel(broker)
    delayed_exchange(channel)
    send(channel, b"m", delay=1500)
    clock.advance(1.4)
    assert ready(broker, "due") == 0
    clock.advance(0.1)
    clock.advance(delayeddelivery.TICK_SECONDS)
    assert drain(channel) == [b"m"]


def test_due_messages_go_out_in_due_order_and_in_publish_order_when_due_together(broker, clock):
    channel, _ = open_channel(broker)
    delayed_exchange(channel)
    for body, delay in ((b"c", 3000), (b"a", 1000), (b"b1", 2000), (b"b2", 2000), (b"b3", 2000)):
        send(channel, body, delay)
    clock.pump([0.5] * 8)
    assert drain(channel) == [b"a", b"b1", b"b2", b"b3", b"c"]


def test_without_x_delay_a_message_is_routed_at_once_as_the_delayed_type(broker, clock):
    channel, _ = open_channel(broker)
    delayed_exchange(channel, delayed_type="topic")
    channel.queue_bind("due", "later", "a.*")
    for delay in (None, 0, -5, "soon"):
        channel.basic_publish("later", "a.b", with_delay(delay), b"now")
    assert drain(channel) == [b"now"] * 4


def test_a_delayed_exchange_needs_a_known_delayed_type(broker):
    channel, _ = open_channel(broker)
    for arguments in ({}, {"x-delayed-type": "x-delayed-message"}, {"x-delayed-type": "nonsense"},
                      {"x-delayed-type": 5}):
        with pytest.raises(PreconditionFailed, match="x-delayed-type"):
            channel.exchange_declare(f"later-{len(arguments)}", "x-delayed-message", arguments=arguments)
    with pytest.raises(CommandInvalid, match="^503 COMMAND_INVALID - unknown exchange type 'x-nonsense'$"):
        channel.exchange_declare("odd", "x-nonsense")  # RabbitMQ's text


def test_a_mandatory_delayed_publish_is_not_returned_and_a_confirm_follows_the_store(broker, clock):
    channel, peer = open_channel(broker)
    delayed_exchange(channel)
    channel.confirm_select()
    channel.basic_publish("later", "nobody-binds-this", with_delay(100), b"m", mandatory=True)
    clock.advance(0)
    clock.advance(0)
    assert peer.returns == []
    assert peer.confirms and peer.confirms[-1][2] is True


def test_a_message_whose_exchange_is_deleted_before_it_is_due_is_dropped(broker, clock):
    channel, _ = open_channel(broker)
    delayed_exchange(channel)
    send(channel, b"m", delay=500)
    channel.exchange_delete("later")
    clock.pump([0.1] * 10)
    assert ready(broker, "due") == 0
    assert broker.store.stats()["delayed"] == 0


def test_more_delayed_messages_than_a_window_all_fire_in_order(broker, clock):
    channel, _ = open_channel(broker)
    delayed_exchange(channel)
    count = delayeddelivery.WINDOW_MESSAGES * 2 + 500
    for number in range(count):
        send(channel, b"%05d" % number, delay=1000 + number)  # all due within a few seconds, in order
    clock.pump([0.05] * 100)
    assert drain(channel) == [b"%05d" % number for number in range(count)]
    assert broker.store.stats()["delayed"] == 0


def test_a_delay_published_after_a_window_was_loaded_fires_on_time(broker, clock):
    channel, _ = open_channel(broker)
    delayed_exchange(channel)
    send(channel, b"late", delay=30_000)
    clock.advance(0.5)  # the first window is loaded by now
    send(channel, b"early", delay=200)
    clock.pump([0.05] * 5)
    assert drain(channel) == [b"early"]
    clock.pump([1] * 30)
    assert drain(channel) == [b"late"]


def test_delays_beyond_the_first_window_are_loaded_when_their_time_nears(broker, clock):
    channel, _ = open_channel(broker)
    delayed_exchange(channel)
    far = delayeddelivery.WINDOW_MILLISECONDS * 3
    send(channel, b"far", delay=far)
    send(channel, b"near", delay=100)
    clock.pump([0.5] * 2)
    assert drain(channel) == [b"near"]
    clock.pump([1.0] * (far // 1000 - 2))
    assert drain(channel) == []
    clock.pump([0.5] * 4)
    assert drain(channel) == [b"far"]
