"""Errors that close only their AMQP channel (406 conflicts and oversized or
malformed messages, 404 missing exchanges, 405 locked exclusive queues), each
while a bystander connection to the same broker stays unharmed."""

import struct

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.support.client_broker import (
    bystander,
    checked_for_tracebacks,
    pika_connection,
    pika_round_trip,
    raw_client,
    start_broker,
    unique_names,
)
from tests.support.rawamqp import FRAME_BODY, FRAME_HEADER, raw_frame

pytestmark = pytest.mark.usefixtures("no_broker_tracebacks")

unique = unique_names("amqp-channel-errors")


@pytest.fixture(scope="module")
def small_messages_broker(tmp_path_factory):
    """A broker that accepts message bodies up to 1 KiB."""
    running = start_broker(tmp_path_factory.mktemp("small-broker"), "--max-message-size", "1K")
    with checked_for_tracebacks(running):
        yield running
    running.process.stop()


# -- state conflicts: channel errors


def test_redeclaring_a_queue_with_other_attributes_closes_the_channel_with_406(broker):
    queue = unique("conflict")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=False)

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.queue_declare(queue, durable=True)

        assert raised.value.reply_code == 406
        assert "PRECONDITION_FAILED" in raised.value.reply_text
        assert queue in raised.value.reply_text and "durable" in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        pika_round_trip(connection)
        connection.channel().queue_delete(queue)


def test_redeclaring_an_exchange_with_another_type_closes_the_channel_with_406(broker):
    exchange = unique("conflict-ex")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "direct")

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.exchange_declare(exchange, "fanout")

        assert raised.value.reply_code == 406
        assert "PRECONDITION_FAILED" in raised.value.reply_text
        assert exchange in raised.value.reply_text and "type" in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        pika_round_trip(connection)
        connection.channel().exchange_delete(exchange)


def test_publishing_to_a_missing_exchange_closes_the_channel_with_404(broker):
    exchange = unique("missing-ex")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.basic_publish(exchange, "anything", b"lost")

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.queue_declare("", exclusive=True)  # any synchronous call shows the close

        assert raised.value.reply_code == 404
        assert "NOT_FOUND" in raised.value.reply_text and exchange in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        pika_round_trip(connection)


EXCLUSIVE_QUEUE_USES = {
    "basic.consume": lambda channel, queue: channel.basic_consume(queue, lambda *args: None),
    "queue.declare": lambda channel, queue: channel.queue_declare(queue, exclusive=True),
    "passive queue.declare": lambda channel, queue: channel.queue_declare(queue, passive=True),
    "basic.get": lambda channel, queue: channel.basic_get(queue),
}


@pytest.mark.parametrize("use", EXCLUSIVE_QUEUE_USES)
def test_another_connections_exclusive_queue_is_locked_with_405(broker, use):
    queue = unique("exclusive")
    with bystander(broker), pika_connection(broker) as owner, pika_connection(broker) as other:
        owner_channel = owner.channel()
        owner_channel.queue_declare(queue, exclusive=True)
        channel = other.channel()

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            EXCLUSIVE_QUEUE_USES[use](channel, queue)

        assert raised.value.reply_code == 405
        assert "RESOURCE_LOCKED" in raised.value.reply_text and queue in raised.value.reply_text
        assert channel.is_closed and other.is_open and owner.is_open
        pika_round_trip(other)
        owner_channel.basic_publish("", queue, b"still mine")
        method, _, body = owner_channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"still mine"


# -- message size: a channel error


def test_a_body_over_max_message_size_closes_the_channel_with_406(small_messages_broker):
    broker = small_messages_broker
    queue = unique("big")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.basic_publish("", queue, b"x" * 1024)  # exactly the limit is fine
        assert channel.queue_declare(queue, passive=True).method.message_count == 1

        channel.basic_publish("", queue, b"y" * 2000)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.queue_declare(queue, passive=True)

        assert raised.value.reply_code == 406
        assert "PRECONDITION_FAILED" in raised.value.reply_text
        assert "2000" in raised.value.reply_text and "1024" in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        other_channel = connection.channel()
        assert other_channel.queue_declare(queue, passive=True).method.message_count == 1
        pika_round_trip(connection)
        other_channel.queue_delete(queue)


def test_a_raw_body_over_max_message_size_closes_only_its_channel(small_messages_broker):
    broker = small_messages_broker
    queue = unique("big-raw")
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.open_channel(2)
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send_content(1, b"z" * 5000)

        close = client.expect_channel_close(1, 406, "PRECONDITION_FAILED", "5000", "1024")

        assert (close.class_id, close.method_id) == (60, 40)
        client.round_trip(2, queue)


# -- malformed content-header properties

MALFORMED_PROPERTIES = {
    # content_type flag, then a short string longer than the frame
    "string past the end": struct.pack(">H", 0x8000) + b"\xc8abc",
    # content_type flag, then bytes that are not UTF-8
    "invalid UTF-8": struct.pack(">H", 0x8000) + b"\x02\xff\xfe",
    # headers flag, then a table with a value of unknown type
    "unknown field type": struct.pack(">H", 0x2000) + struct.pack(">I", 3) + b"\x01kZ",
    # delivery_mode flag and nothing after it
    "missing delivery mode": struct.pack(">H", 0x1000),
}


@pytest.mark.parametrize("properties", MALFORMED_PROPERTIES)
def test_malformed_content_header_properties_are_refused(broker, properties):
    queue = unique("malformed")
    with bystander(broker) as other, raw_client(broker) as client:
        other.channel().queue_declare(queue)
        client.open_channel(1)
        body = b"payload"
        header_payload = struct.pack(">HHQ", 60, 0, len(body)) + MALFORMED_PROPERTIES[properties]
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send(raw_frame(FRAME_HEADER, 1, header_payload) + raw_frame(FRAME_BODY, 1, body))
        client.send_method(1, commands.Queue.Declare(queue=queue, passive=True))  # answered only if accepted

        channel, reply = client.wait_for(commands.Connection.Close, commands.Channel.Close, commands.Queue.DeclareOk)

        assert not isinstance(reply, commands.Queue.DeclareOk), (
            f"the broker accepted a message with malformed properties {MALFORMED_PROPERTIES[properties]!r}"
            f" (queue now holds {reply.message_count})"
        )
        if isinstance(reply, commands.Connection.Close):
            assert reply.reply_code == 502, reply.reply_text
            assert "SYNTAX_ERROR" in reply.reply_text
            client.send_method(0, commands.Connection.CloseOk())
            client.wait_closed()
        else:
            assert (channel, reply.reply_code) == (1, 406), reply.reply_text
        assert "propert" in reply.reply_text  # names the content header properties
        check = other.channel()
        assert check.queue_declare(queue, passive=True).method.message_count == 0
        check.queue_delete(queue)
