"""Bytes on the wire for the fuzzer: AMQP 0-9-1 and native frames built by hand,
and blocking loopback sockets whose every wait has a deadline.

The encoders take any value, so that a generator can write what a correct
client never would (a table nested 60 deep, a long string declaring 2**31
bytes, a priority of 300 in a native envelope). L{Session} is one socket to
the broker; L{ReplyScanner} reads the close reasons out of whatever the broker
sent back, in either protocol.
"""

import decimal
import selectors
import socket
import struct
import time

from brokerd.proto import messages_pb2
from brokerd.proto.native_pb2 import Envelope

HOST = "127.0.0.1"  # the fuzzer only ever talks to a broker on loopback
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
NATIVE_PROTOCOL_VERSION = 1
RECEIVE_SIZE = 262144

# AMQP method ids (class, method) used by the corpus, the canary and the scanner.
CONNECTION_START, CONNECTION_START_OK = (10, 10), (10, 11)
CONNECTION_TUNE, CONNECTION_TUNE_OK = (10, 30), (10, 31)
CONNECTION_OPEN, CONNECTION_OPEN_OK = (10, 40), (10, 41)
CONNECTION_CLOSE, CONNECTION_CLOSE_OK = (10, 50), (10, 51)
CHANNEL_OPEN, CHANNEL_OPEN_OK = (20, 10), (20, 11)
CHANNEL_CLOSE, CHANNEL_CLOSE_OK = (20, 40), (20, 41)
EXCHANGE_DECLARE, EXCHANGE_DELETE = (40, 10), (40, 20)
QUEUE_DECLARE, QUEUE_DECLARE_OK, QUEUE_BIND = (50, 10), (50, 11), (50, 20)
QUEUE_PURGE, QUEUE_DELETE = (50, 30), (50, 40)
BASIC_QOS, BASIC_CONSUME, BASIC_CANCEL, BASIC_PUBLISH = (60, 10), (60, 20), (60, 30), (60, 40)
BASIC_DELIVER, BASIC_GET, BASIC_GET_OK, BASIC_GET_EMPTY = (60, 60), (60, 70), (60, 71), (60, 72)
BASIC_ACK, BASIC_REJECT, BASIC_RECOVER, BASIC_NACK = (60, 80), (60, 90), (60, 110), (60, 120)
CONFIRM_SELECT, CONFIRM_SELECT_OK = (85, 10), (85, 11)
TX_SELECT, TX_COMMIT, TX_ROLLBACK = (90, 10), (90, 20), (90, 30)


# -- AMQP encoding


class Raw(bytes):
    """An already encoded field value (type tag and payload), written as is."""


def octet(value):
    return struct.pack(">B", value & 0xFF)


def short(value):
    return struct.pack(">H", value & 0xFFFF)


def long_(value):
    return struct.pack(">I", value & 0xFFFFFFFF)


def longlong(value):
    return struct.pack(">Q", value & 0xFFFFFFFFFFFFFFFF)


def shortstr(text):
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    return octet(len(data)) + data[:255]


def longstr(data):
    data = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    return long_(len(data)) + data


def bits(*flags):
    return octet(sum(1 << index for index, flag in enumerate(flags) if flag))


def field_value(value):
    """One typed field value: Raw as is, else the tag a Python value maps to."""
    if isinstance(value, Raw):
        return bytes(value)
    if value is None:
        return b"V"
    if isinstance(value, bool):
        return b"t" + octet(value)
    if isinstance(value, int):
        return b"l" + struct.pack(">q", max(-(2**63), min(2**63 - 1, value)))
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return b"D" + octet(-exponent) + struct.pack(">i", unscaled)
    if isinstance(value, str):
        return b"S" + longstr(value)
    if isinstance(value, (bytes, bytearray)):
        return b"x" + longstr(value)
    if isinstance(value, dict):
        return b"F" + table(value)
    if isinstance(value, (list, tuple)):
        encoded = b"".join(field_value(item) for item in value)
        return b"A" + long_(len(encoded)) + encoded
    raise TypeError(f"no AMQP field type for {type(value).__name__}")


def table(values):
    """An AMQP field table (4-byte length, then name/value pairs); names may be any bytes."""
    encoded = b"".join(shortstr(name) + field_value(value) for name, value in (values or {}).items())
    return long_(len(encoded)) + encoded


def amqp_frame(frame_type, channel, payload):
    return struct.pack(">BHI", frame_type, channel & 0xFFFF, len(payload)) + payload + bytes((FRAME_END,))


def method(channel, method_id, arguments=b""):
    return amqp_frame(FRAME_METHOD, channel, struct.pack(">HH", *method_id) + arguments)


