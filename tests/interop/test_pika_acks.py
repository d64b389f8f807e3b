"""pika's BlockingConnection against a real broker: basic.get, ack, nack, reject
and recover, and unacknowledged messages requeued when their channel or
connection goes away."""

import pytest
from pika import spec
from pika.exceptions import ChannelClosedByBroker

from tests.support.pika_clients import (
    close_reasons,
    closed_by_broker,
    collector,
    fill,
    message_count,
    pump,
    redelivery_state,
    settle,
    take,
)

pytestmark = pytest.mark.usefixtures("watchdog")


# -- basic.get


def test_get_and_get_empty(channel, name):
    queue = name()
    channel.queue_declare(queue)
    assert channel.basic_get(queue) == (None, None, None)
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", queue, body)

    method, properties, body = channel.basic_get(queue)
    assert isinstance(method, spec.Basic.GetOk)
    assert (body, method.message_count, method.redelivered, method.exchange, method.routing_key) == (
        b"a",
        2,
        False,
        "",
        queue,
    )
    channel.basic_ack(method.delivery_tag)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count) == (b"b", 1)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count) == (b"c", 0)
    assert channel.basic_get(queue) == (None, None, None)


def test_get_from_missing_queue_is_not_found(channel, name):
    error = closed_by_broker(channel.basic_get, name("missing"))
    assert error.reply_code == 404


# -- ack, nack, reject


def test_nack_multiple_requeue_keeps_order_and_marks_redelivered(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c", b"d"])
    taken = take(channel, queue, 3)
    channel.basic_nack(taken[-1][0].delivery_tag, multiple=True, requeue=True)
    assert redelivery_state(channel, queue) == [(b"a", True), (b"b", True), (b"c", True), (b"d", False)]


def test_nack_everything_outstanding_with_tag_zero(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    take(channel, queue, 3)
    channel.basic_nack(0, multiple=True, requeue=True)
    assert redelivery_state(channel, queue) == [(b"a", True), (b"b", True), (b"c", True)]


def test_reject_requeue_redelivers_to_the_consumer(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b"])
    channel.basic_qos(prefetch_count=1)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: received, "a delivery")
    channel.basic_reject(received[0][0].delivery_tag, requeue=True)
    pump(connection, lambda: len(received) >= 2, "the redelivery")
    channel.basic_ack(received[1][0].delivery_tag)
    pump(connection, lambda: len(received) >= 3, "the next message")
    assert [(body, method.redelivered) for method, _, body in received] == [
        (b"a", False),
        (b"a", True),
        (b"b", False),
    ]


def test_nack_without_requeue_drops(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    taken = take(channel, queue, 2)
    channel.basic_nack(taken[1][0].delivery_tag, multiple=True, requeue=False)
    assert redelivery_state(channel, queue) == [(b"c", False)]


def test_nack_single_requeue(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    taken = take(channel, queue, 2)
    channel.basic_nack(taken[1][0].delivery_tag, multiple=False, requeue=True)
    channel.basic_ack(taken[0][0].delivery_tag)
    assert redelivery_state(channel, queue) == [(b"b", True), (b"c", False)]


def test_reject_requeue_and_drop(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    (first, _), (second, _) = take(channel, queue, 2)
    channel.basic_reject(first.delivery_tag, requeue=False)
    channel.basic_reject(second.delivery_tag, requeue=True)
    assert redelivery_state(channel, queue) == [(b"b", True), (b"c", False)]


def test_ack_multiple(connection, name):
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"a", b"b", b"c"])
    taken = take(channel, queue, 3)
    channel.basic_ack(taken[1][0].delivery_tag, multiple=True)
    channel.close()  # the un-acked third goes back
    assert redelivery_state(connection.channel(), queue) == [(b"c", True)]


def test_ack_of_unknown_delivery_tag_closes_the_channel(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a"])
    take(channel, queue, 1)
    reasons = close_reasons(channel)
    channel.basic_ack(99)  # basic.ack has no reply: the channel.close comes when it comes
    pump(connection, lambda: reasons, "the channel to close")
    [reason] = reasons
    assert isinstance(reason, ChannelClosedByBroker)
    assert reason.reply_code == 406
    assert reason.reply_text.startswith("PRECONDITION_FAILED")
    assert redelivery_state(connection.channel(), queue) == [(b"a", True)]


# -- recover


def test_recover_requeue_redelivers(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 3, "three deliveries")
    assert [method.redelivered for method, _, _ in received] == [False, False, False]

    channel.basic_recover(requeue=True)
    pump(connection, lambda: len(received) >= 6, "three redeliveries")
    settle(connection)
    again = received[3:]
    assert [(body, method.redelivered) for method, _, body in again] == [(b"a", True), (b"b", True), (b"c", True)]
    assert len({method.delivery_tag for method, _, _ in received}) == 6  # new tags for the redeliveries
    channel.basic_ack(again[-1][0].delivery_tag, multiple=True)
    settle(connection)
    assert message_count(connection.channel(), queue) == 0


def test_recover_without_requeue_redelivers_to_the_same_consumer(connection, name):
    """basic_recover() without arguments is requeue=False in pika."""
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"a", b"b"])
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")

    channel.basic_recover()
    pump(connection, lambda: len(received) >= 4, "two redeliveries")
    settle(connection)
    assert [(method.consumer_tag, body, method.redelivered) for method, _, body in received[2:]] == [
        (tag, b"a", True),
        (tag, b"b", True),
    ]
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    channel.close()
    assert message_count(connection.channel(), queue) == 0


def test_recover_respects_the_prefetch_window(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c", b"d"])
    channel.basic_qos(prefetch_count=2)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")

    channel.basic_recover(requeue=True)
    pump(connection, lambda: len(received) >= 4, "two redeliveries")
    settle(connection)
    assert [(body, method.redelivered) for method, _, body in received] == [
        (b"a", False),
        (b"b", False),
        (b"a", True),
        (b"b", True),
    ]
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    pump(connection, lambda: len(received) >= 6, "the rest")
    settle(connection)
    assert [body for _, _, body in received[4:]] == [b"c", b"d"]


# -- many messages


def test_many_messages_consumed_in_order_with_multiple_acks(connection, channel, name):
    queue = name()
    count = 2000
    fill(channel, queue, [b"%d" % number for number in range(count)])
    channel.basic_qos(prefetch_count=50)
    bodies = []

    def on_message(ch, method, properties, body):
        bodies.append(body)
        if len(bodies) % 25 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)

    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(bodies) >= count, f"{count} deliveries", timeout=20)
    assert bodies == [b"%d" % number for number in range(count)]
    assert message_count(connection.channel(), queue) == 0


# -- requeue when a client goes away


def test_unacked_messages_requeued_in_order_when_a_consumer_disconnects(connect, name):
    queue = name()
    first = connect()
    channel = first.channel()
    fill(channel, queue, [b"m%d" % number for number in range(5)])
    channel.basic_qos(prefetch_count=3)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(first, lambda: len(received) >= 3, "three deliveries")
    settle(first)
    assert [body for _, _, body in received] == [b"m0", b"m1", b"m2"]
    first.close()

    second = connect().channel()
    assert redelivery_state(second, queue) == [
        (b"m0", True),
        (b"m1", True),
        (b"m2", True),
        (b"m3", False),
        (b"m4", False),
    ]


def test_unacked_messages_requeued_when_a_channel_closes(connection, name):
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"x", b"y"])
    take(channel, queue, 2)
    channel.close()
    assert redelivery_state(connection.channel(), queue) == [(b"x", True), (b"y", True)]
