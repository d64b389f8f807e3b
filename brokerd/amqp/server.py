"""The AMQP 0-9-1 server protocol: the frame receiver of each client connection.

One L{AmqpServerProtocol} per client, in txamqp's shape: it reads bytes, checks
the protocol header, splits the stream into frames and dispatches them. It
holds the connection's L{brokerd.amqp.handshake.AmqpHandshake}, which owns
everything connection-level (the handshake, channel-0 methods, heartbeats,
timeouts, closing), and one L{brokerd.amqp.channel.AmqpChannel} per open
channel, which assembles the client's content and answers its methods through
the same L{brokerd.session.channel.Channel} the native protocol uses. Frames of an open
channel go straight to that channel; until tune-ok, frames are limited to 4096
bytes, as in RabbitMQ.

A L{ChannelError} closes only its channel (and the channel's frames are then
dropped until the client's close-ok); any other L{BrokerError} closes the
connection with its reply code. Frames written during one reactor turn go out
in one write (L{brokerd.wire.write_buffer.WriteBuffer}); the protocol is also the
transport's producer, so a client that reads slowly pauses deliveries to it
instead of filling memory, and its requests are not read either until it
catches up (no basic.get reply is made for a client that does not take them).
What such a client has not read yet, the bodies being assembled and the partial
frame being read all count against the memory watermark, and a connection in
the middle of a body is blocked like any publisher while the broker is above it.
What it holds on its way in counts against its own share of the watermark too
(L{brokerd.wire.connection_memory}).
"""

import weakref

from pamqp import commands
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.logger import Logger
from zope.interface import implementer

from brokerd.amqp import frames
from brokerd.amqp.channel import CHANNEL_OPEN, AmqpChannel, PublishedContent
from brokerd.amqp.handshake import AWAITING_HEADER, CLOSING, OPEN, AmqpHandshake, IFrameReader
from brokerd.amqp.settings import AmqpSettings
from brokerd.errors import (
    BrokerError,
    CommandInvalid,
    FrameError,
    FrameSyntaxError,
    InternalError,
    InvalidChannel,
    NotAllowed,
    UnexpectedFrame,
)
from brokerd.wire import fairness
from brokerd.wire.backpressure import (
    LARGE_PARTIAL_FRAME,
    SLOW_READER,
    ConnectionFlow,
    reading_pauses,
)
from brokerd.wire.connection_log import peer_address
from brokerd.wire.connection_memory import ConnectionMemory
from brokerd.wire.fairness import FRAMES_PER_CHECK, TurnTaking
from brokerd.wire.hangup_watch import HangupWatch
from brokerd.wire.read_buffer import ReadBuffer, read_in_large_pieces
from brokerd.wire.write_buffer import WriteBuffer

log = Logger()


