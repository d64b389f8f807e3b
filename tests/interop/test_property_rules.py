"""What the broker accepts: every way of publishing and declaring checks the same
property and field-table rules before anything is kept, in AMQP and the native
protocol, so that whatever is accepted can be delivered in both protocols and
read back after a restart.

- Field tables nest at most MAX_TABLE_DEPTH (24) levels; deeper declare
  arguments and message headers get 406 naming them, and a broker SIGKILLed
  afterwards starts again and serves everything else, on every durable backend.
- A native publish the AMQP side could not carry (priority 300, a 300-byte
  content_type or header name) gets 406 and queues nothing: an AMQP consumer
  gets the next good message.
- Native field values outside what the broker can represent (timestamps beyond
  years 1-9999, decimal scales over 255) get 406; an AMQP timestamp of any
  int64 value routes through a headers exchange without an error.
"""

import struct
import uuid

import pika
import pika.exceptions
import pytest
from pamqp import commands

from brokerd.proto import messages_pb2
from brokerd.proto.native_pb2 import Envelope
from brokerd.proto.tables import MAX_TABLE_DEPTH, dict_to_table
from crashloop.loop import DURABLE_BACKENDS, backend_installed
from tests.support.client_broker import (
    TRACEBACK_MARKS,
    logged_errors,
    pika_connection,
    raw_client,
    start_broker,
    unique_names,
)
from tests.support.rawamqp import FRAME_BODY, FRAME_HEADER, raw_frame
from tests.support.rawnative import RawNative

pytestmark = pytest.mark.usefixtures("no_broker_tracebacks")

unique = unique_names("property-rules")


def deep_table(levels):
    """A field table nested C{levels} deep, itself counting 1: C{{"x-a": {"a": {"a": ... [[None]]}}}}."""
    value = [[None]]  # the innermost two levels
    for _ in range(levels - 3):
        value = {"a": value}
    return {"x-a": value}


def native_properties(**fields):
    return messages_pb2.BasicProperties(**fields)


def persistent(headers=None):
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT)
    if headers is not None:
        dict_to_table(headers, properties.headers)
    return properties


def refused_declare(native, channel, queue, arguments, *words):
    """A durable queue.declare on a fresh native C{channel} that must get 406 with C{words} in its text."""
    native.open_channel(channel)
    envelope = Envelope(channel=channel)
    envelope.queue_declare.queue = queue
    envelope.queue_declare.durable = True
    if isinstance(arguments, dict):
        dict_to_table(arguments, envelope.queue_declare.arguments)
    else:
        envelope.queue_declare.arguments.CopyFrom(arguments)
    return native.expect_channel_close(native.answer(envelope), 406, "PRECONDITION_FAILED", *words)


# -- defect 1: tables nested deeper than the stores can read back


def durable_backend(name):
    return pytest.param(
        name,
        marks=pytest.mark.skipif(not backend_installed(name), reason=f"backend {name!r} is not installed"),
        id=name,
    )


@pytest.mark.parametrize("backend", [durable_backend(name) for name in DURABLE_BACKENDS])
def test_tables_nested_too_deep_are_refused_and_a_killed_broker_restarts_serving_the_rest(backend, tmp_path):
    too_deep, deepest = deep_table(33), deep_table(MAX_TABLE_DEPTH)
    kept, deep_arguments = "kept", "deep-arguments"
    running = start_broker(tmp_path, "--backend", backend)
    try:
        with pika_connection(running) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare(kept, durable=True)
            channel.queue_declare(deep_arguments, durable=True, arguments=deepest)  # the limit itself is fine
            channel.basic_publish("", kept, b"first", pika.BasicProperties(delivery_mode=2))
            channel.basic_publish("", kept, b"deepest", pika.BasicProperties(delivery_mode=2, headers=deepest))

            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as declared:
                connection.channel().queue_declare("too-deep-amqp", durable=True, arguments=too_deep)
            assert declared.value.reply_code == 406
            assert "'x-a'" in declared.value.reply_text and f"{MAX_TABLE_DEPTH} levels" in declared.value.reply_text

            publisher = connection.channel()
            publisher.confirm_delivery()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as published:
                publisher.basic_publish("", kept, b"too deep", pika.BasicProperties(delivery_mode=2, headers=too_deep))
            assert published.value.reply_code == 406
            assert "header 'x-a'" in published.value.reply_text
            assert f"{MAX_TABLE_DEPTH} levels" in published.value.reply_text

        with RawNative(running.native_endpoint).hello() as native:
            refused_declare(native, 1, "too-deep-native", too_deep, "'x-a'", f"{MAX_TABLE_DEPTH} levels")
            native.refused_publish(2, "", kept, b"too deep", persistent(too_deep), 406, "header 'x-a'",
                                   f"{MAX_TABLE_DEPTH} levels")
        assert not logged_errors(running.process, 0, TRACEBACK_MARKS)
    finally:
        running.process.kill()

    restarted = start_broker(tmp_path, "--backend", backend)
    try:
        with pika_connection(restarted) as connection:
            channel = connection.channel()
            assert channel.queue_declare(kept, passive=True).method.message_count == 2
            channel.queue_declare(deep_arguments, durable=True, arguments=deepest)  # equivalent: it came back
            first = channel.basic_get(kept, auto_ack=True)
            second = channel.basic_get(kept, auto_ack=True)
            assert (first[2], second[2]) == (b"first", b"deepest")
            assert second[1].headers == deepest
            for name in ("too-deep-amqp", "too-deep-native"):
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
                    connection.channel().queue_declare(name, passive=True)
                assert missing.value.reply_code == 404
        assert not logged_errors(restarted.process, 0, TRACEBACK_MARKS)
    finally:
        restarted.process.stop()


