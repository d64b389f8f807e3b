"""The AMQP 0-9-1 server protocol: frames, content, channels, writing.

One L{AmqpServerProtocol} per client. It checks the protocol header, leaves
the handshake and heartbeats to L{brokerd.amqp.handshake.ConnectionMethods},
and splits the byte stream into frames. basic.publish with its content and
basic.ack take a struct-based path (L{brokerd.amqp.frames}); every other method
is decoded by L{brokerd.amqp.arguments} (linear for the methods carrying field
tables, pamqp for the rest) and handed to L{brokerd.amqp.methods}, which calls
the same L{brokerd.channel.Channel} the native protocol uses. Until tune-ok,
frames are limited to 4096 bytes, as in RabbitMQ.

A L{ChannelError} closes only its channel (and the channel's frames are then
dropped until the client's close-ok); any other L{BrokerError} closes the
connection with its reply code. Frames written during one reactor turn go out
in one write; the protocol is also the transport's producer, so a client that
reads slowly pauses deliveries to it instead of filling memory, and its
requests are not read either until it catches up (no basic.get reply is made
for a client that does not take them). What such a client has not read yet,
the bodies being assembled and the partial frame being read all count against
the memory watermark, and a connection in the middle of a body is blocked like
any publisher while the broker is above it.
"""

import weakref

from pamqp import commands
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.logger import Logger
from zope.interface import implementer

from brokerd.amqp import frames, methods
from brokerd.amqp.arguments import decode_method
from brokerd.amqp.handshake import (
    AWAITING_HEADER,
    AWAITING_START_OK,
    CLOSING,
    HANDSHAKE_TIMEOUT,
    OPEN,
    AmqpSettings,
    ConnectionMethods,
)
from brokerd.amqp.peer import AmqpChannelPeer
from brokerd.amqp.properties import decode_properties
from brokerd.errors import (
    BrokerError,
    ChannelError,
    CommandInvalid,
    FrameError,
    FrameSyntaxError,
    InternalError,
    InvalidChannel,
    MethodNotImplemented,
    NotAllowed,
    PreconditionFailed,
    UnexpectedFrame,
)
from brokerd.hangup import HangupWatch
from brokerd.model.message import Message
from brokerd.model.watermark import LARGE_PARTIAL_FRAME, SLOW_READER, ConnectionFlow, reading_pauses
from brokerd.readbuffer import ReadBuffer

log = Logger()

# Publishers tend to send the same property bytes again and again; each distinct
# encoding is decoded (and checked) once per connection and its result shared.
PROPERTIES_CACHE_SIZE = 256
_CHANNEL_OPEN = frames.method_index(20, 10)
_CHANNEL_CLOSE = frames.method_index(20, 40)
_CHANNEL_CLOSE_OK = frames.method_index(20, 41)


class ChannelState:
    """One open AMQP channel: its model channel and the content being assembled."""

    __slots__ = ("id", "channel", "peer", "closing", "publish", "properties", "body_size", "parts", "received")

    def __init__(self, channel_id, channel, peer):
        self.id = channel_id
        self.channel = channel
        self.peer = peer
        self.closing = False  # we sent channel.close and wait for close-ok
        self.publish = None  # (exchange, routing key, mandatory) awaiting content
        self.properties = None  # encoded properties, once the content header came
        self.body_size = 0
        self.parts = None
        self.received = 0  # body bytes held in parts, counted against the watermark


