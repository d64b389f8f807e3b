"""The native protocol's server side: the frame receiver of each client connection.

One L{NativeServerProtocol} per client, in the AMQP server's shape: it reads
frames (L{brokerd.native.framing}), each one C{Envelope}, and dispatches them.
It holds the connection's L{brokerd.native.handshake.NativeHandshake}, which
owns everything connection-level (hello and login, the frame limit, the
timers, closing), and one L{brokerd.native.channel.NativeChannel} per open
channel, which answers the requests on that channel through the same
L{brokerd.session.channel.Channel} AMQP uses and pushes the broker's
deliveries, returns, confirms and cancels back. The protocol itself opens and
closes channels (at most C{channel_max} open at once, whatever their numbers)
and hands management requests (users, vhosts, permissions) to
L{brokerd.native.access_requests}.

The first frame must be hello. A L{ChannelError} closes only its channel (the
client answers channel_close_ok, and the channel's frames are dropped until
it does), any other L{BrokerError} closes the connection, and a frame that
cannot be read closes only this connection.

Replies and deliveries go out once per reactor turn of the broker's clock
through the write buffer the AMQP server uses too (L{brokerd.wire.write_buffer}).
The protocol is its transport's producer: while the client does not read what
we write, it gets no deliveries and its requests are not read either, so it
cannot make the broker queue replies it will not take.
"""

import weakref

from google.protobuf.message import DecodeError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import ServerFactory
from twisted.logger import Logger
from zope.interface import implementer

from brokerd.access.login import LOGIN_REFUSAL_DELAY
from brokerd.errors import (
    BrokerError,
    ChannelError,
    CommandInvalid,
    FrameError,
    InternalError,
    InvalidChannel,
    MethodNotImplemented,
    NotAllowed,
    UnexpectedFrame,
)
from brokerd.native.access_requests import answer_management_request, management_serving
from brokerd.native.channel import CHANNEL_REQUESTS, NativeChannel, exchange_type_name
from brokerd.native.framing import FrameReceiver
from brokerd.native.handshake import (
    DEFAULT_CHANNEL_MAX,
    DEFAULT_MAX_FRAME_SIZE,
    PRE_HELLO_MAX_FRAME_SIZE,
    IEnvelopeReader,
    NativeHandshake,
    NativeSettings,
)
from brokerd.native.replies import ok_frame, reply_to
from brokerd.proto.native_pb2 import Envelope
from brokerd.wire.backpressure import LARGE_PARTIAL_FRAME, SLOW_READER, reading_pauses
from brokerd.wire.connection_memory import ConnectionMemory
from brokerd.wire.hangup_watch import HangupWatch
from brokerd.wire.read_buffer import read_in_large_pieces

EMPTY_FRAME = b"\x00\x00\x00\x00"  # a frame holding an empty envelope: a no-op for clients

log = Logger()


