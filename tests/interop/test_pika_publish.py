"""pika's BlockingConnection against a real broker: mandatory and immediate
publishes, publisher confirms, transactions, large and empty bodies, the
maximum message size, and a consumer too slow to read what is published."""

import hashlib
import os

import pika
import pytest
from pika import spec
from pika.exceptions import ConnectionClosedByBroker, UnroutableError

from tests.support.pika_clients import (
    HEADERS,
    MiB,
    closed_by_broker,
    collector,
    fill,
    get_bodies,
    message_count,
    pump,
    redelivery_state,
    settle,
    take,
    type_differences,
)

pytestmark = pytest.mark.usefixtures("watchdog")


# -- mandatory and immediate


def test_mandatory_unroutable_raises_with_confirms(channel, name):
    channel.confirm_delivery()
    missing = name("nobody")
    with pytest.raises(UnroutableError) as raised:
        channel.basic_publish("", missing, b"lost", pika.BasicProperties(message_id="m-1"), mandatory=True)
    [returned] = raised.value.messages
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    assert (returned.method.exchange, returned.method.routing_key) == ("", missing)
    assert returned.body == b"lost"
    assert returned.properties.message_id == "m-1"

    with pytest.raises(UnroutableError):
        channel.basic_publish("amq.direct", missing, b"lost too", mandatory=True)
    channel.basic_publish("amq.direct", missing, b"not mandatory: dropped quietly")  # no exception


def test_mandatory_unroutable_returned_without_confirms(connection, channel, name):
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method, body)))
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"routed", mandatory=True)
    channel.basic_publish("", name("nobody"), b"unroutable", mandatory=True)
    pump(connection, lambda: returned, "basic.return")
    settle(connection)
    assert [(method.reply_code, body) for method, body in returned] == [(312, b"unroutable")]
    assert message_count(channel, queue) == 1


def test_publish_to_missing_exchange_closes_the_channel(connection, channel, name):
    channel.confirm_delivery()
    error = closed_by_broker(channel.basic_publish, name("missing-ex"), "key", b"body")
    assert error.reply_code == 404
    assert error.reply_text.startswith("NOT_FOUND")
    assert connection.is_open


def test_immediate_publish_closes_the_connection_with_540(connect, connection, channel, name):
    """pika has no immediate argument, so the basic.publish is sent by hand. As
    in RabbitMQ, immediate is refused with a connection-level 540."""
    queue = name()
    channel.queue_declare(queue)
    channel._impl._send_method(
        spec.Basic.Publish(exchange="", routing_key=queue, immediate=True),
        (pika.BasicProperties(), b"right now"),
    )
    with pytest.raises(ConnectionClosedByBroker) as raised:
        pump(connection, lambda: False, "the connection to close")
    assert raised.value.reply_code == 540
    assert raised.value.reply_text.startswith("NOT_IMPLEMENTED")
    assert "immediate" in raised.value.reply_text
    assert connection.is_closed

    # The message went nowhere, and the broker still serves everyone else.
    assert message_count(connect().channel(), queue) == 0


# -- publisher confirms


def test_publisher_confirms_for_many_publishes(channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    for number in range(500):
        channel.basic_publish("", queue, b"%d" % number, persistent)  # each returns once confirmed
    assert message_count(channel, queue) == 500
    assert get_bodies(channel, queue) == [b"%d" % number for number in range(500)]


def test_publisher_confirms_for_persistent_messages_on_a_durable_queue(channel, name):
    queue = name()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    for number in range(200):
        channel.basic_publish("", queue, b"%d" % number, persistent)
    with pytest.raises(UnroutableError):
        channel.basic_publish("", name("nobody"), b"lost", persistent, mandatory=True)
    assert get_bodies(channel, queue) == [b"%d" % number for number in range(200)]
    channel.queue_delete(queue)


def test_confirm_select_after_tx_select_is_refused(channel):
    channel.tx_select()
    error = closed_by_broker(channel.confirm_delivery)
    assert error.reply_code == 406


# -- transactions


def test_tx_publishes_wait_for_commit_and_vanish_on_rollback(connection, name):
    queue = name()
    watcher = connection.channel()
    watcher.queue_declare(queue)
    channel = connection.channel()
    assert isinstance(channel.tx_select().method, spec.Tx.SelectOk)

    channel.basic_publish("", queue, b"t1")
    channel.basic_publish("", queue, b"t2")
    assert message_count(watcher, queue) == 0
    assert isinstance(channel.tx_commit().method, spec.Tx.CommitOk)
    assert message_count(watcher, queue) == 2

    channel.basic_publish("", queue, b"rolled back")
    assert isinstance(channel.tx_rollback().method, spec.Tx.RollbackOk)
    assert message_count(watcher, queue) == 2
    channel.tx_commit()  # an empty transaction
    assert get_bodies(watcher, queue) == [b"t1", b"t2"]


def test_tx_acks_apply_on_commit_only(connection, name):
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"a", b"b"])
    channel.tx_select()
    taken = take(channel, queue, 2)

    channel.basic_ack(taken[0][0].delivery_tag)
    channel.tx_rollback()  # the ack is forgotten: "a" stays un-acked
    channel.basic_ack(taken[1][0].delivery_tag)
    channel.tx_commit()  # only "b" is acked
    channel.close()
    assert redelivery_state(connection.channel(), queue) == [(b"a", True)]