@implementer(IPushProducer)
class AmqpServerProtocol(ConnectionMethods, Protocol):
    """One client connection speaking AMQP 0-9-1."""

    FLUSH_BYTES = 256 * 1024

    def __init__(self, broker, settings):
        self.broker = broker
        self.clock = broker.clock
        self.settings = settings
        self.frame_max = settings.frame_max
        self.channel_max = settings.channel_max
        self.heartbeat = 0
        self.client_properties = {}
        self.client_capabilities = {}
        self.user = None
        self.connection = None  # the model's Connection, after connection.open
        self._state = AWAITING_HEADER
        self._channels = {}
        self._max_payload = frames.FRAME_MIN_SIZE - frames.FRAME_OVERHEAD  # until tune-ok, as in RabbitMQ
        self._read_buffer = ReadBuffer(broker.watermark)
        self._flow = ConnectionFlow(broker.watermark)
        self._outgoing = None
        self._outgoing_bytes = 0
        self._flush_call = None
        self._timeout_call = None
        self._heartbeat_loop = None
        self._received_at = self._sent_at = 0.0
        self._watermark = broker.watermark
        self._decoded_properties = {}  # encoded properties -> BasicProperties
        self._gate = None  # pauses reading from us while the broker is blocked, once open
        self._method_in_progress = 0  # the index of the last method frame, for close's class and method ids
        self._record = None  # the connection as logged once accepted (brokerd.connectionlog)
        self._close_reason = None  # why it ends, for its closing log line

    # -- transport events

    def connectionMade(self):
        # Confirms and small replies must not wait for the client's delayed ACK (Nagle).
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        pauses = self._flow.pauses = reading_pauses(self.transport)
        pauses.on_resume = self._parse_held_back
        pauses.hangup_watch = HangupWatch(self.transport, self.clock, self._probe_paused_peer)
        self.transport.registerProducer(self, True)
        self._received_at = self._sent_at = self.clock.seconds()
        self._timeout_call = self.clock.callLater(HANDSHAKE_TIMEOUT, self._handshake_timed_out)

    def connectionLost(self, reason):
        self._state = CLOSING
        self._log_closed(reason)
        for call in (self._flush_call, self._timeout_call):
            if call is not None and call.active():
                call.cancel()
        self._flush_call = self._timeout_call = None
        self._outgoing = None
        self._read_buffer.clear()
        self._flow.unsent.release()
        self._flow.body_bytes.release()  # of channels the connection's close has already forgotten
        if self._flow.pauses is not None:
            self._flow.pauses.close()
        self._channels.clear()  # with any content being assembled
        if self._heartbeat_loop is not None and self._heartbeat_loop.running:
            self._heartbeat_loop.stop()
        if self._gate is not None:
            self._gate.close()
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def dataReceived(self, data):
        if self._flow.refusing:
            return
        self._flow.received_at = self.clock.seconds()
        if self.connection is not None:
            self.connection.bytes_received += len(data)
        data = self._read_buffer.add(data)
        if data is None:
            if (
                self._watermark.blocked
                and self._gate is not None
                and self._read_buffer.partial_frame_bytes >= LARGE_PARTIAL_FRAME
            ):
                self._gate.check()  # the start of a large frame holds memory like a publish
            return
        if self._flow.pauses.reasons:
            self._read_buffer.keep(data, 0)  # parsed when reading resumes
            return
        if self._state == AWAITING_HEADER:
            data = self._protocol_header(data)
            if not data:
                return
        try:
            self._frames(data)
        except BrokerError as error:
            self._close_connection(error, self._method_in_progress)
        except Exception:
            log.failure("AMQP connection from {peer} failed", peer=self._peer_name())
            self._close_connection(InternalError("the broker failed to handle a frame; see its log"))

    def _frames(self, data):
        offset, size = 0, len(data)
        unpack_from = frames.FRAME_START.unpack_from
        not_reading = self._flow.pauses.reasons
        while size - offset >= frames.FRAME_START_SIZE:
            frame_type, channel_id, length = unpack_from(data, offset)
            if length > self._max_payload:
                raise self._frame_too_large(length)
            start = offset + frames.FRAME_START_SIZE
            end = start + length
            if end >= size:
                self._read_buffer.keep(data, offset, end + 1 - offset)
                return
            if data[end] != frames.FRAME_END:
                raise FrameError(f"frame end byte is {data[end]:#04x}, not 0xce")
            if frame_type == frames.FRAME_METHOD:
                self._method_frame(channel_id, data, start, end)
            elif frame_type == frames.FRAME_BODY:
                self._body_frame(channel_id, data, start, end)
            elif frame_type == frames.FRAME_HEADER:
                self._header_frame(channel_id, data, start, end)
            elif frame_type == frames.FRAME_HEARTBEAT:
                if channel_id:
                    raise FrameError(f"heartbeat frame on channel {channel_id}; heartbeats belong on channel 0")
            else:
                raise FrameError(f"unknown frame type {frame_type}")
            offset = end + 1
            if not_reading:
                break  # the client does not read our replies, or the broker is blocked: the rest waits
        if offset < size:
            self._read_buffer.keep(data, offset)

    def _protocol_header(self, data):
        """Checks the 8-byte protocol header; returns the bytes after it, or None."""
        header = data[:8]
        if not frames.PROTOCOL_HEADER.startswith(header):
            problem = f"protocol header {bytes(header)!r} is not AMQP 0-9-1"
            self.settings.refusal_log.refused(self.clock, self._peer_host(), self._peer_name(), problem)
            self._state = CLOSING
            self.transport.write(frames.PROTOCOL_HEADER)
            self.transport.loseConnection()
            return None
        if len(header) < 8:
            self._read_buffer.keep(data, 0)
            return None
        self._state = AWAITING_START_OK
        self._send_connection_start()
        return data[8:]

    # -- frames

    def _method_frame(self, channel_id, data, start, end):
        if end - start < 4:
            raise FrameSyntaxError(f"method frame of {end - start} bytes has no method id")
        (index,) = frames.METHOD_INDEX.unpack_from(data, start)
        self._method_in_progress = index
        if channel_id == 0:
            self._connection_frame(index, data, start + 4, end)
            return
        if self._state != OPEN:
            if self._state == CLOSING:
                return  # after connection.close, only close-ok matters
            raise CommandInvalid(f"method {frames.method_name(index)} on channel {channel_id} before connection.open")
        state = self._channels.get(channel_id)
        if state is None:
            if index == _CHANNEL_OPEN:
                self._open_channel(channel_id)
                return
            raise InvalidChannel(f"expected 'channel.open' on channel {channel_id}, got {frames.method_name(index)}")
        if index == _CHANNEL_OPEN and not state.closing:
            raise InvalidChannel(f"second 'channel.open' for channel {channel_id}, which is already open")
        if state.closing:
            if index == _CHANNEL_CLOSE_OK or index == _CHANNEL_CLOSE:
                del self._channels[channel_id]
                if index == _CHANNEL_CLOSE:
                    self.send(frames.method_frame(channel_id, commands.Channel.CloseOk()))
            return
        if state.publish is not None:
            raise UnexpectedFrame(
                f"expected content header for class 60, got method {frames.method_name(index)} on channel {channel_id}"
            )
        if index == frames.BASIC_PUBLISH:
            exchange, routing_key, mandatory, immediate = frames.decode_publish(data, start + 4, end)
            if immediate:
                raise MethodNotImplemented("immediate=true")
            state.publish = (exchange, routing_key, mandatory)
            return
        try:
            if index == frames.BASIC_ACK:
                state.channel.basic_ack(*frames.decode_ack(data, start + 4, end))
                return
            handler = methods.CHANNEL_METHODS.get(index)
            if handler is None:
                raise self._not_a_channel_method(index)
            handler(self, state, decode_method(index, data, start + 4, end, PreconditionFailed))
        except ChannelError as error:
            self._close_channel(state, error, index)

    @staticmethod
    def _not_a_channel_method(index):
        name = frames.method_name(index)
        if index >> 16 == 10:
            return CommandInvalid(f"{name} belongs on channel 0")
        if index in commands.INDEX_MAPPING:
            return CommandInvalid(f"{name} is sent by the server, not the client")
        return MethodNotImplemented(f"unknown method {name}")

    def _header_frame(self, channel_id, data, start, end):
        state = self._content_channel(channel_id, "content header")
        if state is None:
            return
        if state.publish is None or state.properties is not None:
            raise UnexpectedFrame(f"content header frame on channel {channel_id} without a basic.publish before it")
        class_id, body_size, properties_start = frames.decode_content_header(data, start, end)
        if class_id != frames.BASIC_CLASS:
            raise UnexpectedFrame(f"content header for class {class_id}, expected class 60 (basic)")
        if body_size > self.settings.max_message_size:
            state.publish = None
            error = PreconditionFailed(
                f"message size {body_size} is larger than configured max size {self.settings.max_message_size}"
            )
            self._close_channel(state, error, frames.BASIC_PUBLISH)
            return
        properties = data[properties_start:end]
        if not body_size:
            self._publish(state, properties, b"")
            return
        state.properties = properties
        state.body_size = body_size
        state.parts = []
        state.received = 0

    def _body_frame(self, channel_id, data, start, end):
        state = self._content_channel(channel_id, "content body")
        if state is None:
            return
        if state.properties is None:
            raise UnexpectedFrame(f"content body frame on channel {channel_id} without a content header before it")
        received = state.received + end - start
        if received > state.body_size:
            raise FrameError(f"content body is longer than the {state.body_size} bytes its header announced")
        parts = state.parts
        if received == state.body_size:
            if parts:
                parts.append(memoryview(data)[start:end])
                body = b"".join(parts)
            else:
                body = data[start:end]
            self._publish(state, state.properties, body)
        else:
            size = end - start
            if len(data) - size > size >> 2:
                # A view would keep the whole read alive, which may be far larger than the part
                # counted against the watermark (small body frames among other frames): copy it.
                parts.append(data[start:end])
            else:
                parts.append(memoryview(data)[start:end])
            state.received = received
            self._flow.body_bytes.add(size)
            if self._watermark.blocked:
                self._gate.check()  # a body on its way holds memory: its sender is a publisher to block

    def _release_content(self, state):
        """The content assembled on C{state} was published or dropped: its body bytes leave the watermark."""
        received, state.received = state.received, 0
        if received:
            self._flow.body_bytes.release(received)

    def _content_channel(self, channel_id, what):
        if self._state != OPEN:
            if self._state == CLOSING:
                return None
            raise UnexpectedFrame(f"{what} frame before connection.open")
        state = self._channels.get(channel_id)
        if state is None:
            raise UnexpectedFrame(f"{what} frame on channel {channel_id}, which is not open")
        if state.closing:
            return None
        return state

    def _publish(self, state, properties, body):
        exchange, routing_key, mandatory = state.publish
        state.publish = state.properties = state.parts = None
        if state.received:
            self._release_content(state)
        decoded = self._decoded_properties.get(properties)
        if decoded is None:
            try:
                decoded = decode_properties(properties)  # malformed properties are a connection error (502)
            except ChannelError as error:  # headers nested too deep: 406 closes this channel only
                self._close_channel(state, error, frames.BASIC_PUBLISH)
                return
            if len(self._decoded_properties) >= PROPERTIES_CACHE_SIZE:
                self._decoded_properties.clear()
            self._decoded_properties[properties] = decoded
        message = Message(exchange, routing_key, decoded, body, properties)
        try:
            state.channel.publish(message, mandatory)
        except ChannelError as error:
            self._close_channel(state, error, frames.BASIC_PUBLISH)
        if self._watermark.blocked:
            self._gate.check()

    # -- channels

    def _open_channel(self, channel_id):
        # As RabbitMQ, channel_max bounds how many channels are open (any number 1-65535 may be
        # used), and refuses one more at connection level naming no method.
        opened = len(self._channels)
        if opened >= self.channel_max:
            self._method_in_progress = 0
            raise NotAllowed(
                f"number of channels opened ({opened}) has reached the negotiated channel_max ({self.channel_max})"
            )
        peer = AmqpChannelPeer(self, channel_id)
        channel = self.connection.open_channel(channel_id, peer)
        self._channels[channel_id] = ChannelState(channel_id, channel, peer)
        self.send(frames.method_frame(channel_id, commands.Channel.OpenOk()))

    def close_channel_by_client(self, state):
        """channel.close from the client: close it and answer close-ok."""
        del self._channels[state.id]
        self._release_content(state)
        self.connection.close_channel(state.id)
        self.send(frames.method_frame(state.id, commands.Channel.CloseOk()))

    def _close_channel(self, state, error, index):
        log.debug("closing channel {channel}: {error}", channel=state.id, error=error)
        self.connection.close_channel(state.id)
        state.closing = True
        state.publish = state.properties = state.parts = None
        self._release_content(state)
        close = commands.Channel.Close(
            reply_code=error.reply_code, reply_text=error.reply_text[:255], class_id=index >> 16,
            method_id=index & 0xFFFF,
        )
        self.send(frames.method_frame(state.id, close))

    # -- writing

    def send(self, piece):
        """Queue bytes for the end-of-turn write."""
        outgoing = self._outgoing
        if outgoing is None:
            outgoing = self._outgoing = []
            self._flush_call = self.clock.callLater(0, self.flush)
        outgoing.append(piece)

    def send_pieces(self, pieces, size):
        """Queue several pieces (about C{size} bytes); writes at once past L{FLUSH_BYTES}."""
        outgoing = self._outgoing
        if outgoing is None:
            outgoing = self._outgoing = []
            self._flush_call = self.clock.callLater(0, self.flush)
        outgoing.extend(pieces)
        self._outgoing_bytes += size
        if self._outgoing_bytes >= self.FLUSH_BYTES:
            self.flush()

    def flush(self):
        outgoing, self._outgoing, self._outgoing_bytes = self._outgoing, None, 0
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        if outgoing and self.transport is not None:
            data = b"".join(outgoing)  # one copy, and memoryview slices are welcome
            self.transport.write(data)
            if self.connection is not None:
                self.connection.bytes_sent += len(data)
            self._sent_at = self.clock.seconds()
            if SLOW_READER in self._flow.pauses.reasons:
                self._flow.unsent.add(len(data))  # waits in the transport until the client reads

    # -- IPushProducer: the transport tells us when the client is not keeping up

    def pauseProducing(self):
        """The transport's write buffer is full: no deliveries, and no requests read, until it drains."""
        self._flow.pauses.pause(SLOW_READER)
        if self.connection is not None:
            self.connection.pause_deliveries()

    def resumeProducing(self):
        """The transport wrote everything: what waited in it is released, and the client is served again."""
        self._flow.unsent.release()
        self._flow.pauses.resume(SLOW_READER)
        if self.connection is not None:
            self.connection.resume_deliveries()

    def stopProducing(self):
        self._flow.unsent.release()

    def _parse_held_back(self):
        """Reading resumed: parse what was read but held back, on the next turn (not inside a release)."""
        self.clock.callLater(0, self._parse_now)

    def _parse_now(self):
        if self._state != CLOSING and not self._flow.pauses.reasons:
            self.dataReceived(b"")

    def _probe_paused_peer(self):
        """A heartbeat frame (clients take one whatever was negotiated) to a client we are not
        reading and that holds memory, so that one that went away is noticed (L{brokerd.hangup}).
        Only with heartbeats off (negotiated ones go on while we do not read), and not to a
        client that does not read what we write, whose buffer would only grow."""
        if self._state not in (AWAITING_HEADER, CLOSING) and self._outgoing is None and not self.heartbeat:
            held = self._flow.body_bytes.size + self._read_buffer.partial_frame_bytes
            if self.connection is not None:
                held += self.connection.held_bytes()
            if held >= LARGE_PARTIAL_FRAME and SLOW_READER not in self._flow.pauses.reasons:
                self.transport.write(frames.HEARTBEAT_FRAME)

    @property
    def _received_at(self):
        """When the client last sent bytes, for the heartbeat check; while we do not read
        from it (blocked, or it does not read), its heartbeats wait unread, so: now."""
        flow = self._flow
        if flow.pauses is not None and flow.pauses.reasons:
            return self.clock.seconds()
        return flow.received_at

    @_received_at.setter
    def _received_at(self, when):
        self._flow.received_at = when

    # -- helpers

    def _peer_host(self):
        peer = self.transport.getPeer() if self.transport is not None else None
        return getattr(peer, "host", "")

    def _peer_name(self):
        peer = self.transport.getPeer() if self.transport is not None else None
        return f"{peer.host}:{peer.port}" if hasattr(peer, "port") else str(peer)


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
            if protocol.user is not None:
                protocol._close_connection(error)
            else:
                protocol._state = CLOSING
                protocol.transport.loseConnection()
