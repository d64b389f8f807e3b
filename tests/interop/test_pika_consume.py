"""pika's BlockingConnection against a real broker: basic.qos prefetch windows,
consumers and their tags, exclusive and no-ack consumers, cancelling (by the
client or by the broker) and channel.flow."""

import time

import pika
import pytest
from pika import spec
from pika.exceptions import ConnectionClosedByBroker

from tests.support.pika_clients import (
    closed_by_broker,
    collector,
    consumer_count,
    fill,
    message_count,
    pump,
    redelivery_state,
    settle,
)

pytestmark = pytest.mark.usefixtures("watchdog")


# -- basic.qos


def test_prefetch_count_limits_unacked_deliveries(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    for number in range(10):
        channel.basic_publish("", queue, b"%d" % number)
    channel.basic_qos(prefetch_count=3)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)

    pump(connection, lambda: len(received) >= 3, "three deliveries")
    settle(connection)
    assert [body for _, _, body in received] == [b"0", b"1", b"2"]

    channel.basic_ack(received[0][0].delivery_tag)
    pump(connection, lambda: len(received) >= 4, "a fourth delivery after an ack")
    settle(connection)
    assert len(received) == 4

    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    pump(connection, lambda: len(received) >= 7, "three more after a multiple ack")
    settle(connection)
    assert [body for _, _, body in received] == [b"%d" % number for number in range(7)]
    other = connection.channel()
    assert message_count(other, queue) == 3


def test_prefetch_count_is_per_consumer_without_global(connection, channel, name):
    queues = [name(), name()]
    for queue in queues:
        channel.queue_declare(queue)
        for number in range(5):
            channel.basic_publish("", queue, b"%d" % number)
    channel.basic_qos(prefetch_count=2)
    received, on_message = collector()
    for queue in queues:
        channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 4, "two deliveries per consumer")
    settle(connection)
    assert len(received) == 4


def test_global_prefetch_count_is_shared_by_the_channel(connection, channel, name):
    queues = [name(), name()]
    for queue in queues:
        channel.queue_declare(queue)
        for number in range(5):
            channel.basic_publish("", queue, b"%d" % number)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    received, on_message = collector()
    for queue in queues:
        channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 3, "three deliveries")
    settle(connection)
    assert len(received) == 3

    channel.basic_ack(0, multiple=True)
    pump(connection, lambda: len(received) >= 6, "three more deliveries")
    settle(connection)
    assert len(received) == 6


def test_prefetch_size_is_refused(connection, channel):
    """RabbitMQ answers 540 NOT_IMPLEMENTED to a non-zero prefetch_size; so does brokerd."""
    with pytest.raises(ConnectionClosedByBroker) as raised:
        channel.basic_qos(prefetch_size=4096)
    assert raised.value.reply_code == 540
    assert connection.is_closed


# -- consumers


def test_consume_with_explicit_tag(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message, consumer_tag="my-own-tag")
    assert tag == "my-own-tag"
    channel.basic_publish("", queue, b"tagged")
    pump(connection, lambda: received, "a delivery")
    method, _, body = received[0]
    assert (method.consumer_tag, method.exchange, method.routing_key, method.redelivered, body) == (
        "my-own-tag",
        "",
        queue,
        False,
        b"tagged",
    )
    assert method.delivery_tag == 1  # the first delivery on a fresh channel


def test_consume_with_server_named_tag(connection, channel, name):
    """pika always makes up a tag itself, so basic.consume with an empty tag is sent by hand."""
    queue = name()
    channel.queue_declare(queue)
    replies = []
    channel._impl._rpc(
        spec.Basic.Consume(queue=queue, consumer_tag=""), replies.append, [spec.Basic.ConsumeOk]
    )
    pump(connection, lambda: replies, "basic.consume-ok")
    tag = replies[0].method.consumer_tag
    assert tag.startswith("amq.ctag-")
    assert consumer_count(channel, queue) == 1

    channel._impl._rpc(spec.Basic.Cancel(consumer_tag=tag), replies.append, [spec.Basic.CancelOk])
    pump(connection, lambda: len(replies) == 2, "basic.cancel-ok")
    assert replies[1].method.consumer_tag == tag
    assert consumer_count(channel, queue) == 0


