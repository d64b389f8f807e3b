"""Priority queues (x-max-priority): highest priority first, FIFO within a priority, as RabbitMQ orders them."""

import pytest

from brokerd.errors import PreconditionFailed
from tests.support.broker import open_channel, properties, ready


def declare_priority_queue(channel, name="q", max_priority=5, **arguments):
    channel.queue_declare(name, arguments={"x-max-priority": max_priority, **arguments})


def send(channel, queue, *messages):
    """Publish (body, priority) pairs through the default exchange; a priority of None leaves it unset."""
    for body, priority in messages:
        props = properties() if priority is None else properties(priority=priority)
        channel.basic_publish("", queue, props, body)


def drain(channel, queue, no_ack=True):
    """basic.get until empty; returns the bodies in the order they came."""
    bodies = []
    while (result := channel.basic_get(queue, no_ack=no_ack)) is not None:
        bodies.append(result[2].body)
    return bodies


def get_all(channel, queue):
    """basic.get until empty, leaving each un-acked; returns (tag, body, redelivered) triples."""
    got = []
    while (result := channel.basic_get(queue)) is not None:
        tag, redelivered, message, _left = result
        got.append((tag, message.body, redelivered))
    return got


# -- ordering


def test_higher_priority_is_delivered_first_and_fifo_within_a_priority(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel, max_priority=10)
    send(channel, "q", (b"low-1", 1), (b"high-1", 9), (b"mid-1", 5), (b"high-2", 9), (b"low-2", 1), (b"mid-2", 5))
    assert ready(broker, "q") == 6
    assert drain(channel, "q") == [b"high-1", b"high-2", b"mid-1", b"mid-2", b"low-1", b"low-2"]


def test_a_message_without_priority_counts_as_priority_zero(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel)
    send(channel, "q", (b"none-1", None), (b"zero", 0), (b"one", 1), (b"none-2", None))
    assert drain(channel, "q") == [b"one", b"none-1", b"zero", b"none-2"]


def test_priorities_above_the_maximum_count_as_the_maximum(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel, max_priority=3)
    # 3, 200 and 7 are all level 3, so they keep their arrival order; 2 comes after them.
    send(channel, "q", (b"two", 2), (b"three", 3), (b"two-hundred", 200), (b"seven", 7))
    assert drain(channel, "q") == [b"three", b"two-hundred", b"seven", b"two"]


def test_the_delivered_message_keeps_its_own_priority_property(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel, max_priority=3)
    send(channel, "q", (b"capped", 200))
    _tag, _redelivered, message, _left = channel.basic_get("q", no_ack=True)
    assert message.properties.priority == 200


def test_max_priority_one_makes_two_levels(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel, max_priority=1)
    send(channel, "q", (b"a", 0), (b"b", 4), (b"c", None), (b"d", 1))
    assert drain(channel, "q") == [b"b", b"d", b"a", b"c"]


def test_max_priority_255_orders_every_level(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel, max_priority=255)
    send(channel, "q", (b"0", 0), (b"255", 255), (b"128", 128), (b"254", 254), (b"1", 1))
    assert drain(channel, "q") == [b"255", b"254", b"128", b"1", b"0"]


