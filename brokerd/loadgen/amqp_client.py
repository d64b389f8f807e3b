"""A pipelining AMQP 0-9-1 client on non-blocking sockets, for the benchmarks,
the crash tests and the cross-backend validation's workload.

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
import time
from typing import NamedTuple

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from brokerd.loadgen.amqp_codec import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    BASIC_REJECT,
    CONFIRM_ARGUMENTS,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_START,
    LONG_LONG,
    METHOD_INDEX,
    PERSISTENT_PROPERTIES,
    BenchmarkError,
    publish_frames,
    settle_frame,
)

STALL_SECONDS = 30.0  # no progress for this long fails the run
RECEIVE_SIZE = 1 << 20



class BrokerGone(BenchmarkError):
    """The broker closed or reset the connection (in a crash run: it was killed)."""


class Delivery(NamedTuple):
    """One whole basic.deliver: its channel, consumer tag, delivery tag, redelivered flag,
    the encoded content properties (flags first, as L{message_properties} reads them) and
    the body."""

    channel: int
    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    properties: bytes
    body: bytes


class Connection:
    """
    One AMQP connection with one channel (more may be opened with
    L{open_channel}), driven by L{Loop}.

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
        self.username, self.password = username, password
        self.virtual_host, self.product = virtual_host, product
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
        # channel -> [consumer tag, delivery tag, redelivered, properties, body pieces, left]
        self._contents = {}
        loop.register(self)

    def unexpected_delivery(self, delivery):
        raise BenchmarkError(
            f"{self.name}: delivery {delivery.delivery_tag} on channel {delivery.channel}"
            f" with no consumer"
        )

    def unexpected_confirm(self, channel, delivery_tag, *_):
        raise BenchmarkError(
            f"{self.name}: confirm {delivery_tag} on channel {channel} with no publisher"
        )

    # -- the handshake and synchronous methods

    def open(self):
        self.write(pamqp_header.ProtocolHeader().marshal())
        start = self.expect(commands.Connection.Start)
        mechanisms = start.mechanisms
        if isinstance(mechanisms, bytes):
            mechanisms = mechanisms.decode()
        if "PLAIN" not in mechanisms.split():
            raise BenchmarkError(f"{self.name}: the broker offers {mechanisms!r}, not PLAIN")
        properties = {
            "product": self.product,
            "connection_name": self.name,
            "capabilities": {
                "publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
            },
        }
        self.send_method(
            commands.Connection.StartOk(
                client_properties=properties, mechanism="PLAIN",
                response=f"\0{self.username}\0{self.password}", locale="en_US",
            ),
            channel=0,
        )
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max or 131072
        self.send_method(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0
            ),
            channel=0,
        )
        self.rpc(
            commands.Connection.Open(virtual_host=self.virtual_host), commands.Connection.OpenOk,
            channel=0,
        )
        self.open_channel(self.CHANNEL)

    def open_channel(self, channel):
        self.rpc(commands.Channel.Open(), commands.Channel.OpenOk, channel=channel)

    def close(self):
        if self.closed:
            return
        try:
            self.rpc(
                commands.Connection.Close(
                    reply_code=200, reply_text="benchmark done", class_id=0, method_id=0
                ),
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
        self.loop.run_until(
            lambda: self.replies, lambda: f"{self.name}: waiting for {reply_class.name}"
        )
        reply = self.replies.pop(0)
        if not isinstance(reply, reply_class):
            raise BenchmarkError(f"{self.name}: expected {reply_class.name}, got {reply!r}")
        return reply

    # -- the hot methods

    def publish(
        self, routing_key, body, channel=CHANNEL, properties=PERSISTENT_PROPERTIES, exchange=""
    ):
        """Writes one basic.publish (no confirm bookkeeping: that is the caller's)."""
        self.write(publish_frames(channel, routing_key, body, properties, self.frame_max, exchange))

    def ack(self, delivery_tag, multiple=False, channel=CHANNEL):
        self.write(settle_frame(channel, delivery_tag, BASIC_ACK, multiple=multiple))

    def nack(self, delivery_tag, multiple=False, requeue=True, channel=CHANNEL):
        self.write(
            settle_frame(channel, delivery_tag, BASIC_NACK, multiple=multiple, requeue=requeue)
        )

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
                        raise BenchmarkError(
                            f"{self.name}: basic.deliver before the last content was complete"
                        )
                    tag_at = start + 5 + data[start + 4]
                    consumer_tag = data[start + 5: tag_at].decode("utf-8", "replace")
                    (delivery_tag,) = LONG_LONG.unpack_from(data, tag_at)
                    redelivered = bool(data[tag_at + 8] & 1)
                    whole = self._whole_content(data, end + 1, channel)
                    if whole is not None:  # the usual case: header and one body frame in this read
                        properties, body, offset = whole
                        self.on_delivery(Delivery(
                            channel, consumer_tag, delivery_tag, redelivered, properties, body
                        ))
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
                    raise BenchmarkError(
                        f"{self.name}: unexpected content header on channel {channel}"
                    )
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
        if (
            frame_type != FRAME_HEADER
            or header_channel != channel
            or header_end >= size
            or length < 14
            or data[header_end] != FRAME_END
        ):
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
        if (
            frame_type != FRAME_BODY
            or body_channel != channel
            or length != body_size
            or body_end >= size
            or data[body_end] != FRAME_END
        ):
            return None
        return properties, data[body_at + 7: body_end], body_end + 1

    def _complete(self, channel):
        consumer_tag, delivery_tag, redelivered, properties, pieces, _ = self._contents.pop(channel)
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self.on_delivery(
            Delivery(channel, consumer_tag, delivery_tag, redelivered, properties, body)
        )

    def _method(self, encoded):
        _, channel, method = pamqp_frame.unmarshal(encoded)
        if isinstance(method, (commands.Connection.Close, commands.Channel.Close)):
            raise BenchmarkError(
                f"{self.name}: the broker sent {method.name} {method.reply_code}"
                f" {method.reply_text!r}"
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
