"""The AMQP struct fast paths in brokerd.amqp.frames, byte for byte against pamqp.

pamqp is the reference encoding: every frame the fast paths write must equal
``pamqp.frame.marshal`` of the same method (or content), and the decoders must
read back what pamqp wrote. pamqp validates exchange and queue names more
strictly than AMQP and RabbitMQ do (ASCII only, at most 127 characters for an
exchange); for longer or non-ASCII names its encoder is used with that check
turned off, so the reference bytes still come from pamqp.
"""

import datetime
import itertools

import pytest
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from brokerd.amqp import frames
from brokerd.amqp.properties import encode_properties
from brokerd.errors import FrameSyntaxError
from brokerd.proto import messages_pb2

LONG_UTF8 = "é" * 127 + "x"  # 255 bytes of UTF-8, the longest short string
assert len(LONG_UTF8.encode()) == 255
LONG_ASCII = "q" * 255
# pamqp writes a delivery tag as a signed long-long, so the comparisons stop at its largest value.
MAX_TAG = 2**63 - 1


def unvalidated(method_class):
    """C{method_class} with pamqp's name validation turned off (its encoder unchanged)."""
    return type(method_class.__name__, (method_class,), {"validate": lambda self: None})


def marshal(method, channel, **unchecked):
    """pamqp's frame for C{method}; C{unchecked} attributes are set past its name validation."""
    if unchecked:
        method.__class__ = unvalidated(type(method))
        for name, value in unchecked.items():
            setattr(method, name, value)
    return pamqp_frame.marshal(method, channel)


def payload_bounds(frame):
    """C{(start, end)} of a method frame's arguments: just past the method index, and the frame-end byte."""
    return frames.FRAME_START_SIZE + 4, len(frame) - 1


# -- basic.deliver

DELIVER_NAMES = [
    # (consumer tag, exchange, routing key)
    ("", "", ""),
    ("ctag-1", "amq.direct", "orders"),
    ("amq.ctag-Xyz_0", "", "queue.with.dots"),
    ("tag-é", "logs", "route/ü/☃"),
    (LONG_UTF8, "", LONG_UTF8),
    ("c", LONG_UTF8, "r"),
    (LONG_UTF8, LONG_UTF8, LONG_UTF8),
    (LONG_ASCII, LONG_ASCII, LONG_ASCII),
]


def encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key):
    """A basic.deliver frame as a channel writes it: the frame's kept bytes around the packed tag."""
    before, after = frames.deliver_frame_around(channel, consumer_tag, exchange, routing_key)
    return before + frames.DELIVERY_TAG.pack(delivery_tag, redelivered) + after


@pytest.mark.parametrize("consumer_tag, exchange, routing_key", DELIVER_NAMES)
@pytest.mark.parametrize("redelivered", [False, True])
@pytest.mark.parametrize("channel, delivery_tag", [(1, 1), (7, 2**32 + 5), (65535, MAX_TAG)])
def test_encode_deliver_equals_pamqp(consumer_tag, exchange, routing_key, redelivered, channel, delivery_tag):
    expected = marshal(
        commands.Basic.Deliver(
            consumer_tag=consumer_tag, delivery_tag=delivery_tag, redelivered=redelivered, routing_key=routing_key
        ),
        channel,
        exchange=exchange,
    )

    encoded = encode_deliver(
        channel, consumer_tag.encode(), delivery_tag, redelivered, exchange.encode(), routing_key.encode()
    )

    assert encoded == expected


def test_encode_deliver_reads_back_through_pamqp():
    encoded = encode_deliver(3, "tag-é".encode(), 42, True, b"amq.topic", "a.ü.c".encode())

    consumed, channel, method = pamqp_frame.unmarshal(encoded)

    assert (consumed, channel) == (len(encoded), 3)
    assert isinstance(method, commands.Basic.Deliver)
    assert (method.consumer_tag, method.delivery_tag, method.redelivered, method.exchange, method.routing_key) == (
        "tag-é",
        42,
        True,
        "amq.topic",
        "a.ü.c",
    )


