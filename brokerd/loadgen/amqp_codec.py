"""The AMQP 0-9-1 frames and content properties the pipelining client
(L{brokerd.loadgen.amqp_client}) packs and reads itself, with struct:
basic.publish with its content, basic.deliver, confirms and settlements, and
the message-id and headers of content properties; pamqp does the rest."""

import struct

from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_START = struct.Struct(">BHI")
METHOD_INDEX = struct.Struct(">I")
LONG_LONG = struct.Struct(">Q")
CONFIRM_ARGUMENTS = struct.Struct(">QB")  # delivery tag, multiple
CONTENT_HEAD = struct.Struct(">HHQ")  # class id, weight, body size

BASIC_PUBLISH = 60 << 16 | 40
BASIC_DELIVER = 60 << 16 | 60
BASIC_ACK = 60 << 16 | 80
BASIC_REJECT = 60 << 16 | 90
BASIC_NACK = 60 << 16 | 120

# Property flags of basic content headers, in the order their values follow the flags.
CONTENT_TYPE, CONTENT_ENCODING, HEADERS = 0x8000, 0x4000, 0x2000
DELIVERY_MODE, PRIORITY = 0x1000, 0x0800
CORRELATION_ID, REPLY_TO, EXPIRATION, MESSAGE_ID, TIMESTAMP = 0x0400, 0x0200, 0x0100, 0x0080, 0x0040
SHORT_STRING_PROPERTIES = (CONTENT_TYPE, CONTENT_ENCODING)
# Property flags: delivery-mode present; mode 1.
TRANSIENT_PROPERTIES = struct.pack(">HB", DELIVERY_MODE, 1)
# The same with mode 2: stored by durable backends.
PERSISTENT_PROPERTIES = struct.pack(">HB", DELIVERY_MODE, 2)


class BenchmarkError(Exception):
    """The broker did something a correct broker does not, or stopped making progress."""


def frame(frame_type, channel, payload):
    return FRAME_START.pack(frame_type, channel, len(payload)) + payload + bytes((FRAME_END,))


def short_string(text):
    encoded = text.encode()
    if len(encoded) > 255:
        raise ValueError(f"{text[:40]!r}... is longer than a short string's 255 bytes")
    return bytes((len(encoded),)) + encoded


def encode_properties(delivery_mode=None, priority=None, message_id=None, headers=None):
    """The content properties of a publish (flags, then values), for L{publish_frames}."""
    flags, values = 0, []
    if headers:
        flags |= HEADERS
        values.append(pamqp_encode.field_table(headers))
    if delivery_mode is not None:
        flags |= DELIVERY_MODE
        values.append(bytes((delivery_mode,)))
    if priority is not None:
        flags |= PRIORITY
        values.append(bytes((priority,)))
    if message_id is not None:
        flags |= MESSAGE_ID
        values.append(short_string(message_id))
    return struct.pack(">H", flags) + b"".join(values)


def message_properties(encoded):
    """
    C{(message_id, headers)} of encoded content properties: the message-id
    property (None when absent) and the headers table (an empty dict when
    absent). Walks the flags and skips the properties before those two.

    @raise BenchmarkError: the properties run past their end or use flag continuation.
    """
    try:
        (flags,) = struct.unpack_from(">H", encoded)
        if flags & 1:
            raise BenchmarkError("content properties with a continued flag word")
        at, headers = 2, {}
        for flag in SHORT_STRING_PROPERTIES:
            if flags & flag:
                at += 1 + encoded[at]
        if flags & HEADERS:
            used, headers = pamqp_decode.field_table(encoded[at:])
            at += used
        at += bool(flags & DELIVERY_MODE) + bool(flags & PRIORITY)
        for flag in (CORRELATION_ID, REPLY_TO, EXPIRATION):
            if flags & flag:
                at += 1 + encoded[at]
        if not flags & MESSAGE_ID:
            return None, headers
        length = encoded[at]
        if at + 1 + length > len(encoded):
            raise BenchmarkError("the message-id runs past the end of the content properties")
        return encoded[at + 1: at + 1 + length].decode("utf-8", "replace"), headers
    except (IndexError, struct.error, ValueError) as problem:
        raise BenchmarkError(f"content properties cut short: {problem}") from None


def publish_frames(channel, routing_key, body, properties, frame_max, exchange=""):
    """The frames of one basic.publish of C{body} with the encoded C{properties}."""
    method = frame(
        FRAME_METHOD,
        channel,
        METHOD_INDEX.pack(BASIC_PUBLISH) + b"\x00\x00" + short_string(exchange)
        + short_string(routing_key) + b"\x00",
    )
    header = frame(FRAME_HEADER, channel, CONTENT_HEAD.pack(60, 0, len(body)) + properties)
    largest = frame_max - 8
    bodies = [
        frame(FRAME_BODY, channel, body[at: at + largest]) for at in range(0, len(body), largest)
    ]
    return b"".join([method, header, *bodies])


class PublishFramer:
    """
    Frames publishes on one channel like L{publish_frames}, keeping the
    basic.publish method frame of each (exchange, routing key) it has seen: a
    workload publishes to a few routes many times, and a publish then costs
    a few packs and one join.
    """

    def __init__(self, channel, frame_max):
        self.channel = channel
        self.largest = frame_max - 8
        self.frame_max = frame_max
        self._methods = {}

    def frames(self, exchange, routing_key, body, properties):
        """The frames of one basic.publish of C{body} with the encoded C{properties}."""
        method = self._methods.get((exchange, routing_key))
        if method is None:
            method = self._methods[exchange, routing_key] = frame(
                FRAME_METHOD, self.channel,
                METHOD_INDEX.pack(BASIC_PUBLISH) + b"\x00\x00" + short_string(exchange)
                + short_string(routing_key) + b"\x00")
        size = len(body)
        if not size or size > self.largest:
            return publish_frames(
                self.channel, routing_key, body, properties, self.frame_max, exchange
            )
        pack = FRAME_START.pack
        return b"".join((
            method, pack(FRAME_HEADER, self.channel, CONTENT_HEAD.size + len(properties)),
            CONTENT_HEAD.pack(60, 0, size), properties, _FRAME_END_BYTE,
            pack(FRAME_BODY, self.channel, size), body, _FRAME_END_BYTE,
        ))


_FRAME_END_BYTE = bytes((FRAME_END,))


def publish_block(channel, routing_key, size, frame_max, properties=TRANSIENT_PROPERTIES):
    """
    The frames of one basic.publish to the default exchange with a C{size}-byte
    body and the encoded content C{properties}, and where in them the message
    number (the body's first 8 bytes) goes.

    @return: C{(block, number_offset)}
    """
    block = publish_frames(channel, routing_key, bytes(size), properties, frame_max)
    method_size = FRAME_START.size + 4 + 2 + 1 + 1 + len(routing_key.encode()) + 1 + 1
    header_size = FRAME_START.size + CONTENT_HEAD.size + len(properties) + 1
    return block, method_size + header_size + FRAME_START.size


def settle_frame(channel, delivery_tag, kind=BASIC_ACK, multiple=False, requeue=False):
    """
    The frame of a basic.ack (C{multiple}), basic.nack (C{multiple},
    C{requeue}) or basic.reject (C{requeue}).
    """
    if kind == BASIC_REJECT:
        bits = 1 if requeue else 0
    else:
        bits = (1 if multiple else 0) | (2 if requeue and kind == BASIC_NACK else 0)
    return (
        FRAME_START.pack(FRAME_METHOD, channel, 13) + METHOD_INDEX.pack(kind)
        + LONG_LONG.pack(delivery_tag) + bytes((bits, FRAME_END))
    )