PROPERTY_FLAGS = {  # name -> (flag bit, encoder)
    "content_type": (0x8000, shortstr),
    "content_encoding": (0x4000, shortstr),
    "headers": (0x2000, table),
    "delivery_mode": (0x1000, octet),
    "priority": (0x0800, octet),
    "correlation_id": (0x0400, shortstr),
    "reply_to": (0x0200, shortstr),
    "expiration": (0x0100, shortstr),
    "message_id": (0x0080, shortstr),
    "timestamp": (0x0040, longlong),
    "type": (0x0020, shortstr),
    "user_id": (0x0010, shortstr),
    "app_id": (0x0008, shortstr),
}


def content_header(channel, body_size, properties=None):
    flags, encoded = 0, b""
    for name, (flag, encode) in PROPERTY_FLAGS.items():
        if properties and name in properties:
            flags |= flag
            encoded += encode(properties[name])
    return amqp_frame(FRAME_HEADER, channel, struct.pack(">HHQH", 60, 0, body_size, flags) + encoded)


def publish_method(channel, routing_key, exchange=""):
    """basic.publish alone, without its content."""
    return method(channel, BASIC_PUBLISH, short(0) + shortstr(exchange) + shortstr(routing_key) + bits())


def publish(channel, routing_key, body, properties=None, exchange="", frame_max=4096):
    """basic.publish with its content header and body frames."""
    frames = [publish_method(channel, routing_key, exchange)]
    frames.append(content_header(channel, len(body), properties))
    largest = frame_max - 8
    frames += [amqp_frame(FRAME_BODY, channel, body[at : at + largest]) for at in range(0, len(body), largest)]
    return frames


def start_ok(response=b"\0guest\0guest", mechanism="PLAIN", client_properties=None, locale="en_US"):
    properties = {"product": "brokerd fuzz"} if client_properties is None else client_properties
    arguments = (client_properties if isinstance(client_properties, bytes) else table(properties))
    return method(0, CONNECTION_START_OK, arguments + shortstr(mechanism) + longstr(response) + shortstr(locale))


def tune_ok(channel_max=0, frame_max=131072, heartbeat=0):
    return method(0, CONNECTION_TUNE_OK, short(channel_max) + long_(frame_max) + short(heartbeat))


def connection_open(vhost="/"):
    return method(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + bits())


def channel_open(channel):
    return method(channel, CHANNEL_OPEN, shortstr(""))


def queue_declare(channel, name, durable=False, arguments=None, passive=False, exclusive=False, auto_delete=False):
    flags = bits(passive, durable, exclusive, auto_delete, False)
    return method(channel, QUEUE_DECLARE, short(0) + shortstr(name) + flags + table(arguments))


def basic_get(channel, queue, no_ack=False):
    return method(channel, BASIC_GET, short(0) + shortstr(queue) + bits(no_ack))


def basic_ack(channel, delivery_tag, multiple=False):
    return method(channel, BASIC_ACK, longlong(delivery_tag) + bits(multiple))


def connection_close(code=200, text="bye"):
    return method(0, CONNECTION_CLOSE, short(code) + shortstr(text) + short(0) + short(0))


# -- native encoding


def native_frame(envelope):
    data = envelope if isinstance(envelope, (bytes, bytearray)) else envelope.SerializeToString()
    return struct.pack(">I", len(data)) + data


def envelope(kind, channel=0, correlation_id=0, **fields):
    """
    An Envelope with payload C{kind}. Message fields may be given as dicts,
    filled in place (a FieldTable from a dict of Python values, any depth),
    or as messages to copy.
    """
    result = Envelope(channel=channel, correlation_id=correlation_id)
    payload = getattr(result, kind)
    payload.SetInParent()
    fill(payload, fields)
    return result


def fill(message, fields):
    """Set C{fields} on C{message} in place (protobuf copies of deep messages would hit its parse depth limit)."""
    if message.DESCRIPTOR.full_name == "brokerd.FieldTable":
        fill_table(message, fields)
        return
    for name, value in fields.items():
        if isinstance(value, dict):
            target = getattr(message, name)
            target.SetInParent()
            fill(target, value)
        elif hasattr(value, "CopyFrom"):
            getattr(message, name).CopyFrom(value)
        else:
            setattr(message, name, value)


def native_hello(client_name="fuzz"):
    """A hello logging in as guest, whom a broker on loopback admits with its first start's defaults."""
    return envelope("hello", protocol_version=NATIVE_PROTOCOL_VERSION, client_name=client_name, username="guest",
                    password="guest")


def fill_table(target, values):
    """Fill FieldTable C{target} from Python values, with no depth or range checks."""
    for name, value in values.items():
        field = target.fields.add()
        field.name = name
        _native_value(field.value, value)
    return target