def test_reused_consumer_tag_closes_the_connection(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_consume(queue, lambda *args: None, consumer_tag="twice")
    replies = []
    channel._impl._rpc(spec.Basic.Consume(queue=queue, consumer_tag="twice"), replies.append, [spec.Basic.ConsumeOk])
    with pytest.raises(ConnectionClosedByBroker) as raised:
        pump(connection, lambda: replies, "the broker's answer")
    assert raised.value.reply_code == 530
    assert "twice" in raised.value.reply_text


def test_exclusive_consumer(connect, name):
    first, second = connect(), connect()
    queue = name()
    owner = first.channel()
    owner.queue_declare(queue)
    tag = owner.basic_consume(queue, lambda *args: None, exclusive=True)

    error = closed_by_broker(second.channel().basic_consume, queue, lambda *args: None)
    assert error.reply_code == 403
    assert error.reply_text.startswith("ACCESS_REFUSED")
    error = closed_by_broker(first.channel().basic_consume, queue, lambda *args: None)
    assert error.reply_code == 403

    owner.basic_cancel(tag)
    received, on_message = collector()
    second.channel().basic_consume(queue, on_message)
    owner.basic_publish("", queue, b"after the exclusive consumer left")
    pump(second, lambda: received, "a delivery to the new consumer")
    assert received[0][2] == b"after the exclusive consumer left"


def test_exclusive_consume_refused_while_others_consume(connection, name):
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.basic_consume(queue, lambda *args: None)
    error = closed_by_broker(connection.channel().basic_consume, queue, lambda *args: None, exclusive=True)
    assert error.reply_code == 403


def test_no_ack_consumer(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    for number in range(3):
        channel.basic_publish("", queue, b"%d" % number)
    consuming = connection.channel()
    consuming.basic_qos(prefetch_count=1)  # no effect on a no-ack consumer
    received, on_message = collector()
    consuming.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: len(received) >= 3, "three deliveries")
    assert [body for _, _, body in received] == [b"0", b"1", b"2"]
    consuming.close()  # nothing is requeued: there was nothing to ack
    assert message_count(channel, queue) == 0


# -- cancelling


def test_cancel_stops_deliveries(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message, auto_ack=True)
    channel.basic_publish("", queue, b"before cancel")
    pump(connection, lambda: received, "a delivery")

    channel.basic_cancel(tag)
    assert channel.consumer_tags == []
    channel.basic_publish("", queue, b"after cancel 1")
    channel.basic_publish("", queue, b"after cancel 2")
    settle(connection)
    assert len(received) == 1
    assert message_count(channel, queue) == 2
    assert consumer_count(channel, queue) == 0


def test_broker_cancels_consumer_when_its_queue_is_deleted(connect, name):
    consuming_connection, deleting_connection = connect(), connect()
    queue = name()
    channel = consuming_connection.channel()
    channel.queue_declare(queue)
    cancelled = []
    channel.add_on_cancel_callback(cancelled.append)
    tag = channel.basic_consume(queue, lambda *args: None, consumer_tag="doomed")
    assert tag == "doomed"

    deleting_connection.channel().queue_delete(queue)
    pump(consuming_connection, lambda: cancelled, "the broker's basic.cancel")
    assert isinstance(cancelled[0].method, spec.Basic.Cancel)
    assert cancelled[0].method.consumer_tag == "doomed"
    assert channel.consumer_tags == []
    assert channel.is_open
    channel.queue_declare(name())  # the channel still works


def test_broker_cancels_consumer_when_another_channel_deletes_the_queue(connection, name):
    queue = name()
    consuming, deleting = connection.channel(), connection.channel()
    consuming.queue_declare(queue)
    cancelled = []
    consuming.add_on_cancel_callback(cancelled.append)
    received, on_message = collector()
    consuming.basic_consume(queue, on_message, consumer_tag="same-connection")
    deleting.basic_publish("", queue, b"before the delete")
    pump(connection, lambda: received, "a delivery")

    assert deleting.queue_delete(queue).method.message_count == 0  # the delivered message is not ready
    pump(connection, lambda: cancelled, "the broker's basic.cancel")
    assert cancelled[0].method.consumer_tag == "same-connection"
    assert consuming.consumer_tags == []
    consuming.basic_ack(received[0][0].delivery_tag)  # acking after the queue went is harmless
    consuming.queue_declare(name())
    assert consuming.is_open and deleting.is_open


def test_cancel_keeps_unacked_deliveries_ackable(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c", b"d"])
    channel.basic_qos(prefetch_count=2)
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")
    channel.basic_cancel(tag)

    channel.basic_ack(received[0][0].delivery_tag)
    channel.basic_nack(received[1][0].delivery_tag, requeue=True)
    settle(connection)
    assert channel.is_open
    assert len(received) == 2
    assert redelivery_state(channel, queue) == [(b"b", True), (b"c", False), (b"d", False)]


def test_consume_generator_cancel_requeues_what_it_held(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"%d" % number for number in range(5)])
    channel.basic_qos(prefetch_count=5)
    events = channel.consume(queue, inactivity_timeout=2)
    method, _, body = next(events)
    assert body == b"0"
    channel.basic_ack(method.delivery_tag)
    channel.cancel()  # pika rejects (requeue) what it was still holding
    assert redelivery_state(channel, queue) == [(b"%d" % number, True) for number in range(1, 5)]


def test_consume_generator_ends_on_broker_cancel(connect, name):
    consuming_connection, deleting_connection = connect(), connect()
    queue = name()
    channel = consuming_connection.channel()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"only one")
    events = channel.consume(queue, auto_ack=True, inactivity_timeout=0.1)
    first = next(event for event in events if event != (None, None, None))
    assert first[2] == b"only one"

    deleting_connection.channel().queue_delete(queue)
    deadline = time.monotonic() + 5
    rest = []
    for event in events:  # pika ends the generator when the broker cancels its consumer
        rest.append(event)
        assert time.monotonic() < deadline, "the consume() generator did not end after the broker's basic.cancel"
    assert all(event == (None, None, None) for event in rest)


# -- channel.flow


@pytest.mark.skipif(not hasattr(pika.adapters.blocking_connection.BlockingChannel, "flow"), reason="no channel.flow")
def test_channel_flow_pauses_and_resumes_deliveries(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    assert channel.flow(False) is False

    publisher = connection.channel()
    for body in (b"1", b"2", b"3"):
        publisher.basic_publish("", queue, body)
    settle(connection)
    assert received == []
    assert message_count(publisher, queue) == 3

    assert channel.flow(True) is True
    pump(connection, lambda: len(received) >= 3, "deliveries after flow resumed")
    assert [body for _, _, body in received] == [b"1", b"2", b"3"]