# -- publisher confirms


@pytest.mark.parametrize("multiple", [False, True])
@pytest.mark.parametrize("channel, delivery_tag", [(1, 0), (1, 1), (300, 123456789), (65535, MAX_TAG)])
def test_encode_confirm_ack_equals_pamqp_basic_ack(channel, delivery_tag, multiple):
    expected = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple), channel)

    assert frames.encode_confirm(channel, delivery_tag, multiple, ack=True) == expected


@pytest.mark.parametrize("multiple", [False, True])
@pytest.mark.parametrize("channel, delivery_tag", [(1, 0), (1, 1), (300, 123456789), (65535, MAX_TAG)])
def test_encode_confirm_nack_equals_pamqp_basic_nack_without_requeue(channel, delivery_tag, multiple):
    expected = pamqp_frame.marshal(
        commands.Basic.Nack(delivery_tag=delivery_tag, multiple=multiple, requeue=False), channel
    )

    assert frames.encode_confirm(channel, delivery_tag, multiple, ack=False) == expected


# -- content frames

_Kind = messages_pb2.IntegerKind


def _field(name, **value):
    return messages_pb2.Field(name=name, value=messages_pb2.FieldValue(**value))


TIMESTAMP = datetime.datetime(2024, 2, 29, 12, 30, 15, tzinfo=datetime.UTC)

# (brokerd BasicProperties, the same properties for pamqp). pamqp writes table
# fields sorted by name and picks the smallest integer type, so the protobuf
# tables list their fields in that order with those integer kinds.
PROPERTIES = {
    "none": (messages_pb2.BasicProperties(), commands.Basic.Properties()),
    "content type and persistent": (
        messages_pb2.BasicProperties(content_type="application/json", delivery_mode=messages_pb2.PERSISTENT),
        commands.Basic.Properties(content_type="application/json", delivery_mode=2),
    ),
    "every property": (
        messages_pb2.BasicProperties(
            content_type="text/plain",
            content_encoding="utf-8",
            headers=messages_pb2.FieldTable(
                fields=[
                    _field("big", integer_value=70000, integer_kind=_Kind.INT32),
                    _field("count", integer_value=7, integer_kind=_Kind.INT8),
                    _field("flag", boolean_value=True),
                    _field(
                        "list",
                        array_value=messages_pb2.FieldArray(
                            values=[
                                messages_pb2.FieldValue(integer_value=-300, integer_kind=_Kind.INT16),
                                messages_pb2.FieldValue(string_value="x"),
                            ]
                        ),
                    ),
                    _field("name", string_value="Zoë"),
                    _field(
                        "nested",
                        table_value=messages_pb2.FieldTable(
                            fields=[_field("n", integer_value=2**40, integer_kind=_Kind.INT64)]
                        ),
                    ),
                ]
            ),
            delivery_mode=messages_pb2.TRANSIENT,
            priority=9,
            correlation_id="corr-1",
            reply_to="amq.rabbitmq.reply-to",
            expiration="60000",
            message_id="msg-é",
            timestamp=int(TIMESTAMP.timestamp()),
            type="order.created",
            user_id="guest",
            app_id="brokerd-tests",
        ),
        commands.Basic.Properties(
            content_type="text/plain",
            content_encoding="utf-8",
            headers={
                "big": 70000,
                "count": 7,
                "flag": True,
                "list": [-300, "x"],
                "name": "Zoë",
                "nested": {"n": 2**40},
            },
            delivery_mode=1,
            priority=9,
            correlation_id="corr-1",
            reply_to="amq.rabbitmq.reply-to",
            expiration="60000",
            message_id="msg-é",
            timestamp=TIMESTAMP,
            message_type="order.created",
            user_id="guest",
            app_id="brokerd-tests",
        ),
    ),
}