# -- defect 5: native publishes that AMQP could not carry


HEADER_NAME_300 = messages_pb2.BasicProperties()
dict_to_table({"h" * 300: "value"}, HEADER_NAME_300.headers)


@pytest.mark.parametrize(
    "properties, words",
    [
        (native_properties(priority=300), ("property priority", "300", "0..255")),
        (native_properties(content_type="t" * 300), ("property content_type", "300 bytes", "255")),
        (native_properties(app_id="é" * 150), ("property app_id", "300 bytes", "255")),
        (HEADER_NAME_300, ("header name", "300 bytes", "255")),
    ],
    ids=["priority-300", "content-type-300-bytes", "app-id-300-bytes", "header-name-300-bytes"],
)
def test_a_native_publish_amqp_cannot_carry_is_refused_and_an_amqp_consumer_gets_the_next_message(
    broker, properties, words
):
    queue = unique("poison")
    good = f"good {uuid.uuid4().hex}".encode()
    with pika_connection(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=False)
        with RawNative(broker.native_endpoint).hello() as native:
            native.refused_publish(1, "", queue, b"poison", properties, 406, "PRECONDITION_FAILED", *words)
            native.open_channel(2)
            native.publish(2, "", queue, good, native_properties(content_type="text/plain", priority=255))
            deliveries = channel.consume(queue, auto_ack=True, inactivity_timeout=5)
            method, received_properties, body = next(deliveries)
            assert body == good
            assert received_properties.priority == 255
            channel.cancel()
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        channel.queue_delete(queue)


# -- defect 7: field values that cannot be represented, and AMQP timestamps of any int64 value


def header_value(name, **value):
    """BasicProperties whose one header C{name} holds the raw FieldValue C{value}."""
    properties = messages_pb2.BasicProperties()
    field = properties.headers.fields.add()
    field.name = name
    for kind, content in value.items():
        if kind == "decimal_value":
            field.value.decimal_value.scale, field.value.decimal_value.value = content
        else:
            setattr(field.value, kind, content)
    return properties


@pytest.mark.parametrize(
    "properties, words",
    [
        (header_value("stamp", timestamp_value=2**62), ("header 'stamp'", "timestamp", str(2**62))),
        (header_value("stamp", timestamp_value=-(2**40)), ("header 'stamp'", "timestamp")),
        (header_value("price", decimal_value=(300, 1)), ("header 'price'", "decimal scale 300", "0..255")),
        (header_value("price", decimal_value=(2, 2**40)), ("header 'price'", "decimal value", "32-bit")),
        (header_value("n", integer_value=1000, integer_kind=messages_pb2.UINT8), ("header 'n'", "1000", "UINT8")),
    ],
    ids=["timestamp-2**62", "timestamp-negative", "decimal-scale-300", "decimal-value-2**40", "uint8-1000"],
)
def test_a_native_field_value_out_of_range_is_refused_with_406_naming_it(broker, properties, words):
    queue = unique("values")
    with pika_connection(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        with RawNative(broker.native_endpoint).hello() as native:
            native.refused_publish(1, "", queue, b"refused", properties, 406, "PRECONDITION_FAILED", *words)
            refused_declare(native, 2, unique("values-declare"), properties.headers, *words[1:])
            native.open_channel(3)
            native.publish(3, "", queue, b"fine")
            deliveries = channel.consume(queue, auto_ack=True, inactivity_timeout=5)
            assert next(deliveries)[2] == b"fine"
            channel.cancel()
        channel.queue_delete(queue)


def amqp_timestamp_header(name, seconds):
    """Content-header property bytes holding one header C{name}: an AMQP timestamp ('T') of C{seconds}."""
    field = bytes([len(name)]) + name.encode() + b"T" + struct.pack(">q", seconds)
    return struct.pack(">H", 0x2000) + struct.pack(">I", len(field)) + field


def test_an_amqp_timestamp_of_any_int64_value_routes_through_a_headers_exchange(broker):
    exchange, any_stamp, equal_int = unique("stamps"), unique("any-stamp"), unique("int-stamp")
    seconds = 2**62
    with pika_connection(broker) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "headers")
        for queue in (any_stamp, equal_int):
            channel.queue_declare(queue)
        channel.queue_bind(any_stamp, exchange, arguments={"x-match": "any", "stamp": None})
        channel.queue_bind(equal_int, exchange, arguments={"x-match": "all", "stamp": seconds})

        with raw_client(broker) as raw:
            raw.open_channel(1)
            body = b"stamped"
            raw.send_method(1, commands.Basic.Publish(exchange=exchange, routing_key=""))
            content_header = struct.pack(">HHQ", 60, 0, len(body)) + amqp_timestamp_header("stamp", seconds)
            raw.send(raw_frame(FRAME_HEADER, 1, content_header) + raw_frame(FRAME_BODY, 1, body))
            raw.round_trip(1, unique("after-stamp"))  # the connection is still open: no 541

        # A timestamp header is not equal to an integer argument of the same number.
        assert channel.queue_declare(equal_int, passive=True).method.message_count == 0
        with RawNative(broker.native_endpoint).hello() as native:
            native.open_channel(1)
            get = Envelope(channel=1)
            get.basic_get.queue, get.basic_get.no_ack = any_stamp, True
            reply = native.answer(get)
            assert reply.WhichOneof("payload") == "basic_get_ok", reply
            assert reply.basic_get_ok.body == body
            [field] = reply.basic_get_ok.properties.headers.fields
            assert (field.name, field.value.timestamp_value) == ("stamp", seconds)
        channel.exchange_delete(exchange)
        for queue in (any_stamp, equal_int):
            channel.queue_delete(queue)