def test_tx_mandatory_unroutable_returned_at_commit(connection, channel, name):
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method, body)))
    channel.tx_select()
    channel.basic_publish("", name("nobody"), b"unroutable in tx", mandatory=True)
    settle(connection)
    assert returned == []
    channel.tx_commit()
    pump(connection, lambda: returned, "basic.return after commit")
    assert [(method.reply_code, body) for method, body in returned] == [(312, b"unroutable in tx")]


def test_tx_commit_with_a_publish_a_full_queue_refused_is_a_partial_completion(connection, name):
    """RabbitMQ 3.10 answers so: 406 "partial tx completion", and what the queue took stays."""
    queue = name()
    connection.channel().queue_declare(queue, durable=True,
                                       arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel = connection.channel()
    channel.tx_select()
    for body in (b"kept", b"refused"):
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    error = closed_by_broker(channel.tx_commit)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - partial tx completion")
    assert get_bodies(connection.channel(), queue) == [b"kept"]


def test_tx_commit_without_select_is_refused(channel):
    error = closed_by_broker(channel.tx_commit)
    assert error.reply_code == 406


# -- bodies


def round_trip_large(connection, queue, body):
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    channel.basic_publish("", queue, body)
    channel.basic_publish("", queue, body)

    method, _, got = channel.basic_get(queue, auto_ack=True)
    assert method is not None
    assert (len(got), hashlib.sha256(got).hexdigest()) == (len(body), hashlib.sha256(body).hexdigest())

    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: received, "a large delivery", timeout=20)
    got = received[0][2]
    assert (len(got), hashlib.sha256(got).hexdigest()) == (len(body), hashlib.sha256(body).hexdigest())


def test_ten_mebibyte_body_round_trips(connection, name):
    round_trip_large(connection, name(), os.urandom(10 * MiB))


def test_ten_mebibyte_body_with_small_frames(connect, own_broker, name):
    broker = own_broker("--frame-max", "4096")
    connection = connect(broker)
    assert connection._impl.params.frame_max == 4096
    round_trip_large(connection, name(), os.urandom(10 * MiB))

    # A returned message is split the same way.
    channel = connection.channel()
    channel.confirm_delivery()
    body = os.urandom(100 * 1024)
    with pytest.raises(UnroutableError) as raised:
        channel.basic_publish("", name("nobody"), body, pika.BasicProperties(headers=HEADERS), mandatory=True)
    [returned] = raised.value.messages
    assert returned.body == body
    assert type_differences(returned.properties.headers, HEADERS) == []


def test_empty_body(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"", pika.BasicProperties(content_type="text/plain"))
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert (body, properties.content_type) == (b"", "text/plain")

    channel.basic_publish("", queue, b"")
    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: received, "an empty delivery")
    assert received[0][2] == b""


def test_message_larger_than_max_message_size_closes_the_channel(connect, own_broker, name):
    broker = own_broker("--max-message-size", "1M")
    connection = connect(broker)
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"x" * MiB)  # exactly the limit is fine

    error = closed_by_broker(channel.basic_publish, "", queue, b"x" * (MiB + 1))
    assert error.reply_code == 406
    assert error.reply_text.startswith("PRECONDITION_FAILED")
    assert connection.is_open
    channel = connection.channel()
    assert message_count(channel, queue) == 1
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert len(body) == MiB


# -- a consumer that does not keep up


def test_slow_reader_gets_every_delivery_in_order(connect, name):
    """The consumer's connection is not read while the other one publishes 16 MiB: the
    broker has to hold deliveries back and resume once the consumer catches up."""
    queue = name()
    consumer_connection, publisher_connection = connect(), connect()
    consuming = consumer_connection.channel()
    consuming.queue_declare(queue)
    received, on_message = collector()
    consuming.basic_consume(queue, on_message, auto_ack=True)

    publishing = publisher_connection.channel()
    publishing.confirm_delivery()
    chunk = os.urandom(64 * 1024)
    for number in range(256):
        publishing.basic_publish("", queue, b"%03d" % number + chunk)

    pump(consumer_connection, lambda: len(received) >= 256, "256 deliveries", timeout=20)
    assert [body[:3] for _, _, body in received] == [b"%03d" % number for number in range(256)]
    assert all(body[3:] == chunk for _, _, body in received)
    assert message_count(publishing, queue) == 0
