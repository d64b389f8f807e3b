"""A pipelining AMQP 0-9-1 client on non-blocking sockets, for the throughput benchmark.

It is meant to cost far less than the broker it measures: one selector, many
publishes per write, and the hot frames (basic.publish with its content,
confirms, basic.deliver with its content, basic.ack) packed and unpacked with
struct; pamqp handles the handshake and the rare methods.
"""

import selectors
import socket
import struct
import time

from pamqp import commands
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

BASIC_DELIVER = 60 << 16 | 60
BASIC_ACK = 60 << 16 | 80
BASIC_NACK = 60 << 16 | 120
BASIC_PUBLISH = 60 << 16 | 40

TRANSIENT_PROPERTIES = struct.pack(">HB", 0x1000, 1)  # property flags: delivery-mode present; mode 1
PERSISTENT_PROPERTIES = struct.pack(">HB", 0x1000, 2)  # the same with mode 2: stored by durable backends


class BenchmarkError(Exception):
    """The broker did something a correct broker does not, or stopped making progress."""


def frame(frame_type, channel, payload):
    return FRAME_START.pack(frame_type, channel, len(payload)) + payload + bytes((FRAME_END,))


def short_string(text):
    encoded = text.encode()
    return bytes((len(encoded),)) + encoded


def publish_block(channel, routing_key, size, frame_max, properties=TRANSIENT_PROPERTIES):
    """
    The frames of one basic.publish to the default exchange with a C{size}-byte
    body and the encoded content C{properties}, and where in them the message
    number goes.

    @return: C{(block, number_offset)}
    """
    method = frame(
        FRAME_METHOD,
        channel,
        METHOD_INDEX.pack(BASIC_PUBLISH) + b"\x00\x00" + short_string("") + short_string(routing_key) + b"\x00",
    )
    header = frame(FRAME_HEADER, channel, struct.pack(">HHQ", 60, 0, size) + properties)
    largest = frame_max - 8
    body = bytes(size)
    bodies = b"".join(frame(FRAME_BODY, channel, body[at : at + largest]) for at in range(0, size, largest))
    return method + header + bodies, len(method) + len(header) + FRAME_START.size


