"""AMQP 0-9-1 frames: the layout, and struct-based fast paths for the hot methods.

Every frame is ``type(1) channel(2) size(4) payload(size) 0xCE``. The methods a
busy broker sees thousands of times a second (basic.publish and basic.ack in,
basic.deliver, basic.ack and content out) are packed and unpacked here with
precompiled structs; pamqp handles every other method, and the tests check the
fast paths byte for byte against pamqp's encoding.
"""

from struct import Struct

from pamqp import commands
from pamqp import frame as pamqp_frame

from brokerd.errors import FrameSyntaxError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_START_SIZE = 7  # type, channel, payload size
FRAME_OVERHEAD = 8  # the start plus the end byte
FRAME_MIN_SIZE = 4096  # the spec's smallest frame_max

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

BASIC_CLASS = 60


def method_index(class_id, method_id):
    """The 32-bit number that opens a method frame's payload."""
    return class_id << 16 | method_id


BASIC_PUBLISH = method_index(60, 40)
BASIC_ACK = method_index(60, 80)
TX_COMMIT = method_index(90, 20)

FRAME_START = Struct(">BHI")
METHOD_INDEX = Struct(">I")
_PUBLISH_FLAGS_AT = Struct(">B")
_ACK_ARGUMENTS = Struct(">QB")
_DELIVER_START = Struct(">BHIIB")  # frame start, method index, consumer tag length
DELIVERY_TAG = Struct(">Q?")  # a basic.deliver's delivery tag and redelivered flag
_CONFIRM_FRAME = Struct(">BHIIQBB")  # frame start, method index, delivery tag, flags, frame end
_CONTENT_HEADER_START = Struct(">BHIHHQ")  # frame start, class, weight, body size
_CONTENT_HEADER_FIXED = 12  # class, weight, body size


def short_reply_text(text):
    """
    A close's reply text as a short string: past 255 bytes, its first 252 and
    "...", as RabbitMQ's C{rabbit_channel} cuts it (here never inside a character).
    """
    raw = text.encode("utf-8")
    if len(raw) <= 255:
        return text
    return raw[:252].decode("utf-8", "ignore") + "..."


def method_frame(channel, method):
    """Any method frame, encoded by pamqp."""
    return pamqp_frame.marshal(method, channel)


def short_string(text):
    """An AMQP short string: a length octet and the UTF-8 bytes."""
    encoded = text.encode()
    if len(encoded) > 255:
        raise ValueError(
            f"short string of {len(encoded)} bytes is longer than 255: {text[:40]!r}..."
        )
    return bytes((len(encoded),)) + encoded


def _read_short_string(data, offset, what):
    length = data[offset]
    end = offset + 1 + length
    try:
        return str(data[offset + 1 : end], "utf-8"), end
    except UnicodeDecodeError:
        raise FrameSyntaxError(f"basic.publish {what} is not valid UTF-8") from None


def decode_publish(data, start, end):
    """
    The arguments of a basic.publish whose payload (after the method index)
    is C{data[start:end]}.

    @return: C{(exchange, routing_key, mandatory, immediate)}
    """
    try:
        exchange, offset = _read_short_string(data, start + 2, "exchange")  # skip the ticket
        routing_key, offset = _read_short_string(data, offset, "routing key")
        if offset >= end:
            raise IndexError
        flags = data[offset]
    except IndexError:
        raise FrameSyntaxError(
            f"basic.publish arguments of {end - start} bytes are truncated"
        ) from None
    return exchange, routing_key, bool(flags & 1), bool(flags & 2)


def decode_ack(data, start, end):
    """The C{(delivery_tag, multiple)} of a basic.ack whose arguments start at C{start}."""
    if end - start < _ACK_ARGUMENTS.size:
        raise FrameSyntaxError(f"basic.ack arguments of {end - start} bytes are truncated")
    delivery_tag, flags = _ACK_ARGUMENTS.unpack_from(data, start)
    return delivery_tag, bool(flags & 1)


def deliver_frame_around(channel, consumer_tag, exchange, routing_key):
    """
    The bytes of a basic.deliver method frame before and after its delivery tag
    and redelivered flag (packed by L{DELIVERY_TAG}), which are all that changes
    from one delivery to the next of a consumer's messages alike. C{consumer_tag},
    C{exchange} and C{routing_key} are already UTF-8 bytes (each at most 255 long).
    """
    size = 4 + 1 + len(consumer_tag) + 8 + 1 + 1 + len(exchange) + 1 + len(routing_key)
    before = _DELIVER_START.pack(FRAME_METHOD, channel, size, 0x003C003C, len(consumer_tag))
    after = b"".join(
        (bytes((len(exchange),)), exchange, bytes((len(routing_key),)), routing_key, FRAME_END_BYTE)
    )
    return before + consumer_tag, after