@pytest.mark.parametrize("name", PROPERTIES)
def test_encode_properties_equals_pamqp_properties(name):
    ours, theirs = PROPERTIES[name]

    assert encode_properties(ours) == theirs.marshal()


def pamqp_content(channel, properties, body, frame_max):
    """pamqp's content header frame, then body frames of at most C{frame_max} bytes each."""
    largest = frame_max - frames.FRAME_OVERHEAD
    content = [
        pamqp_frame.marshal(pamqp_header.ContentHeader(weight=0, body_size=len(body), properties=properties), channel)
    ]
    for offset in range(0, len(body), largest):
        content.append(pamqp_frame.marshal(pamqp_body.ContentBody(body[offset : offset + largest]), channel))
    return b"".join(content)


def split_frames(data):
    """The frames in C{data} as pamqp reads them: a list of C{(size, channel, frame)}."""
    result = []
    while data:
        consumed, channel, value = pamqp_frame.unmarshal(data)
        result.append((consumed, channel, value))
        data = data[consumed:]
    return result


BODY_SIZES = {
    "empty": lambda frame_max: 0,
    "one byte": lambda frame_max: 1,
    "exactly one frame": lambda frame_max: frame_max - 8,
    "one byte over a frame": lambda frame_max: frame_max - 7,
    "three and a half frames": lambda frame_max: frame_max * 7 // 2,
}