@implementer(IPushProducer, IFrameReader)
class AmqpServerProtocol(Protocol):
    """
    One client connection speaking AMQP 0-9-1.

    @ivar handshake: the connection's L{AmqpHandshake}.
    @ivar writes: the connection's L{WriteBuffer}, shared with its handshake and channels.
    @ivar content: what its channels share for the content they assemble (L{PublishedContent}).
    """

    def __init__(self, broker, settings):
        self.clock = broker.clock
        # What the connection holds on its way in, against its own share of the watermark too:
        self._inbound = ConnectionMemory(broker.watermark, broker.connection_memory, broker.clock)
        self._flow = ConnectionFlow(broker.watermark, self._inbound)
        self.writes = WriteBuffer(broker.clock, self._flow.unsent)
        self.content = PublishedContent(
            broker.watermark, self._flow.body_bytes, settings.max_message_size
        )
        self.handshake = AmqpHandshake(self, broker, settings, self.writes, self._inbound)
        self._channels = {}  # channel id -> AmqpChannel
        # Until tune-ok, as in RabbitMQ:
        self._max_payload = frames.FRAME_MIN_SIZE - frames.FRAME_OVERHEAD
        self._read_buffer = ReadBuffer(self._inbound)
        self._turns = None  # a TurnTaking once connected
        self._watermark = broker.watermark
        # The index of the last method frame, for close's class and method ids:
        self._method_in_progress = 0

    # -- transport events

    def connectionMade(self):
        # Confirms and small replies must not wait for the client's delayed ACK (Nagle).
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        read_in_large_pieces(self.transport)
        self.writes.transport = self.transport
        pauses = self._flow.pauses = reading_pauses(self.transport)
        self._inbound.attach(pauses)
        self._inbound.on_limit = self.handshake.close
        pauses.on_resume = self._parse_held_back
        pauses.hangup_watch = HangupWatch(self.transport, self.clock, self._probe_paused_peer)
        self._turns = TurnTaking(self.clock, pauses, self._parse_now)
        self.transport.registerProducer(self, True)
        self._flow.received_at = self.writes.written_at = self.clock.seconds()
        self.handshake.connection_made(self.transport)

    def connectionLost(self, reason):
        self._inbound.close()  # before the channels release what they held through it
        self.handshake.connection_lost(reason)
        self.writes.connection_lost()
        self._read_buffer.clear()
        if self._turns is not None:
            self._turns.stop()
        self._flow.body_bytes.release()  # of channels the connection's close has already forgotten
        if self._flow.pauses is not None:
            self._flow.pauses.close()
        self.forget_channels()

    def dataReceived(self, data):
        if self._flow.refusing:
            return
        self._flow.received_at = self.clock.seconds()
        connection = self.handshake.connection
        if connection is not None:
            connection.bytes_received += len(data)
        kept = self._read_buffer.add(data)
        if kept is None:
            if (
                self._watermark.blocked
                and self.handshake.gate is not None
                and self._read_buffer.partial_frame_bytes >= LARGE_PARTIAL_FRAME
            ):
                # The start of a large frame holds memory like a publish.
                self.handshake.gate.check()
            return
        data, start = kept
        if self._flow.pauses.reasons:
            self._read_buffer.keep(data, start)  # parsed when reading resumes
            return
        if self.handshake.state == AWAITING_HEADER:
            data, start = self._protocol_header(data[start:]), 0
            if not data:
                return
        try:
            self._frames(data, start)
        except BrokerError as error:
            self.handshake.close(error, self._method_in_progress)
        except Exception:
            log.failure("AMQP connection from {peer} failed", peer=peer_address(self.transport))
            self.handshake.close(InternalError("the broker failed to handle a frame; see its log"))

    def _frames(self, data, offset):
        """
        L{_read_frames}, the vhost's deliveries held until they are read
        (L{brokerd.model.held_dispatches}): what they publish for a waiting
        consumer goes to it as a run.
        """
        connection = self.handshake.connection
        if connection is None:
            return self._read_frames(data, offset)
        held = connection.vhost.dispatches
        held.hold()
        try:
            self._read_frames(data, offset)
        finally:
            held.release()

    def _read_frames(self, data, offset):
        """
        Dispatch the whole frames in C{data[offset:]}, an open channel's straight
        to its L{AmqpChannel}: a turn's worth (L{brokerd.wire.fairness}); the rest waits.
        """
        size = len(data)
        until_check, deadline = FRAMES_PER_CHECK, self._turns.deadline()
        unpack_from = frames.FRAME_START.unpack_from
        channels = self._channels  # holds only open channels, so only while the connection is open
        not_reading = self._flow.pauses.reasons
        while size - offset >= frames.FRAME_START_SIZE:
            frame_type, channel_id, length = unpack_from(data, offset)
            if length > self._max_payload:
                raise self.handshake.frame_too_large(length)
            start = offset + frames.FRAME_START_SIZE
            end = start + length
            if end >= size:
                self._read_buffer.keep(data, offset, end + 1 - offset)
                return
            if data[end] != frames.FRAME_END:
                raise FrameError(f"frame end byte is {data[end]:#04x}, not 0xce")
            if frame_type == frames.FRAME_METHOD:
                if length < 4:
                    raise FrameSyntaxError(f"method frame of {length} bytes has no method id")
                (index,) = frames.METHOD_INDEX.unpack_from(data, start)
                self._method_in_progress = index
                channel = channels.get(channel_id)
                if channel is not None:
                    channel.method_frame(index, data, start + 4, end)
                else:
                    self._method_frame(channel_id, index, data, start + 4, end)
            elif frame_type == frames.FRAME_BODY:
                channel = channels.get(channel_id)
                if channel is not None and not channel.closing:
                    channel.body_frame(data, start, end)
                else:
                    self._content_elsewhere(channel, channel_id, "content body")
            elif frame_type == frames.FRAME_HEADER:
                channel = channels.get(channel_id)
                if channel is not None and not channel.closing:
                    channel.header_frame(data, start, end)
                else:
                    self._content_elsewhere(channel, channel_id, "content header")
            elif frame_type == frames.FRAME_HEARTBEAT:
                if channel_id:
                    raise FrameError(
                        f"heartbeat frame on channel {channel_id}; heartbeats belong on channel 0"
                    )
            else:
                raise FrameError(f"unknown frame type {frame_type}")
            offset = end + 1
            if not_reading:
                # The client does not read our replies, or the broker is blocked: the rest waits.
                break
            until_check -= 1
            if not until_check:
                until_check = fairness.frames_until_check(deadline)
                if not until_check:
                    break  # the turn is over
        if offset < size:
            self._read_buffer.keep(data, offset)
            if not until_check and self.handshake.state != CLOSING:
                self._turns.end_turn()

    def _protocol_header(self, data):
        """Checks the 8-byte protocol header; returns the bytes after it, or None."""
        header = data[:8]
        if not frames.PROTOCOL_HEADER.startswith(header):
            self.handshake.wrong_header(f"protocol header {bytes(header)!r} is not AMQP 0-9-1")
            return None
        if len(header) < 8:
            self._read_buffer.keep(data, 0)
            return None
        self.handshake.header_received()
        return data[8:]

    def _method_frame(self, channel_id, index, data, start, end):
        """A method frame for the connection (channel 0) or for a channel that is not open."""
        if channel_id == 0:
            self.handshake.method_frame(index, data, start, end)
            return
        state = self.handshake.state
        if state != OPEN:
            if state == CLOSING:
                return  # after connection.close, only close-ok matters
            raise CommandInvalid(
                f"method {frames.method_name(index)} on channel {channel_id}"
                " before connection.open"
            )
        if index != CHANNEL_OPEN:
            raise InvalidChannel(
                f"expected 'channel.open' on channel {channel_id}, got {frames.method_name(index)}"
            )
        self._open_channel(channel_id)

    def _content_elsewhere(self, channel, channel_id, what):
        """
        A content frame for a channel closing (dropped) or not open, or outside
        an open connection.
        """
        state = self.handshake.state
        if state != OPEN:
            if state == CLOSING:
                return
            raise UnexpectedFrame(f"{what} frame before connection.open")
        if channel is None:
            raise UnexpectedFrame(f"{what} frame on channel {channel_id}, which is not open")

    # -- channels

    def _open_channel(self, channel_id):
        # As RabbitMQ, channel_max bounds how many channels are open (any number 1-65535 may be
        # used), and refuses one more at connection level naming no method.
        handshake = self.handshake
        opened = len(self._channels)
        if opened >= handshake.channel_max:
            self._method_in_progress = 0
            raise NotAllowed(
                f"number of channels opened ({opened}) has reached the negotiated channel_max"
                f" ({handshake.channel_max})"
            )
        cancel_notify = bool(handshake.client_capabilities.get("consumer_cancel_notify"))
        self._channels[channel_id] = AmqpChannel(
            channel_id, self, handshake.connection, handshake.gate, handshake.frame_max,
            cancel_notify,
        )
        self.writes.send(frames.method_frame(channel_id, commands.Channel.OpenOk()))

    def close_channel(self, channel_id, error):
        """The broker closes channel C{channel_id} for C{error}, which no method of the client's
        raised (a delivery not acked in time)."""
        channel = self._channels.get(channel_id)
        if channel is not None and not channel.closing:
            channel.close(error, 0)

    def forget_channel(self, channel_id):
        """Channel C{channel_id} is closed at both ends: its number is free again."""
        del self._channels[channel_id]

    @property
    def connection(self):
        """
        The protocol-free L{brokerd.session.connection.Connection} once
        connection.open is done, else None.
        """
        return self.handshake.connection

    # -- IFrameReader: what the handshake asks of us

    def last_read(self):
        flow = self._flow
        if flow.pauses is not None and flow.pauses.reasons:
            return self.clock.seconds()
        return flow.received_at

    def limit_frames(self, frame_max):
        self._max_payload = frame_max - frames.FRAME_OVERHEAD

    def drop_unread(self):
        self._read_buffer.clear()

    def refuse_reading(self, refusing):
        self._flow.refusing = refusing
        if refusing:
            self._read_buffer.clear()

    def forget_channels(self):
        for channel in self._channels.values():
            # The model's closed channel may outlive it: its body parts must not.
            channel.drop_content()
        self._channels.clear()

    # -- IPushProducer: the transport tells us when the client is not keeping up

    def pauseProducing(self):
        """
        The transport's write buffer is full: no deliveries, and no requests
        read, until it drains.
        """
        self.writes.pause()
        self._flow.pauses.pause(SLOW_READER)
        if self.handshake.connection is not None:
            self.handshake.connection.pause_deliveries()

    def resumeProducing(self):
        """
        The transport wrote everything: what waited in it is released, and the
        client is served again.
        """
        self.writes.resume()
        self._flow.pauses.resume(SLOW_READER)
        if self.handshake.connection is not None:
            self.handshake.connection.resume_deliveries()

    def stopProducing(self):
        self.writes.release()

    def _parse_held_back(self):
        """
        Reading resumed: parse what was read but held back, on the next turn
        (not inside a release).
        """
        self.clock.callLater(0, self._parse_now)

    def _parse_now(self):
        if self.handshake.state != CLOSING and not self._flow.pauses.reasons:
            self.dataReceived(b"")

    def _probe_paused_peer(self):
        """A heartbeat frame (clients take one whatever was negotiated) to a client we are not
        reading and that holds memory, so that one that went away is noticed
        (L{brokerd.wire.hangup_watch}). Only with heartbeats off (negotiated ones go on while
        we do not read), and not to a client that does not read what we write, whose buffer
        would only grow."""
        handshake = self.handshake
        if (
            handshake.state not in (AWAITING_HEADER, CLOSING)
            and self.writes.idle
            and not handshake.heartbeat
        ):
            held = self._flow.body_bytes.size + self._read_buffer.partial_frame_bytes
            if handshake.connection is not None:
                held += handshake.connection.held_bytes()
            if held >= LARGE_PARTIAL_FRAME and SLOW_READER not in self._flow.pauses.reasons:
                self.transport.write(frames.HEARTBEAT_FRAME)


class AmqpServerFactory(ServerFactory):
    """Makes an L{AmqpServerProtocol} per client of one broker."""

    noisy = False

    def __init__(self, broker, settings=None):
        self.broker = broker
        self.settings = settings or AmqpSettings()
        self._protocols = weakref.WeakSet()  # every connection made, to close them at shutdown

    def buildProtocol(self, address):
        protocol = AmqpServerProtocol(self.broker, self.settings)
        protocol.factory = self
        self._protocols.add(protocol)
        return protocol

    def open_protocols(self):
        """The connections whose sockets are still open."""
        return [protocol for protocol in self._protocols if protocol.transport is not None
                and not getattr(protocol.transport, "disconnected", True)]

    def close_connections(self, error):
        """Send connection.close with C{error} to every client that logged in; drop the others."""
        for protocol in self.open_protocols():
            protocol.handshake.shut_down(error)
