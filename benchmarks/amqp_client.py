"""A pipelining AMQP 0-9-1 client on non-blocking sockets, for the benchmarks, the crash tests and the
cross-backend validation's workload.

It is meant to cost far less than the broker it drives: one selector for many
connections, many publishes per write, and the hot frames (basic.publish with
its content, confirms, basic.deliver with its content, basic.ack) packed and
unpacked with struct; pamqp handles the handshake and the rare methods.

A L{Connection} hands each whole delivery (L{Delivery}) to its C{on_delivery}
callback and each publisher confirm to C{on_confirm}, calls C{after_read} once
per socket read (where a consumer sends the acks of what it just read as one
multiple ack), and turns a closed or reset socket into L{BrokerGone}.
"""

import selectors
import socket
import struct
import time
from typing import NamedTuple

from pamqp import commands
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

STALL_SECONDS = 30.0  # no progress for this long fails the run
RECEIVE_SIZE = 1 << 20

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
CONTENT_TYPE, CONTENT_ENCODING, HEADERS, DELIVERY_MODE, PRIORITY = 0x8000, 0x4000, 0x2000, 0x1000, 0x0800
CORRELATION_ID, REPLY_TO, EXPIRATION, MESSAGE_ID, TIMESTAMP = 0x0400, 0x0200, 0x0100, 0x0080, 0x0040
SHORT_STRING_PROPERTIES = (CONTENT_TYPE, CONTENT_ENCODING)
TRANSIENT_PROPERTIES = struct.pack(">HB", DELIVERY_MODE, 1)  # property flags: delivery-mode present; mode 1
PERSISTENT_PROPERTIES = struct.pack(">HB", DELIVERY_MODE, 2)  # the same with mode 2: stored by durable backends


class BenchmarkError(Exception):
    """The broker did something a correct broker does not, or stopped making progress."""


class BrokerGone(BenchmarkError):
    """The broker closed or reset the connection (in a crash run: it was killed)."""


class Delivery(NamedTuple):
    """One whole basic.deliver: its channel, consumer tag, delivery tag, redelivered flag, the encoded
    content properties (flags first, as L{message_properties} reads them) and the body."""

    channel: int
    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    properties: bytes
    body: bytes


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
        METHOD_INDEX.pack(BASIC_PUBLISH) + b"\x00\x00" + short_string(exchange) + short_string(routing_key) + b"\x00",
    )
    header = frame(FRAME_HEADER, channel, CONTENT_HEAD.pack(60, 0, len(body)) + properties)
    largest = frame_max - 8
    bodies = [frame(FRAME_BODY, channel, body[at: at + largest]) for at in range(0, len(body), largest)]
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
                METHOD_INDEX.pack(BASIC_PUBLISH) + b"\x00\x00" + short_string(exchange) + short_string(routing_key)
                + b"\x00")
        size = len(body)
        if not size or size > self.largest:
            return publish_frames(self.channel, routing_key, body, properties, self.frame_max, exchange)
        pack = FRAME_START.pack
        return b"".join((method, pack(FRAME_HEADER, self.channel, CONTENT_HEAD.size + len(properties)),
                         CONTENT_HEAD.pack(60, 0, size), properties, _FRAME_END_BYTE,
                         pack(FRAME_BODY, self.channel, size), body, _FRAME_END_BYTE))


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
    """The frame of a basic.ack (C{multiple}), basic.nack (C{multiple}, C{requeue}) or basic.reject (C{requeue})."""
    if kind == BASIC_REJECT:
        bits = 1 if requeue else 0
    else:
        bits = (1 if multiple else 0) | (2 if requeue and kind == BASIC_NACK else 0)
    return (FRAME_START.pack(FRAME_METHOD, channel, 13) + METHOD_INDEX.pack(kind) + LONG_LONG.pack(delivery_tag)
            + bytes((bits, FRAME_END)))


