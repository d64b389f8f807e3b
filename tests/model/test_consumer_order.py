"""Which consumer gets the next message: consumer priorities (x-priority) and
single active consumer (x-single-active-consumer), as consumers come and go."""

import pytest

from brokerd.errors import MethodNotImplemented, PreconditionFailed
from tests.support.broker import open_channel, publish, ready

SAC = {"x-single-active-consumer": True}


def consumer_on_own_channel(broker, queue, tag, prefetch=0, no_ack=False, **arguments):
    """A consumer C{tag} of C{queue} on a channel of its own; returns (channel, peer)."""
    channel, peer = open_channel(broker)
    if prefetch:
        channel.basic_qos(prefetch)
    channel.basic_consume(queue, tag, no_ack=no_ack, arguments=arguments or None)
    return channel, peer


def delivered(*peers):
    return [peer.bodies() for peer in peers]


def test_a_lower_priority_takes_over_when_the_higher_ones_go(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    high_channel, high = consumer_on_own_channel(broker, "q", "high", **{"x-priority": 5})
    _, low = consumer_on_own_channel(broker, "q", "low", **{"x-priority": -5})
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    high_channel.basic_cancel("high")
    publish(channel, "q", b"3")
    assert delivered(high, low) == [[b"1", b"2"], [b"3"]]


def test_priorities_larger_than_32_bits_order_consumers(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    _, low = consumer_on_own_channel(broker, "q", "low", **{"x-priority": 2**40})
    _, high = consumer_on_own_channel(broker, "q", "high", **{"x-priority": 2**41})
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    assert delivered(high, low) == [[b"1", b"2"], []]


def test_single_active_consumer_that_goes_holding_nothing_hands_over_at_once(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments=SAC)
    first_channel, first = consumer_on_own_channel(broker, "q", "first", no_ack=True)
    first_channel.flow(False)  # it takes nothing for now
    _, second = consumer_on_own_channel(broker, "q", "second", no_ack=True)
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    assert delivered(first, second) == [[], []]
    first_channel.basic_cancel("first")
    clock.advance(0)
    assert delivered(first, second) == [[], [b"1", b"2"]]


def test_single_active_consumer_that_comes_back_queues_up_behind_the_others(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments=SAC)
    a_channel, a = consumer_on_own_channel(broker, "q", "a", no_ack=True)
    b_channel, b = consumer_on_own_channel(broker, "q", "b", no_ack=True)
    _, c = consumer_on_own_channel(broker, "q", "c", no_ack=True)
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    a_channel.basic_cancel("a")
    a_channel.basic_consume("q", "a", no_ack=True)
    clock.advance(0)
    publish(channel, "q", b"3", b"4")
    b_channel.close()
    clock.advance(0)
    publish(channel, "q", b"5", b"6")
    assert delivered(a, b, c) == [[b"1", b"2"], [b"3", b"4"], [b"5", b"6"]]


def test_single_active_consumer_queue_deleted_cancels_every_consumer(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments=SAC)
    _, first = consumer_on_own_channel(broker, "q", "first")
    _, second = consumer_on_own_channel(broker, "q", "second")
    clock.advance(0)
    channel.queue_delete("q")
    clock.advance(0)
    assert (first.cancelled, second.cancelled) == (["first"], ["second"])


def test_basic_get_takes_from_a_single_active_consumer_queue(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments=SAC)
    _, first = consumer_on_own_channel(broker, "q", "first", prefetch=1)
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    assert channel.basic_get("q")[2].body == b"2"
    assert (delivered(first), ready(broker, "q")) == ([[b"1"]], 0)


def test_quorum_queue_refuses_a_consumer_under_a_global_prefetch_limit(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    channel.basic_qos(10, global_=True)
    with pytest.raises(MethodNotImplemented, match="does not support global qos"):
        channel.basic_consume("q", "c")


def test_consumer_priority_is_checked_before_the_consumer_is_registered(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    with pytest.raises(PreconditionFailed, match="expected integer, got double"):
        channel.basic_consume("q", "c", arguments={"x-priority": 1.5})
    assert broker.vhost("/").queues["q"].consumer_count == 0


@pytest.mark.parametrize("settle", ["reject", "ack under a global limit"])
def test_single_active_consumer_cancelled_holding_a_delivery_hands_over_once_it_is_settled(broker, clock, settle):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments=SAC)
    first_channel, first = open_channel(broker)
    first_channel.basic_qos(1, global_=settle != "reject")
    first_channel.basic_consume("q", "first")
    _, second = consumer_on_own_channel(broker, "q", "second")
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    first_channel.basic_cancel("first")
    clock.advance(0)
    assert delivered(first, second) == [[b"1"], []]  # it still holds one: the queue waits for it
    if settle == "reject":
        first_channel.basic_reject(1, requeue=False)
    else:
        first_channel.basic_ack(1)
    assert delivered(first, second) == [[b"1"], [b"2"]]
