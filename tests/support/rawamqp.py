"""A minimal AMQP 0-9-1 client on a plain socket, for tests that need to
control every frame (and every byte) themselves: frames are built and read by
pamqp (or built by hand with L{raw_frame} where pamqp would refuse), and every
wait on the broker has a deadline."""

import collections
import socket
import struct
import time
import uuid

from pamqp import body as pamqp_body
from pamqp import commands, frame, header

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY = 1, 2, 3
FRAME_END = b"\xce"
MIN_FRAME_MAX = 4096  # the frame size every peer must accept, whatever was negotiated
TIMEOUT = 5.0  # the longest any single wait on the broker may take, unless told otherwise
RECEIVE_SIZE = 262144  # bytes asked of one recv


class ConnectionClosed(ConnectionError):
    """The broker closed the socket."""


def raw_frame(frame_type, channel, payload, end=FRAME_END):
    """A frame built by hand, for frames pamqp would refuse to write."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end


def content_frames(channel, body, properties=None, frame_max=MIN_FRAME_MAX):
    """The content header and body frames of one message, as bytes, the body cut to fit C{frame_max}."""
    properties = properties or commands.Basic.Properties()
    frames = [frame.marshal(header.ContentHeader(0, len(body), properties), channel)]
    largest = frame_max - 8
    for offset in range(0, len(body), largest):
        frames.append(frame.marshal(pamqp_body.ContentBody(body[offset : offset + largest]), channel))
    return b"".join(frames)


def publish_frames(channel, routing_key, body, exchange="", properties=None):
    """The frames of one basic.publish with its content, as bytes."""
    publish = frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
    return publish + content_frames(channel, body, properties)


class RawAmqp:
    """
    One connection; C{handshake()} logs in (as guest unless told) and opens vhost /.

    Unread bytes are C{buffer} from C{offset} on: frames are cut from it by
    moving C{offset}, so a recv holding many frames is copied once, not once
    per frame. C{read_frame} and the waits built on it block until a deadline;
    C{read_available} takes only the frames that have already arrived.

    @ivar received: the last L{KEPT_FRAMES} frames read, as C{(channel, frame)}, oldest first.
    @ivar sent_at: the monotonic time of the last send.
    @ivar tune: the connection.tune the broker sent, once C{handshake()} ran.
    """

    KEPT_FRAMES = 1000

    def __init__(self, host, port, timeout=TIMEOUT, receive_buffer=None):
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buffer = b""
        self.offset = 0  # where the next unread frame starts in buffer
        self.received = collections.deque(maxlen=self.KEPT_FRAMES)
        self.sent_at = time.monotonic()
        self.tune = None

    def close(self):
        self.sock.close()

    # -- sending

    def send(self, data):
        """Send C{data} (bytes, whole frames or not), waiting at most C{timeout} for the socket to take it."""
        self.sock.settimeout(self.timeout)
        self.sock.sendall(data)
        self.sent_at = time.monotonic()

    def send_method(self, channel, method):
        self.send(frame.marshal(method, channel))

    def send_content(self, channel, body, properties=None, frame_max=MIN_FRAME_MAX):
        """The content header and body frames of a message whose basic.publish was sent."""
        self.send(content_frames(channel, body, properties, frame_max))

    # -- reading

    def _so_far(self):
        return f"the last frames read: {list(self.received)[-20:]}"

    def _deadline(self, timeout):
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def _append(self, data):
        self.buffer = self.buffer[self.offset :] + data
        self.offset = 0

    def _fill(self, deadline):
        """Wait until C{deadline} for more bytes and append them to the buffer."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing from the broker in time; {self._so_far()}")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(RECEIVE_SIZE)
        except TimeoutError:
            raise TimeoutError(f"nothing from the broker in time; {self._so_far()}") from None
        except ConnectionResetError:
            data = b""
        if not data:
            raise ConnectionClosed(f"the broker closed the socket; {self._so_far()}")
        self._append(data)

    def _next_buffered(self):
        """The next complete C{(channel, frame)} in the buffer, or None if its bytes have not all arrived."""
        buffer, offset = self.buffer, self.offset
        if len(buffer) - offset < 7:
            return None
        if buffer.startswith(b"AMQP", offset):
            got = buffer[offset : offset + 8]
            raise AssertionError(f"a protocol header from the broker instead of a frame: {got!r}")
        end = offset + 8 + int.from_bytes(buffer[offset + 3 : offset + 7], "big")
        if len(buffer) < end:
            return None
        _, channel, value = frame.unmarshal(buffer[offset:end])
        self.offset = end
        self.received.append((channel, value))
        return channel, value

    def read_frame(self, deadline=None):
        """
        The next C{(channel, frame)}, waiting for its bytes until C{deadline}
        (a monotonic time; C{timeout} from now if not given).
        """
        if deadline is None:
            deadline = self._deadline(None)
        while True:
            read = self._next_buffered()
            if read is not None:
                return read
            self._fill(deadline)

    def read_available(self):
        """Every complete C{(channel, frame)} that has arrived, without waiting for more."""
        frames = []
        previous_timeout = self.sock.gettimeout()
        self.sock.setblocking(False)
        try:
            while True:
                while (read := self._next_buffered()) is not None:
                    frames.append(read)
                try:
                    data = self.sock.recv(RECEIVE_SIZE)
                except BlockingIOError:
                    return frames
                except ConnectionResetError:
                    data = b""
                if not data:
                    if frames:
                        return frames  # the next read reports the close
                    raise ConnectionClosed(f"the broker closed the socket; {self._so_far()}")
                self._append(data)
        finally:
            self.sock.settimeout(previous_timeout)

    def wait_for(self, *wanted, timeout=None):
        """
        The first C{(channel, frame)} that is an instance of one of C{wanted},
        skipping others; a connection.close or channel.close that was not
        wanted fails the test.
        """
        deadline = self._deadline(timeout)
        while True:
            channel, value = self.read_frame(deadline)
            if isinstance(value, wanted):
                return channel, value
            if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                raise AssertionError(
                    f"the broker sent {value.name} on channel {channel}: {value.reply_code} {value.reply_text!r}"
                    f" while {[cls.name for cls in wanted]} was expected"
                )

    def wait_closed(self, timeout=None):
        """Reads (and keeps) frames until the broker closes the socket; fails after C{timeout}."""
        deadline = self._deadline(timeout)
        try:
            while True:
                self.read_frame(deadline)
        except ConnectionClosed:
            return time.monotonic()

    def raw_bytes_until_closed(self, timeout=None):
        """Every byte the broker sends, unparsed, until it closes the socket; fails after C{timeout}."""
        deadline = self._deadline(timeout)
        try:
            while True:
                self._fill(deadline)
        except ConnectionClosed:
            return self.buffer[self.offset :]

    # -- conversations

    def handshake(
        self,
        username="guest",
        password="guest",
        mechanism="PLAIN",
        response=None,
        frame_max=0,
        heartbeat=0,
        capabilities=None,
        channel_max=None,
        product="rawamqp",
    ):
        """Protocol header, start-ok, tune-ok and open; returns the connection.tune the broker sent.
        C{channel_max} goes in tune-ok (default: what the broker offered); C{product} in the client properties."""
        self.send(PROTOCOL_HEADER)
        _, start = self.wait_for(commands.Connection.Start)
        assert mechanism in start.mechanisms.split()
        if response is None:
            response = f"\0{username}\0{password}"
        if capabilities is None:
            capabilities = {"consumer_cancel_notify": True, "connection.blocked": True}
        self.send_method(
            0,
            commands.Connection.StartOk(
                client_properties={"product": product, "capabilities": capabilities},
                mechanism=mechanism,
                response=response,
                locale="en_US",
            ),
        )
        _, tune = self.wait_for(commands.Connection.Tune)
        self.tune = tune
        self.send_method(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=frame_max or tune.frame_max,
                heartbeat=heartbeat,
            ),
        )
        self.send_method(0, commands.Connection.Open(virtual_host="/"))
        self.wait_for(commands.Connection.OpenOk)
        return tune

    def open_channel(self, channel=1):
        self.send_method(channel, commands.Channel.Open())
        self.wait_for(commands.Channel.OpenOk)

    def expect_channel_close(self, channel, reply_code, *words):
        """Waits for channel.close on C{channel} (no connection.close), checks it and answers close-ok."""
        got_channel, close = self.wait_for(commands.Channel.Close)
        assert (got_channel, close.reply_code) == (channel, reply_code), close.reply_text
        for word in words:
            assert word in close.reply_text
        self.send_method(channel, commands.Channel.CloseOk())
        return close

    def expect_connection_close(self, reply_code, *words):
        """
        Waits for connection.close (a channel.close fails the test), checks it,
        answers close-ok and waits for the broker to drop the socket.
        """
        channel, close = self.wait_for(commands.Connection.Close, commands.Channel.Close)
        assert isinstance(close, commands.Connection.Close), (
            f"expected connection.close {reply_code}, got channel.close on channel {channel}:"
            f" {close.reply_code} {close.reply_text!r}"
        )
        assert channel == 0
        assert close.reply_code == reply_code, close.reply_text
        for word in words:
            assert word in close.reply_text
        self.send_method(0, commands.Connection.CloseOk())
        self.wait_closed()
        return close

    def round_trip(self, channel, queue):
        """Declare C{queue}, publish to it and basic.get the message back, on this connection."""
        self.send_method(channel, commands.Queue.Declare(queue=queue))
        self.wait_for(commands.Queue.DeclareOk)
        body = f"raw round trip {uuid.uuid4().hex}".encode()
        self.send_method(channel, commands.Basic.Publish(exchange="", routing_key=queue))
        self.send_content(channel, body)
        self.send_method(channel, commands.Basic.Get(queue=queue, no_ack=True))
        _, reply = self.wait_for(commands.Basic.GetOk, commands.Basic.GetEmpty)
        assert isinstance(reply, commands.Basic.GetOk)
        self.wait_for(header.ContentHeader)
        _, content = self.wait_for(pamqp_body.ContentBody)
        assert content.value == body