class Connection:
    """
    One AMQP connection with one channel (more may be opened with L{open_channel}), driven by L{Loop}.

    Deliveries and confirms of any channel go to C{on_delivery(delivery)} and
    C{on_confirm(channel, delivery_tag, multiple, ack)}; every other method from
    the broker is decoded by pamqp and queued in C{replies} for L{rpc}. A
    connection.close or channel.close from the broker fails the run with its
    reply code and text.
    """

    CHANNEL = 1

    def __init__(self, loop, host, port, name, username="guest", password="guest", virtual_host="/",
                 product="brokerd benchmark client"):
        self.loop = loop
        self.name = name
        self.username, self.password, self.virtual_host, self.product = username, password, virtual_host, product
        try:
            self.sock = socket.create_connection((host, port))
        except OSError as error:
            raise BrokerGone(f"{name}: cannot connect to {host}:{port}: {error}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.pending = b""
        self.outgoing = []
        self.writing = False
        self.replies = []
        self.frame_max = 4096
        self.closed = False
        self.on_delivery = self.unexpected_delivery
        self.on_confirm = self.unexpected_confirm
        self.after_read = lambda: None
        self._contents = {}  # channel -> [consumer tag, delivery tag, redelivered, properties, body pieces, left]
        loop.register(self)

    def unexpected_delivery(self, delivery):
        raise BenchmarkError(f"{self.name}: delivery {delivery.delivery_tag} on channel {delivery.channel}"
                             f" with no consumer")

    def unexpected_confirm(self, channel, delivery_tag, *_):
        raise BenchmarkError(f"{self.name}: confirm {delivery_tag} on channel {channel} with no publisher")

    # -- the handshake and synchronous methods

    def open(self):
        self.write(pamqp_header.ProtocolHeader().marshal())
        start = self.expect(commands.Connection.Start)
        mechanisms = start.mechanisms.decode() if isinstance(start.mechanisms, bytes) else start.mechanisms
        if "PLAIN" not in mechanisms.split():
            raise BenchmarkError(f"{self.name}: the broker offers {mechanisms!r}, not PLAIN")
        properties = {
            "product": self.product,
            "connection_name": self.name,
            "capabilities": {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True},
        }
        self.send_method(
            commands.Connection.StartOk(client_properties=properties, mechanism="PLAIN",
                                        response=f"\0{self.username}\0{self.password}", locale="en_US"),
            channel=0,
        )
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max or 131072
        self.send_method(
            commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0), channel=0
        )
        self.rpc(commands.Connection.Open(virtual_host=self.virtual_host), commands.Connection.OpenOk, channel=0)
        self.open_channel(self.CHANNEL)

    def open_channel(self, channel):
        self.rpc(commands.Channel.Open(), commands.Channel.OpenOk, channel=channel)

    def close(self):
        if self.closed:
            return
        try:
            self.rpc(
                commands.Connection.Close(reply_code=200, reply_text="benchmark done", class_id=0, method_id=0),
                commands.Connection.CloseOk,
                channel=0,
            )
        finally:
            self.shut()

    def shut(self):
        if not self.closed:
            self.closed = True
            self.loop.unregister(self)
            self.sock.close()

    def send_method(self, method, channel=CHANNEL):
        self.write(pamqp_frame.marshal(method, channel))

    def rpc(self, method, reply_class, channel=CHANNEL):
        self.send_method(method, channel)
        return self.expect(reply_class)

    def expect(self, reply_class):
        self.loop.run_until(lambda: self.replies, lambda: f"{self.name}: waiting for {reply_class.name}")
        reply = self.replies.pop(0)
        if not isinstance(reply, reply_class):
            raise BenchmarkError(f"{self.name}: expected {reply_class.name}, got {reply!r}")
        return reply

    # -- the hot methods

    def publish(self, routing_key, body, channel=CHANNEL, properties=PERSISTENT_PROPERTIES, exchange=""):
        """Writes one basic.publish (no confirm bookkeeping: that is the caller's)."""
        self.write(publish_frames(channel, routing_key, body, properties, self.frame_max, exchange))

    def ack(self, delivery_tag, multiple=False, channel=CHANNEL):
        self.write(settle_frame(channel, delivery_tag, BASIC_ACK, multiple=multiple))

    def nack(self, delivery_tag, multiple=False, requeue=True, channel=CHANNEL):
        self.write(settle_frame(channel, delivery_tag, BASIC_NACK, multiple=multiple, requeue=requeue))

    def reject(self, delivery_tag, requeue=False, channel=CHANNEL):
        self.write(settle_frame(channel, delivery_tag, BASIC_REJECT, requeue=requeue))

    # -- writing

    def write(self, data):
        if self.closed:
            raise BrokerGone(f"{self.name}: the connection is closed")
        if not self.outgoing:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError as error:
                raise BrokerGone(f"{self.name}: {error}") from None
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
        self.outgoing.append(data)
        if not self.writing:
            self.writing = True
            self.loop.watch_writes(self, True)

    def on_writable(self):
        outgoing = self.outgoing
        while outgoing:
            data = outgoing[0]
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                return
            except OSError as error:
                raise BrokerGone(f"{self.name}: {error}") from None
            if sent < len(data):
                outgoing[0] = memoryview(data)[sent:]
                return
            outgoing.pop(0)
        self.writing = False
        self.loop.watch_writes(self, False)

    # -- reading

    def on_readable(self):
        try:
            data = self.sock.recv(RECEIVE_SIZE)
        except BlockingIOError:
            return
        except OSError as error:
            raise BrokerGone(f"{self.name}: {error}") from None
        if not data:
            raise BrokerGone(f"{self.name}: the broker closed the connection")
        if self.pending:
            data = self.pending + data
        offset = self._frames(data)
        self.pending = data[offset:] if offset < len(data) else b""
        self.after_read()

    def _frames(self, data):
        """Handles every whole frame in C{data}; returns the offset of the first incomplete one."""
        size = len(data)
        offset = 0
        contents = self._contents
        unpack_start = FRAME_START.unpack_from
        while size - offset >= 7:
            frame_type, channel, length = unpack_start(data, offset)
            start = offset + 7
            end = start + length
            if end >= size:
                break
            if data[end] != FRAME_END:
                raise BenchmarkError(f"{self.name}: frame end byte is {data[end]:#04x}, not 0xce")
            if frame_type == FRAME_BODY:
                content = contents.get(channel)
                if content is None or content[5] is None or content[5] < length:
                    raise BenchmarkError(f"{self.name}: unexpected body frame on channel {channel}")
                content[4].append(data[start:end])
                content[5] -= length
                if content[5] == 0:
                    self._complete(channel)
            elif frame_type == FRAME_METHOD:
                (index,) = METHOD_INDEX.unpack_from(data, start)
                if index == BASIC_DELIVER:
                    if channel in contents:
                        raise BenchmarkError(f"{self.name}: basic.deliver before the last content was complete")
                    tag_at = start + 5 + data[start + 4]
                    consumer_tag = data[start + 5: tag_at].decode("utf-8", "replace")
                    (delivery_tag,) = LONG_LONG.unpack_from(data, tag_at)
                    redelivered = bool(data[tag_at + 8] & 1)
                    whole = self._whole_content(data, end + 1, channel)
                    if whole is not None:  # the usual case: header and one body frame in this read
                        properties, body, offset = whole
                        self.on_delivery(Delivery(channel, consumer_tag, delivery_tag, redelivered, properties, body))
                        continue
                    contents[channel] = [consumer_tag, delivery_tag, redelivered, None, [], None]
                elif index == BASIC_ACK or index == BASIC_NACK:
                    delivery_tag, flags = CONFIRM_ARGUMENTS.unpack_from(data, start + 4)
                    self.on_confirm(channel, delivery_tag, bool(flags & 1), index == BASIC_ACK)
                else:
                    self._method(data[offset: end + 1])
            elif frame_type == FRAME_HEADER:
                content = contents.get(channel)
                if content is None or content[3] is not None:
                    raise BenchmarkError(f"{self.name}: unexpected content header on channel {channel}")
                (body_size,) = LONG_LONG.unpack_from(data, start + 4)
                content[3] = bytes(data[start + 12: end])
                content[5] = body_size
                if body_size == 0:
                    self._complete(channel)
            elif frame_type != FRAME_HEARTBEAT:
                raise BenchmarkError(f"{self.name}: unknown frame type {frame_type}")
            offset = end + 1
        return offset

    @staticmethod
    def _whole_content(data, at, channel):
        """
        C{(properties, body, offset after it)} when the frames at C{at} are a
        content header of C{channel} and, unless the body is empty, one body
        frame holding all of it, both complete in C{data}; otherwise None (the
        frames are then taken one at a time).
        """
        size = len(data)
        if size - at < 7 + 12:
            return None
        frame_type, header_channel, length = FRAME_START.unpack_from(data, at)
        header_end = at + 7 + length
        if frame_type != FRAME_HEADER or header_channel != channel or header_end >= size or length < 14 \
                or data[header_end] != FRAME_END:
            return None
        (body_size,) = LONG_LONG.unpack_from(data, at + 11)
        properties = data[at + 19: header_end]
        if body_size == 0:
            return properties, b"", header_end + 1
        body_at = header_end + 1
        if size - body_at < 7:
            return None
        frame_type, body_channel, length = FRAME_START.unpack_from(data, body_at)
        body_end = body_at + 7 + length
        if frame_type != FRAME_BODY or body_channel != channel or length != body_size or body_end >= size \
                or data[body_end] != FRAME_END:
            return None
        return properties, data[body_at + 7: body_end], body_end + 1

    def _complete(self, channel):
        consumer_tag, delivery_tag, redelivered, properties, pieces, _ = self._contents.pop(channel)
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self.on_delivery(Delivery(channel, consumer_tag, delivery_tag, redelivered, properties, body))

    def _method(self, encoded):
        _, channel, method = pamqp_frame.unmarshal(encoded)
        if isinstance(method, (commands.Connection.Close, commands.Channel.Close)):
            raise BenchmarkError(
                f"{self.name}: the broker sent {method.name} {method.reply_code} {method.reply_text!r}"
                f" (for class {method.class_id} method {method.method_id})"
            )
        if isinstance(method, (commands.Basic.Cancel, commands.Basic.Return)):
            raise BenchmarkError(f"{self.name}: the broker sent {method!r}")
        self.replies.append(method)