def test_a_queue_without_max_priority_ignores_priorities(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    send(channel, "q", (b"a", 0), (b"b", 9), (b"c", None), (b"d", 5))
    assert drain(channel, "q") == [b"a", b"b", b"c", b"d"]


def test_get_reports_the_messages_left(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel)
    send(channel, "q", (b"a", 1), (b"b", 5), (b"c", None))
    _tag, _redelivered, message, left = channel.basic_get("q")
    assert (message.body, left) == (b"b", 2)
    assert channel.queue_declare("q", passive=True) == ("q", 2, 0)


def test_a_consumer_gets_the_backlog_in_priority_order(broker, clock):
    channel, peer = open_channel(broker)
    declare_priority_queue(channel)
    send(channel, "q", (b"low", 1), (b"high", 5), (b"mid", 3), (b"none", None))
    channel.basic_consume("q")
    clock.advance(0)
    assert peer.bodies() == [b"high", b"mid", b"low", b"none"]


def test_a_consumer_with_no_room_gets_what_arrived_meanwhile_by_priority(broker, clock):
    channel, peer = open_channel(broker)
    declare_priority_queue(channel)
    channel.basic_qos(1)
    channel.basic_consume("q")
    clock.advance(0)
    send(channel, "q", (b"first", 0))
    assert peer.bodies() == [b"first"]
    send(channel, "q", (b"low", 1), (b"none", None), (b"high", 5), (b"mid", 3))
    for expected in (b"high", b"mid", b"low", b"none"):
        channel.basic_ack(peer.deliveries[-1][1])
        assert peer.bodies()[-1] == expected
    assert ready(broker, "q") == 0


def test_a_full_priority_queue_drops_its_head_the_highest_priority(broker):
    # As RabbitMQ: drop-head takes the message that would be delivered next.
    channel, _ = open_channel(broker)
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx")
    declare_priority_queue(channel, **{"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    send(channel, "q", (b"low", 1), (b"high", 5), (b"mid", 3))
    assert drain(channel, "dead") == [b"high"]
    assert drain(channel, "q") == [b"mid", b"low"]


# -- requeueing


def test_requeued_messages_go_back_to_their_priority_in_arrival_order(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel)
    send(channel, "q", (b"h1", 5), (b"l1", 1), (b"h2", 5), (b"l2", 1), (b"h3", 5))
    got = get_all(channel, "q")
    assert [body for _, body, _ in got] == [b"h1", b"h2", b"h3", b"l1", b"l2"]
    for tag, _body, _redelivered in reversed(got):  # returned in the opposite order
        channel.basic_nack(tag, requeue=True)
    assert [(body, redelivered) for _, body, redelivered in get_all(channel, "q")] == [
        (b"h1", True), (b"h2", True), (b"h3", True), (b"l1", True), (b"l2", True),
    ]


def test_a_requeued_message_goes_back_ahead_of_later_arrivals_of_its_priority(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel)
    send(channel, "q", (b"a", 2), (b"b", 2))
    tag, _, message, _ = channel.basic_get("q")
    assert message.body == b"a"
    send(channel, "q", (b"c", 2), (b"top", 4), (b"low", 1))
    channel.basic_reject(tag, requeue=True)
    assert [(body, redelivered) for _, body, redelivered in get_all(channel, "q")] == [
        (b"top", False), (b"a", True), (b"b", False), (b"c", False), (b"low", False),
    ]


def test_a_requeued_message_keeps_a_capped_priority_level(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel, max_priority=2)
    send(channel, "q", (b"capped", 99), (b"mid", 1))
    tag, _, message, _ = channel.basic_get("q")
    assert message.body == b"capped"
    send(channel, "q", (b"max", 2))
    channel.basic_nack(tag, requeue=True)
    assert drain(channel, "q") == [b"capped", b"max", b"mid"]


def test_closing_the_channel_requeues_by_priority(broker, clock):
    consuming, _ = open_channel(broker)
    declare_priority_queue(consuming)
    send(consuming, "q", (b"l", 1), (b"h", 5), (b"n", None), (b"m", 3))
    consuming.basic_consume("q")
    clock.advance(0)
    assert consuming.unacked_count == 4
    consuming.connection.close_channel(consuming.id)
    assert ready(broker, "q") == 4
    other, _ = open_channel(broker)
    assert drain(other, "q") == [b"h", b"m", b"l", b"n"]


# -- arguments


@pytest.mark.parametrize("value", [256, -1, 1000, "5", b"5", True, False, 2.0, [5]])
def test_invalid_max_priority_is_refused_with_406_naming_the_argument(broker, value):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed) as raised:
        channel.queue_declare("q", arguments={"x-max-priority": value})
    assert raised.value.reply_code == 406
    assert "x-max-priority" in raised.value.text
    assert "q" not in broker.vhost("/").queues


@pytest.mark.parametrize("value", [1, 10, 255])
def test_max_priority_from_1_to_255_is_accepted(broker, value):
    channel, _ = open_channel(broker)
    assert channel.queue_declare("q", arguments={"x-max-priority": value}) == ("q", 0, 0)


def test_redeclaring_with_another_max_priority_is_refused(broker):
    channel, _ = open_channel(broker)
    declare_priority_queue(channel, max_priority=5)
    with pytest.raises(PreconditionFailed) as raised:
        declare_priority_queue(channel, max_priority=6)
    assert "x-max-priority" in raised.value.text
    declare_priority_queue(channel, max_priority=5)  # the same arguments: fine