@pytest.mark.parametrize("frame_max", [frames.FRAME_MIN_SIZE, 131072])
@pytest.mark.parametrize("size_name", BODY_SIZES)
@pytest.mark.parametrize("properties_name", PROPERTIES)
def test_content_frames_equal_pamqp_header_and_body_frames(frame_max, size_name, properties_name):
    size = BODY_SIZES[size_name](frame_max)
    body = bytes(itertools.islice(itertools.cycle(range(251)), size))
    ours, theirs = PROPERTIES[properties_name]
    channel = 5

    joined = b"".join(frames.content_frames(channel, encode_properties(ours), body, frame_max))

    assert joined == pamqp_content(channel, theirs, body, frame_max)
    read = split_frames(joined)
    assert all(consumed <= frame_max for consumed, _, _ in read)
    assert [channel_id for _, channel_id, _ in read] == [channel] * len(read)
    assert read[0][2].body_size == size
    assert b"".join(value.value for _, _, value in read[1:]) == body
    assert len(read) - 1 == -(-size // (frame_max - frames.FRAME_OVERHEAD))


def test_content_frames_accepts_a_memoryview_body():
    body = bytes(range(256)) * 40
    properties = commands.Basic.Properties(content_type="application/octet-stream")

    joined = b"".join(frames.content_frames(2, properties.marshal(), memoryview(body), 4096))

    assert joined == pamqp_content(2, properties, body, 4096)


# -- content header decoding


@pytest.mark.parametrize("properties_name", PROPERTIES)
@pytest.mark.parametrize("body_size", [0, 1, 2**40])
def test_decode_content_header_of_a_pamqp_header_frame(properties_name, body_size):
    _, theirs = PROPERTIES[properties_name]
    frame = pamqp_frame.marshal(pamqp_header.ContentHeader(weight=0, body_size=body_size, properties=theirs), 1)
    data = b"\x01\x02\x03" + frame + b"\x08\x00\x00\x00\x00\x00\x00\xce"  # inside a longer read
    start = 3 + frames.FRAME_START_SIZE
    end = 3 + len(frame) - 1

    class_id, decoded_size, properties_start = frames.decode_content_header(data, start, end)

    assert (class_id, decoded_size) == (60, body_size)
    assert data[properties_start:end] == theirs.marshal()


@pytest.mark.parametrize("length", range(14))
def test_decode_content_header_refuses_a_truncated_header(length):
    frame = pamqp_frame.marshal(pamqp_header.ContentHeader(weight=0, body_size=10), 1)
    start = frames.FRAME_START_SIZE

    with pytest.raises(FrameSyntaxError, match="truncated"):
        frames.decode_content_header(frame, start, start + length)


# -- basic.publish and basic.ack decoding

PUBLISH_NAMES = [
    # (exchange, routing key)
    ("", ""),
    ("", "tasks"),
    ("amq.topic", "stock.usd.nyse"),
    ("logs", "ключ.маршрута"),
    ("events", "日本.東京"),
    ("", LONG_UTF8),
    ("fan-é", "r"),
    (LONG_UTF8, LONG_UTF8),
]


@pytest.mark.parametrize("exchange, routing_key", PUBLISH_NAMES)
@pytest.mark.parametrize("mandatory, immediate", list(itertools.product([False, True], repeat=2)))
def test_decode_publish_of_pamqp_basic_publish(exchange, routing_key, mandatory, immediate):
    frame = marshal(
        commands.Basic.Publish(routing_key=routing_key, mandatory=mandatory, immediate=immediate), 1, exchange=exchange
    )
    start, end = payload_bounds(frame)

    assert frames.decode_publish(frame, start, end) == (exchange, routing_key, mandatory, immediate)


def test_decode_publish_reads_only_between_start_and_end():
    first = pamqp_frame.marshal(commands.Basic.Publish(exchange="a", routing_key="one", mandatory=True), 1)
    second = pamqp_frame.marshal(commands.Basic.Publish(exchange="b", routing_key="two", immediate=True), 2)
    data = first + second
    start, end = payload_bounds(second)

    assert frames.decode_publish(data, len(first) + start, len(first) + end) == ("b", "two", False, True)


def _publish_arguments():
    frame = pamqp_frame.marshal(commands.Basic.Publish(exchange="ex-1", routing_key="rk.é", mandatory=True), 1)
    start, end = payload_bounds(frame)
    return frame[start:end]


PUBLISH_ARGUMENTS = _publish_arguments()


@pytest.mark.parametrize("length", range(len(PUBLISH_ARGUMENTS)))
def test_decode_publish_refuses_truncated_arguments(length):
    with pytest.raises(FrameSyntaxError, match="basic.publish"):
        frames.decode_publish(PUBLISH_ARGUMENTS[:length], 0, length)


@pytest.mark.parametrize("length", range(len(PUBLISH_ARGUMENTS)))
def test_decode_publish_refuses_a_frame_shorter_than_its_arguments_when_more_bytes_follow(length):
    # The frame's size says the arguments end early; the bytes after are the next frame's.
    data = PUBLISH_ARGUMENTS + b"\x01" * 16

    with pytest.raises(FrameSyntaxError, match="basic.publish"):
        frames.decode_publish(data, 0, length)


@pytest.mark.parametrize("multiple", [False, True])
@pytest.mark.parametrize("delivery_tag", [0, 1, 255, 2**32, MAX_TAG])
def test_decode_ack_of_pamqp_basic_ack(delivery_tag, multiple):
    frame = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple), 9)
    start, end = payload_bounds(frame)

    assert frames.decode_ack(frame, start, end) == (delivery_tag, multiple)


def test_decode_ack_reads_at_start_inside_a_longer_read():
    first = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=1, multiple=False), 1)
    second = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=77, multiple=True), 1)
    start, end = payload_bounds(second)

    assert frames.decode_ack(first + second, len(first) + start, len(first) + end) == (77, True)


def test_delivery_tags_above_pamqps_range_are_unsigned():
    # AMQP's delivery-tag is an unsigned long-long; the confirm writer and the ack reader agree on it.
    encoded = frames.encode_confirm(1, 2**64 - 1, True, ack=True)
    start, end = payload_bounds(encoded)

    assert frames.decode_ack(encoded, start, end) == (2**64 - 1, True)


