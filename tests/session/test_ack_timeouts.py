"""The timer of delivery acknowledgement timeouts, on a broker driven by a fake clock: when a
channel holding an un-acked delivery is closed, relative to when the delivery was made."""

import pytest

from brokerd.errors import PreconditionFailed
from brokerd.process.resource_options import parse_consumer_timeout
from brokerd.session.ack_timeouts import AckTimeouts
from brokerd.session.deliveries import MAX_TAG_MARKS
from tests.support.broker import make_broker, open_channel, properties


@pytest.fixture
def broker():
    broker, clock = make_broker()
    timeouts = AckTimeouts(broker, 1000)
    timeouts.start()
    yield broker, clock
    timeouts.stop()


def consuming_channel(broker, queue, arguments=None):
    """A channel consuming C{queue} (declared with C{arguments}), and the errors it is closed with."""
    channel, _ = open_channel(broker)
    closed = []
    channel.connection.channel_closer = lambda channel_id, error: closed.append((channel_id, error))
    channel.queue_declare(queue, arguments=arguments)
    channel.basic_consume(queue)
    return channel, closed


def run_for(clock, seconds, step=0.01):
    """Advance C{clock} by C{seconds} a step at a time, so that the checks it reschedules run."""
    for _ in range(round(seconds / step)):
        clock.advance(step)


def test_a_delivery_times_out_within_one_and_a_half_timeouts_of_being_made(broker):
    broker, clock = broker
    clock.advance(0.1)  # the delivery falls between two checks
    channel, closed = consuming_channel(broker, "q")
    channel.basic_publish("", "q", properties(), b"held")
    clock.advance(0)
    assert channel.peer.deliveries
    while not closed:
        clock.advance(0.05)
    assert 1.0 <= clock.seconds() - 0.1 <= 1.5
    [(channel_id, error)] = closed
    assert isinstance(error, PreconditionFailed) and channel_id == 1
    assert "Timeout value used: 1000 ms" in error.reply_text
    assert channel.closed  # and its delivery requeued
    assert broker.vhost("/").queues["q"].message_count == 1


def test_a_delivery_acked_in_time_leaves_the_channel_open(broker):
    broker, clock = broker
    channel, closed = consuming_channel(broker, "q")
    for number in range(5):  # one every 0.9 s: the channel always holds one, never for 1 s
        channel.basic_publish("", "q", properties(), b"m%d" % number)
        clock.advance(0)
        run_for(clock, 0.9)
        channel.basic_ack(channel.peer.deliveries[-1][1], False)
    run_for(clock, 3)
    assert not closed


def test_a_queue_timeout_counts_for_its_own_deliveries(broker):
    broker, clock = broker
    channel, closed = consuming_channel(broker, "long", {"x-consumer-timeout": 60000})
    channel.queue_declare("short", arguments={"x-consumer-timeout": 200})
    channel.basic_consume("short")
    channel.basic_publish("", "long", properties(), b"may wait a minute")
    clock.advance(0)
    run_for(clock, 5)
    assert not closed  # the broker's one second does not count for that queue
    channel.basic_publish("", "short", properties(), b"may wait 0.2 s")
    clock.advance(0)
    run_for(clock, 0.35)
    [(_, error)] = closed
    assert "Timeout value used: 200 ms" in error.reply_text


def test_a_channel_keeps_a_bounded_number_of_marks(broker):
    """Deliveries kept for an hour under a queue's long timeout, checked every 50 ms for another
    queue's short one: a channel keeps no more marks than its bound."""
    broker, clock = broker
    channel, closed = consuming_channel(broker, "long", {"x-consumer-timeout": 3600000})
    channel.queue_declare("short", arguments={"x-consumer-timeout": 200})
    for number in range(100):
        channel.basic_publish("", "long", properties(), b"%d" % number)
        clock.advance(0)
        run_for(clock, 0.05)
    assert len(channel.deliveries._tag_marks) <= MAX_TAG_MARKS
    assert not closed


@pytest.mark.parametrize("text", ["0", "none", "off"])
def test_no_broker_timeout_leaves_deliveries_held_unless_their_queue_has_one(text):
    broker, clock = make_broker()
    timeouts = AckTimeouts(broker, parse_consumer_timeout(text))
    timeouts.start()
    channel, closed = consuming_channel(broker, "q")
    channel.basic_publish("", "q", properties(), b"held for ever")
    clock.advance(0)
    run_for(clock, 180, step=1)
    assert not closed
    timeouts.stop()