class Loop:
    """A selector over the connections; L{run_until} turns it until a condition holds."""

    def __init__(self):
        self.selector = selectors.DefaultSelector()

    def register(self, connection):
        self.selector.register(connection.sock, selectors.EVENT_READ, connection)

    def unregister(self, connection):
        self.selector.unregister(connection.sock)

    def watch_writes(self, connection, on):
        events = selectors.EVENT_READ | selectors.EVENT_WRITE if on else selectors.EVENT_READ
        self.selector.modify(connection.sock, events, connection)

    def turn(self, timeout):
        """Handles the I/O ready within C{timeout} seconds; whether there was any."""
        events = self.selector.select(timeout)
        for key, mask in events:
            connection = key.data
            if connection.closed:
                continue
            if mask & selectors.EVENT_WRITE:
                connection.on_writable()
            if mask & selectors.EVENT_READ:
                connection.on_readable()
        return bool(events)

    def run_until(self, done, what, progress=lambda: None):
        """
        Handles I/O until C{done()} is true. Fails, saying C{what()}, when
        C{progress()} has not changed for L{STALL_SECONDS}.
        """
        last_progress, last_change = progress(), time.monotonic()
        while not done():
            moved = self.turn(1.0)
            now = progress()
            if moved and now != last_progress:
                last_progress, last_change = now, time.monotonic()
            elif time.monotonic() - last_change > STALL_SECONDS:
                raise BenchmarkError(f"no progress for {STALL_SECONDS:.0f} s: {what()}")