@pytest.mark.parametrize("length", range(9))
def test_decode_ack_refuses_truncated_arguments(length):
    frame = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=5, multiple=True), 1)
    start, _ = payload_bounds(frame)

    with pytest.raises(FrameSyntaxError, match="basic.ack"):
        frames.decode_ack(frame[: start + length], start, start + length)


# -- other hand-built methods


@pytest.mark.parametrize("queue", ["", "q", "amq.gen-JzTY20BRgKO-HjmUJj0wLg", LONG_ASCII, "очередь", LONG_UTF8])
@pytest.mark.parametrize("message_count, consumer_count", [(0, 0), (12, 3), (2**32 - 1, 2**32 - 1)])
def test_encode_declare_ok_equals_pamqp_queue_declare_ok(queue, message_count, consumer_count):
    expected = marshal(
        commands.Queue.DeclareOk(queue="q", message_count=message_count, consumer_count=consumer_count), 4, queue=queue
    )

    assert frames.encode_declare_ok(4, queue, message_count, consumer_count) == expected


def test_encode_declare_ok_refuses_a_queue_name_longer_than_a_short_string():
    with pytest.raises(ValueError, match="255"):
        frames.encode_declare_ok(1, "é" * 128, 0, 0)


@pytest.mark.parametrize(
    "exchange, routing_key", [("", ""), ("amq.direct", "jobs"), ("ex-é", "ключ"), (LONG_UTF8, LONG_UTF8)]
)
@pytest.mark.parametrize("redelivered", [False, True])
@pytest.mark.parametrize("delivery_tag, message_count", [(1, 0), (MAX_TAG, 2**32 - 1)])
def test_encode_get_ok_equals_pamqp_basic_get_ok(exchange, routing_key, redelivered, delivery_tag, message_count):
    expected = marshal(
        commands.Basic.GetOk(
            delivery_tag=delivery_tag, redelivered=redelivered, routing_key=routing_key, message_count=message_count
        ),
        6,
        exchange=exchange,
    )

    assert frames.encode_get_ok(6, delivery_tag, redelivered, exchange, routing_key, message_count) == expected


@pytest.mark.parametrize(
    "reply_code, reply_text", [(312, "NO_ROUTE"), (313, "NO_CONSUMERS"), (312, ""), (312, LONG_UTF8)]
)
@pytest.mark.parametrize("exchange, routing_key", [("", "missing"), ("amq.topic", "a.b"), ("é", LONG_UTF8)])
def test_encode_return_equals_pamqp_basic_return(reply_code, reply_text, exchange, routing_key):
    expected = marshal(
        commands.Basic.Return(reply_code=reply_code, reply_text=reply_text, routing_key=routing_key),
        2,
        exchange=exchange,
    )

    assert frames.encode_return(2, reply_code, reply_text, exchange, routing_key) == expected


CONSUMER_TAGS = ["", "ctag1.0", "amq.ctag-abc_DEF", "tag-é☃", LONG_UTF8, LONG_ASCII]


@pytest.mark.parametrize("consumer_tag", CONSUMER_TAGS)
@pytest.mark.parametrize("method_class", [commands.Basic.ConsumeOk, commands.Basic.CancelOk])
def test_encode_consumer_tag_method_equals_pamqp(method_class, consumer_tag):
    expected = pamqp_frame.marshal(method_class(consumer_tag=consumer_tag), 11)

    assert frames.encode_consumer_tag_method(11, method_class.index, consumer_tag) == expected


@pytest.mark.parametrize("consumer_tag", CONSUMER_TAGS)
@pytest.mark.parametrize("channel", [1, 65535])
def test_encode_cancel_equals_pamqp_basic_cancel_with_nowait(channel, consumer_tag):
    expected = pamqp_frame.marshal(commands.Basic.Cancel(consumer_tag=consumer_tag, nowait=True), channel)

    assert frames.encode_cancel(channel, consumer_tag) == expected