@implementer(IPushProducer, IEnvelopeReader)
class NativeServerProtocol(FrameReceiver):
    """
    One client connection speaking the native protocol.

    @ivar handshake: the connection's L{NativeHandshake}.
    @ivar management: the listener's L{brokerd.access.interfaces.IAccessCommands}
        (None: management requests are refused).
    """

    def __init__(self, broker, settings, management=None):
        """
        @param settings: the listener's L{NativeSettings}.
        """
        FrameReceiver.__init__(self, broker.clock, broker.watermark)
        self.inbound = ConnectionMemory(broker.watermark, broker.connection_memory, broker.clock)
        self.MAX_LENGTH = PRE_HELLO_MAX_FRAME_SIZE  # until hello (limit_frames)
        self.management = management
        self.handshake = NativeHandshake(self, broker, settings, self.writes)
        self._channel_max = settings.channel_max
        self._channels = {}  # channel id -> open NativeChannel
        # Channels closed by us: their frames are dropped until channel_close_ok.
        self._awaiting_close_ok = set()
        self._resume_call = None
        # request kind -> what answers it, for the requests that are not an open channel's
        self._connection_requests = {
            "hello": self.handshake.on_hello,
            "connection_close": self.handshake.on_connection_close,
            "connection_close_ok": self.handshake.on_connection_close_ok,
            "channel_open": self._open_channel,
            "channel_close": self._close_channel_for_client,
            "channel_close_ok": self._channel_close_ok,
            "management_request": self._answer_management_request,
        }

    @property
    def connection(self):
        """The model's L{brokerd.session.connection.Connection} once hello is done, else None."""
        return self.handshake.connection

    # -- transport events

    def connectionMade(self):
        # Confirms and small replies must not wait for the client's delayed ACK (Nagle).
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        read_in_large_pieces(self.transport)
        self.read_pauses = reading_pauses(self.transport)
        self.inbound.attach(self.read_pauses)
        self.inbound.on_limit = self.handshake.close
        self.read_pauses.on_resume = self._parse_held_back
        self.read_pauses.hangup_watch = HangupWatch(
            self.transport, self.clock, self._probe_paused_peer
        )
        self.transport.registerProducer(self, True)
        self.handshake.connection_made(self.transport)

    def connectionLost(self, reason):
        self.inbound.close()  # before what the connection held is released through it
        FrameReceiver.connectionLost(self, reason)
        self.handshake.connection_lost(reason)
        if self._resume_call is not None and self._resume_call.active():
            self._resume_call.cancel()
        self._resume_call = None
        if self.read_pauses is not None:
            self.read_pauses.close()
        self._channels.clear()

    def _probe_paused_peer(self):
        """An empty frame (an envelope with nothing in it, which clients ignore) to a client we are
        not reading and that holds memory, so that one that went away is noticed
        (L{brokerd.wire.hangup_watch}); not to one that does not read what we write."""
        if (
            self.writes.idle
            and SLOW_READER not in self.read_pauses.reasons
            and self.transport is not None
        ):
            held = self._read_buffer.partial_frame_bytes if self._read_buffer is not None else 0
            connection = self.handshake.connection
            if connection is not None:
                held += connection.held_bytes()
            if held >= LARGE_PARTIAL_FRAME:
                self.transport.write(EMPTY_FRAME)

    def dataReceived(self, data):
        connection = self.handshake.connection
        if connection is not None:
            connection.bytes_received += len(data)
        FrameReceiver.dataReceived(self, data)

    def lengthLimitExceeded(self, length):
        when = "" if self.handshake.connection is not None else " before hello"
        self.handshake.close(
            FrameError(
                f"frame of {length} bytes is larger than the limit of {self.MAX_LENGTH} bytes{when}"
            )
        )

    def partialFrameReceived(self):
        # The start of a large frame holds memory: like a publish, it is gated
        # while the broker is blocked.
        if (
            self.watermark.blocked
            and self.handshake.connection is not None
            and self._read_buffer.partial_frame_bytes >= LARGE_PARTIAL_FRAME
        ):
            self.handshake.gate.check()

    # -- IEnvelopeReader: what the handshake asks of us

    def limit_frames(self, max_frame_size):
        self.MAX_LENGTH = max_frame_size

    def stop_reading(self):
        self.stopped_reading = True

    # -- IPushProducer: the transport tells us when the client is not reading what we write

    def pauseProducing(self):
        self.writes.pause()
        self.read_pauses.pause(SLOW_READER)
        if self.handshake.connection is not None:
            self.handshake.connection.pause_deliveries()

    def resumeProducing(self):
        self.writes.resume()
        self.read_pauses.resume(SLOW_READER)
        if self.handshake.connection is not None:
            self.handshake.connection.resume_deliveries()

    def stopProducing(self):
        self.writes.release()

    def _parse_held_back(self):
        """
        Reading resumed: parse what was read but held back, on the next turn
        (not inside a release).
        """
        if self._resume_call is None or not self._resume_call.active():
            self._resume_call = self.clock.callLater(0, self._parse_now)

    def _parse_now(self):
        self._resume_call = None
        if not self.read_pauses.reasons and not self.stopped_reading:
            self.dataReceived(b"")

    # -- envelopes

    def stringReceived(self, frame):
        envelope = Envelope()
        try:
            envelope.ParseFromString(frame)
        except DecodeError as problem:
            self.handshake.close(
                FrameError(f"frame of {len(frame)} bytes is not a valid envelope: {problem}")
            )
            return
        kind = envelope.WhichOneof("payload")
        channel_id = envelope.channel
        if channel_id in self._awaiting_close_ok:
            # AMQP: once we close a channel, its frames are dropped until the client's close-ok.
            if kind == "channel_close_ok":
                self._awaiting_close_ok.discard(channel_id)
            elif kind == "channel_close":
                self._awaiting_close_ok.discard(channel_id)
                self._close_channel_for_client(envelope, envelope.channel_close)
            return
        try:
            answer = CHANNEL_REQUESTS.get(kind)
            if answer is not None:
                channel = self._channels.get(channel_id)
                if channel is None:
                    self._refuse_channel_request(kind, envelope)  # raises
                answer(channel, envelope, getattr(envelope, kind))
            else:
                self._connection_request(kind, envelope)
        except ChannelError as error:
            self.close_channel(channel_id, error, envelope.correlation_id)
        except BrokerError as error:
            self.handshake.close(error)
        except Exception:
            log.failure(
                "native request {kind} on channel {channel} failed", kind=kind, channel=channel_id
            )
            self.handshake.close(InternalError(f"the broker failed to handle {kind}; see its log"))

    def _connection_request(self, kind, envelope):
        """
        A request that is not an open channel's: the handshake's, or opening,
        closing or management.
        """
        answer = self._connection_requests.get(kind)
        if answer is None:
            if kind is None:
                raise MethodNotImplemented("frame carries no request this broker knows")
            raise CommandInvalid(f"{kind} is sent by the server, not the client")
        if self.handshake.connection is None and kind != "hello":
            raise UnexpectedFrame(f"expected hello as the first frame, got {kind}")
        answer(envelope, getattr(envelope, kind))

    def _refuse_channel_request(self, kind, envelope):
        """Raise the error answering a channel's request on a channel that is not open."""
        if self.handshake.connection is None:
            raise UnexpectedFrame(f"expected hello as the first frame, got {kind}")
        if kind == "exchange_declare":
            # An unknown type is refused first, as it always was.
            exchange_type_name(envelope.exchange_declare)
        # The model's words (Connection.channel):
        raise InvalidChannel(f"channel {envelope.channel} is not open")

    # -- channels

    def _open_channel(self, envelope, open_):
        channel_id = envelope.channel
        if channel_id == 0:
            raise InvalidChannel("channel 0 is the connection itself and cannot be opened")
        opened = len(self._channels) + len(self._awaiting_close_ok)
        if opened >= self._channel_max and channel_id not in self._channels:
            raise NotAllowed(
                f"number of channels opened ({opened}) has reached the channel_max"
                f" ({self._channel_max})"
            )
        handshake = self.handshake
        self._channels[channel_id] = NativeChannel(
            channel_id, handshake.connection, self.sendFrame, handshake.gate, self.watermark
        )
        self.sendFrame(ok_frame(envelope))

    def _close_channel_for_client(self, envelope, close):
        """
        channel_close from the client: close the channel (if it is open) and
        answer channel_close_ok.
        """
        self._channels.pop(envelope.channel, None)
        self.handshake.connection.close_channel(envelope.channel)
        reply = reply_to(envelope)
        reply.channel_close_ok.SetInParent()
        self.sendFrame(reply.SerializeToString())

    def _channel_close_ok(self, envelope, close_ok):
        pass  # only meaningful while we wait for it, handled in stringReceived

    def close_channel(self, channel_id, error, correlation_id=0):
        """
        The broker closes channel C{channel_id} for C{error}; its frames are
        dropped until the client's close-ok.
        """
        log.debug("closing channel {channel}: {error}", channel=channel_id, error=error)
        self._channels.pop(channel_id, None)
        if self.handshake.connection is not None:
            self.handshake.connection.close_channel(channel_id)
        self._awaiting_close_ok.add(channel_id)
        envelope = Envelope(channel=channel_id, correlation_id=correlation_id)
        envelope.channel_close.reply_code = error.reply_code
        envelope.channel_close.reply_text = error.reply_text
        self.sendFrame(envelope.SerializeToString())

    def close_connection(self, error):
        """The broker closes the connection for C{error} (L{NativeHandshake.close})."""
        self.handshake.close(error)

    def _answer_management_request(self, envelope, request):
        answer_management_request(self, envelope, request)