def encode_confirm(channel, delivery_tag, multiple, ack):
    """A basic.ack (or basic.nack without requeue) from the broker, for publisher confirms."""
    if ack:
        return _CONFIRM_FRAME.pack(
            FRAME_METHOD, channel, 13, BASIC_ACK, delivery_tag, 1 if multiple else 0, FRAME_END
        )
    return _CONFIRM_FRAME.pack(
        FRAME_METHOD, channel, 13, method_index(60, 120), delivery_tag, 1 if multiple else 0,
        FRAME_END,
    )


def content_frames(channel, encoded_properties, body, frame_max):
    """
    The content header frame and the body frames for one message, as a list
    of byte strings to write in order. Bodies longer than a frame allows are
    split into C{frame_max}-sized frames as memoryview slices (no copy here).
    """
    body_size = len(body)
    pieces = [
        _CONTENT_HEADER_START.pack(
            FRAME_HEADER, channel, _CONTENT_HEADER_FIXED + len(encoded_properties), BASIC_CLASS, 0,
            body_size,
        ),
        encoded_properties,
        FRAME_END_BYTE,
    ]
    if not body_size:
        return pieces
    largest = frame_max - FRAME_OVERHEAD
    if body_size <= largest:
        pieces.append(FRAME_START.pack(FRAME_BODY, channel, body_size))
        pieces.append(body)
        pieces.append(FRAME_END_BYTE)
        return pieces
    view = memoryview(body)
    for offset in range(0, body_size, largest):
        part = view[offset : offset + largest]
        pieces.append(FRAME_START.pack(FRAME_BODY, channel, len(part)))
        pieces.append(part)
        pieces.append(FRAME_END_BYTE)
    return pieces


def decode_content_header(data, start, end):
    """
    The C{(class_id, body_size, properties_start)} of a content header frame
    whose payload is C{data[start:end]}; the encoded properties run from
    C{properties_start} to C{end}.
    """
    if end - start < _CONTENT_HEADER_FIXED + 2:
        raise FrameSyntaxError(f"content header of {end - start} bytes is truncated")
    class_id, _weight, body_size = _CONTENT_HEADER_FIELDS.unpack_from(data, start)
    return class_id, body_size, start + _CONTENT_HEADER_FIXED


_CONTENT_HEADER_FIELDS = Struct(">HHQ")


def _method(channel, index, arguments):
    payload_size = 4 + len(arguments)
    return b"".join((
        FRAME_START.pack(FRAME_METHOD, channel, payload_size), METHOD_INDEX.pack(index), arguments,
        FRAME_END_BYTE,
    ))


_SHORT = Struct(">H")
_LONG = Struct(">I")
_LONG_LONG = Struct(">Q")


def encode_declare_ok(channel, queue, message_count, consumer_count):
    """queue.declare-ok; by hand because pamqp refuses queue names RabbitMQ allows."""
    return _method(
        channel,
        method_index(50, 11),
        short_string(queue) + _LONG.pack(message_count) + _LONG.pack(consumer_count),
    )


def encode_get_ok(channel, delivery_tag, redelivered, exchange, routing_key, message_count):
    """basic.get-ok (content frames follow)."""
    return _method(
        channel,
        method_index(60, 71),
        b"".join(
            (
                _LONG_LONG.pack(delivery_tag),
                b"\x01" if redelivered else b"\x00",
                short_string(exchange),
                short_string(routing_key),
                _LONG.pack(message_count),
            )
        ),
    )


def encode_return(channel, reply_code, reply_text, exchange, routing_key):
    """basic.return (content frames follow)."""
    return _method(
        channel,
        method_index(60, 50),
        _SHORT.pack(reply_code) + short_string(reply_text) + short_string(exchange)
        + short_string(routing_key),
    )


def encode_consumer_tag_method(channel, index, consumer_tag):
    """basic.consume-ok or basic.cancel-ok: a method whose only argument is a consumer tag."""
    return _method(channel, index, short_string(consumer_tag))


def encode_cancel(channel, consumer_tag):
    """A broker-sent basic.cancel (consumer_cancel_notify), nowait set as RabbitMQ sends it."""
    return _method(channel, method_index(60, 30), short_string(consumer_tag) + b"\x01")


def method_name(index):
    """A method's AMQP name (\"basic.publish\" style as pamqp spells it) for error texts."""
    method_class = commands.INDEX_MAPPING.get(index)
    return method_class.name if method_class is not None else f"{index >> 16}.{index & 0xFFFF}"