class Connection:
    """
    One AMQP connection with one channel, driven by L{Loop}.

    Confirms and deliveries go to C{publisher} and C{consumer}; every other
    method from the broker is decoded by pamqp and queued in C{replies} for
    L{rpc}. A connection.close or channel.close from the broker fails the run.
    """

    CHANNEL = 1

    def __init__(self, loop, host, port, name):
        self.loop = loop
        self.name = name
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.pending = b""
        self.outgoing = []
        self.writing = False
        self.replies = []
        self.publisher = None
        self.consumer = None
        self.frame_max = 4096
        self.closed = False
        # Content assembly for deliveries.
        self._delivery_tag = 0
        self._body_left = 0
        self._first_body_frame = False
        loop.register(self)

    # -- the handshake and synchronous methods

    def open(self):
        self.write(pamqp_header.ProtocolHeader().marshal())
        start = self.expect(commands.Connection.Start)
        mechanisms = start.mechanisms.decode() if isinstance(start.mechanisms, bytes) else start.mechanisms
        if "PLAIN" not in mechanisms.split():
            raise BenchmarkError(f"{self.name}: the broker offers {mechanisms!r}, not PLAIN")
        properties = {
            "product": "brokerd amqp_throughput benchmark",
            "connection_name": self.name,
            "capabilities": {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True},
        }
        self.send_method(
            commands.Connection.StartOk(
                client_properties=properties, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
            ),
            channel=0,
        )
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max or 131072
        self.send_method(
            commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0), channel=0
        )
        self.rpc(commands.Connection.Open(virtual_host="/"), commands.Connection.OpenOk, channel=0)
        self.rpc(commands.Channel.Open(), commands.Channel.OpenOk)

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

    # -- writing

    def write(self, data):
        if not self.outgoing:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
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
            if sent < len(data):
                outgoing[0] = memoryview(data)[sent:]
                return
            outgoing.pop(0)
        self.writing = False
        self.loop.watch_writes(self, False)

    # -- reading

    def on_readable(self):
        data = self.sock.recv(RECEIVE_SIZE)
        if not data:
            raise BenchmarkError(f"{self.name}: the broker closed the connection")
        if self.pending:
            data = self.pending + data
        offset = self._frames(data)
        self.pending = data[offset:] if offset < len(data) else b""

    def _frames(self, data):
        """Handles every whole frame in C{data}; returns the offset of the first incomplete one."""
        size = len(data)
        offset = 0
        unpack_start = FRAME_START.unpack_from
        unpack_index = METHOD_INDEX.unpack_from
        while size - offset >= 7:
            frame_type, channel, length = unpack_start(data, offset)
            start = offset + 7
            end = start + length
            if end >= size:
                break
            if data[end] != FRAME_END:
                raise BenchmarkError(f"{self.name}: frame end byte is {data[end]:#04x}, not 0xce")
            if frame_type == FRAME_BODY:
                if self._first_body_frame:
                    self._first_body_frame = False
                    number = int.from_bytes(data[start : start + 8], "big")
                else:
                    number = None
                self._body_left -= length
                if self._body_left < 0:
                    raise BenchmarkError(f"{self.name}: content body longer than its header announced")
                if number is not None:
                    self._delivered(number)
            elif frame_type == FRAME_METHOD:
                (index,) = unpack_index(data, start)
                if index == BASIC_DELIVER:
                    if self._body_left:
                        raise BenchmarkError(f"{self.name}: basic.deliver before the last body was complete")
                    tag_end = start + 5 + data[start + 4]
                    (self._delivery_tag,) = LONG_LONG.unpack_from(data, tag_end)
                elif index == BASIC_ACK or index == BASIC_NACK:
                    delivery_tag, flags = CONFIRM_ARGUMENTS.unpack_from(data, start + 4)
                    if index == BASIC_NACK:
                        raise BenchmarkError(f"{self.name}: the broker nacked publish {delivery_tag}")
                    if self.publisher is None:
                        raise BenchmarkError(f"{self.name}: confirm {delivery_tag} with no publisher running")
                    self.publisher.confirmed_up_to(delivery_tag, flags & 1)
                else:
                    self._method(data[offset : end + 1])
            elif frame_type == FRAME_HEADER:
                (body_size,) = LONG_LONG.unpack_from(data, start + 4)
                if self.consumer is None or body_size != self.consumer.size:
                    raise BenchmarkError(f"{self.name}: unexpected content header, body size {body_size}")
                self._body_left = body_size
                self._first_body_frame = True
            elif frame_type != FRAME_HEARTBEAT:
                raise BenchmarkError(f"{self.name}: unknown frame type {frame_type}")
            offset = end + 1
        return offset

    def _delivered(self, number):
        consumer = self.consumer
        if consumer is None:
            raise BenchmarkError(f"{self.name}: delivery of message {number} with no consumer running")
        consumer.delivered(self._delivery_tag, number)

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

    def run_until(self, done, what, progress=lambda: None):
        """
        Handles I/O until C{done()} is true. Fails, saying C{what()}, when
        C{progress()} has not changed for L{STALL_SECONDS}.
        """
        select = self.selector.select
        last_progress, last_change = progress(), time.monotonic()
        while not done():
            events = select(1.0)
            for key, mask in events:
                connection = key.data
                if mask & selectors.EVENT_WRITE:
                    connection.on_writable()
                if mask & selectors.EVENT_READ:
                    connection.on_readable()
            now = progress()
            if events and now != last_progress:
                last_progress, last_change = now, time.monotonic()
            elif time.monotonic() - last_change > STALL_SECONDS:
                raise BenchmarkError(f"no progress for {STALL_SECONDS:.0f} s: {what()}")