def _native_value(target, value):
    if isinstance(value, messages_pb2.FieldValue):
        target.CopyFrom(value)
    elif value is None:
        target.void_value.SetInParent()
    elif isinstance(value, bool):
        target.boolean_value = value
    elif isinstance(value, int):
        target.integer_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bytes):
        target.bytes_value = value
    elif isinstance(value, dict):
        target.table_value.SetInParent()
        fill_table(target.table_value, value)
    else:
        target.array_value.SetInParent()
        for item in value:
            _native_value(target.array_value.values.add(), item)


# -- sockets


class Session:
    """One blocking loopback socket to the broker; every read waits until a deadline at most."""

    def __init__(self, port, timeout=1.0):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.closed_by_peer = False
        self.received = 0

    def close(self):
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()

    def fill(self, deadline):
        """Wait for more bytes until C{deadline}; False at the deadline or when the broker closed."""
        if self.closed_by_peer:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(RECEIVE_SIZE)
        except (TimeoutError, socket.timeout):
            return False
        except OSError:
            data = b""
        if not data:
            self.closed_by_peer = True
            return False
        self.received += len(data)
        self.buffer += data
        return True

    def converse(self, chunks, send_seconds, quiet_seconds, cap_seconds, read_while_sending=True):
        """
        Send C{chunks} while reading what comes back (unless told not to), then
        read on until the broker closes, stays quiet for C{quiet_seconds}, or
        C{cap_seconds} have passed since the start. Returns the bytes received
        (the first MiB of them). A broker that stops reading only costs C{send_seconds}.
        """
        self.sock.setblocking(False)
        start = time.monotonic()
        send_deadline, cap = start + send_seconds, start + cap_seconds
        pending = [memoryview(chunk) for chunk in chunks if chunk]
        received = bytearray()
        selector = selectors.DefaultSelector()
        reading = selectors.EVENT_READ if read_while_sending or not pending else 0
        selector.register(self.sock, reading | (selectors.EVENT_WRITE if pending else 0))
        last_heard = time.monotonic()
        try:
            while not self.closed_by_peer:
                now = time.monotonic()
                if pending and now >= send_deadline:
                    pending = []
                    selector.modify(self.sock, selectors.EVENT_READ)
                    last_heard = now
                if now >= cap or (not pending and now - last_heard >= quiet_seconds):
                    break
                wait = min(cap, send_deadline if pending else last_heard + quiet_seconds) - now
                for _, mask in selector.select(max(wait, 0.001)):
                    if mask & selectors.EVENT_READ:
                        try:
                            data = self.sock.recv(RECEIVE_SIZE)
                        except BlockingIOError:
                            data = None
                        except OSError:
                            data = b""
                        if data == b"":
                            self.closed_by_peer = True
                        elif data:
                            self.received += len(data)
                            last_heard = time.monotonic()
                            if len(received) < 1 << 20:
                                received += data
                    if mask & selectors.EVENT_WRITE and pending:
                        try:
                            sent = self.sock.send(pending[0])
                        except BlockingIOError:
                            sent = 0
                        except OSError:
                            pending = []
                            self.closed_by_peer = True
                            break
                        pending[0] = pending[0][sent:]
                        if not len(pending[0]):
                            pending.pop(0)
                        if not pending:
                            selector.modify(self.sock, selectors.EVENT_READ)
                            last_heard = time.monotonic()
        finally:
            selector.close()
            self.sock.setblocking(True)
        return bytes(received)


class ReplyScanner:
    """The close reasons (reply code and text) found in bytes the broker sent, in either protocol."""

    @staticmethod
    def amqp(data):
        closes, offset = [], 0
        if data.startswith(b"AMQP"):
            return [(0, "protocol header: the broker refused the protocol header")]
        while len(data) - offset >= 8:
            frame_type, _, length = struct.unpack_from(">BHI", data, offset)
            payload = data[offset + 7 : offset + 7 + length]
            offset += 8 + length
            if frame_type == FRAME_METHOD and len(payload) >= 7:
                method_id = struct.unpack_from(">HH", payload)
                if method_id in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                    code = struct.unpack_from(">H", payload, 4)[0]
                    text = payload[7 : 7 + payload[6]].decode("utf-8", "replace")
                    closes.append((code, text))
        return closes

    @staticmethod
    def native(data):
        closes, offset = [], 0
        while len(data) - offset >= 4:
            (length,) = struct.unpack_from(">I", data, offset)
            frame = data[offset + 4 : offset + 4 + length]
            offset += 4 + length
            if len(frame) < length:
                break
            parsed = Envelope()
            try:
                parsed.ParseFromString(frame)
            except Exception:
                closes.append((0, "unreadable envelope from the broker"))
                break
            kind = parsed.WhichOneof("payload")
            if kind in ("connection_close", "channel_close"):
                close = getattr(parsed, kind)
                closes.append((close.reply_code, close.reply_text))
        return closes