class NativeServerFactory(ServerFactory):
    """
    Makes a L{NativeServerProtocol} per client of one broker.

    @ivar settings: the listener's L{NativeSettings}, shared by its connections.
    @ivar management: the L{brokerd.access.interfaces.IAccessCommands} its
        connections' management requests go to (None: they are refused).
    """

    noisy = False

    def __init__(
        self, broker, max_frame_size=DEFAULT_MAX_FRAME_SIZE, channel_max=DEFAULT_CHANNEL_MAX,
        authenticator=None, refusal_delay=LOGIN_REFUSAL_DELAY,
    ):
        """
        @param authenticator: the broker's L{brokerd.access.interfaces.IAccessControl},
            the object AMQP logins use, so that one access database serves both
            protocols; without one, guest/guest in memory.
        @param refusal_delay: seconds a refused login waits for its answer.
        """
        self.broker = broker
        self.settings = NativeSettings(authenticator, max_frame_size, channel_max, refusal_delay)
        self.management = management_serving(broker, self.settings.authenticator)
        self._protocols = weakref.WeakSet()  # every connection made, to close them at shutdown

    def stopFactory(self):
        self.settings.refusal_log.stop()

    def buildProtocol(self, address):
        protocol = NativeServerProtocol(self.broker, self.settings, self.management)
        protocol.factory = self
        self._protocols.add(protocol)
        return protocol

    def open_protocols(self):
        """The connections whose sockets are still open."""
        return [protocol for protocol in self._protocols if protocol.transport is not None
                and not getattr(protocol.transport, "disconnected", True)]

    def close_connections(self, error):
        """Send connection_close with C{error} to every client that said hello; drop the others."""
        for protocol in self.open_protocols():
            protocol.handshake.shut_down(error)
