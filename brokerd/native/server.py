"""The native protocol's server side: the connection, its hello and login, envelopes to channel calls.

Each frame is one L{Envelope}. The first must be C{hello}; after that, requests
on channel N are dispatched to the connection's channel N. Rules live in the
model and the channel; this module only translates. A channel error closes that
channel (the client answers C{channel_close_ok}), a connection error closes the
connection, and a frame that cannot be read closes only this connection.

The hello carries the client's credentials and vhost, checked by the broker's
L{brokerd.access.login.AccessControl}, the one AMQP's logins use: a refused
login is answered with connection_close 403 ACCESS_REFUSED in RabbitMQ's words
after the refusal delay (nothing more is read meanwhile), an unknown vhost or
one the user has no permissions on with 530 NOT_ALLOWED; the connection's
channels then check every operation against the user's permissions. The
channel-level requests are translated by L{brokerd.native.requests}.

Until hello, frames are capped at L{PRE_HELLO_MAX_FRAME_SIZE} bytes and a client
has L{HANDSHAKE_TIMEOUT} seconds to send it (as AMQP caps frames until tune-ok
and times out its handshake); clients refused before hello are logged at a
bounded rate (L{brokerd.wire.refusal_log}), as AMQP's refusals before login, and one
that said hello gets an accepted and a closed line (L{brokerd.wire.connection_log}).
A connection has at most C{channel_max} channels open, whatever their numbers.
Management requests (users, vhosts, permissions) go to L{brokerd.native.access_requests}.
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

import brokerd
from brokerd.access.login import EXTERNAL, LOGIN_REFUSAL_DELAY, PASSWORD_MECHANISMS, PLAIN, AccessControl, LoginRefused
from brokerd.errors import (
    AccessRefused,
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
from brokerd.native.framing import PROTOCOL_VERSION, FrameReceiver
from brokerd.native.peer import NativeChannelPeer
from brokerd.native.requests import ChannelRequests
from brokerd.proto.native_pb2 import Envelope
from brokerd.session.connection import HANDSHAKE_TIMEOUT, NATIVE, Connection
from brokerd.wire.backpressure import LARGE_PARTIAL_FRAME, SLOW_READER, PublisherGate, reading_pauses
from brokerd.wire.connection_log import ConnectionRecord, client_text, lost_reason, peer_address, peer_host
from brokerd.wire.hangup_watch import HangupWatch
from brokerd.wire.read_buffer import read_in_large_pieces
from brokerd.wire.refusal_log import RefusalLog

DEFAULT_MAX_FRAME_SIZE = 128 * 1024 * 1024 + 64 * 1024  # a 128 MiB body plus room for its properties
EMPTY_FRAME = b"\x00\x00\x00\x00"  # a frame holding an empty envelope: a no-op for clients
PRE_HELLO_MAX_FRAME_SIZE = 4096  # the largest frame before hello (AMQP's limit before tune-ok)
DEFAULT_CHANNEL_MAX = 2047  # channels open at once on one connection (AMQP's default channel_max)

log = Logger()


@implementer(IPushProducer)
class NativeServerProtocol(ChannelRequests, FrameReceiver):
    """One client connection speaking the native protocol."""

    management = None  # the listener's IAccessCommands (None: management requests are refused)

    def __init__(
        self, broker, max_frame_size=DEFAULT_MAX_FRAME_SIZE, channel_max=DEFAULT_CHANNEL_MAX, refusal_log=None,
        authenticator=None, refusal_delay=LOGIN_REFUSAL_DELAY,
    ):
        """
        @param authenticator: the broker's L{brokerd.access.interfaces.IAccessControl}
            (the one AMQP logins use); without one, guest/guest in memory.
        @param refusal_delay: seconds a refused login waits for its answer.
        """
        FrameReceiver.__init__(self, broker.clock, broker.watermark)
        self.broker = broker
        self.refusal_log = refusal_log or RefusalLog(protocol="native", before="hello")  # the listener's, shared
        self.authenticator = authenticator if authenticator is not None else AccessControl()
        self.refusal_delay = refusal_delay
        self.max_frame_size = max_frame_size  # the frame limit once hello is done
        self.MAX_LENGTH = PRE_HELLO_MAX_FRAME_SIZE
        self.channel_max = channel_max
        self.connection = None  # the model's Connection, once hello is done
        self._closing_channels = set()  # closed by us, awaiting channel_close_ok
        self._gate = None  # pauses reading from us while the broker is blocked
        self._hello_timeout = None
        self._refusal_call = None  # a refused login's answer, waiting out the refusal delay
        self._resume_call = None
        self._record = None  # the connection as logged once hello is answered (brokerd.wire.connection_log)
        self._close_reason = None  # why it ends, for its closing log line

    # -- transport events

    def connectionMade(self):
        # Confirms and small replies must not wait for the client's delayed ACK (Nagle).
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        read_in_large_pieces(self.transport)
        self.read_pauses = reading_pauses(self.transport)
        self.read_pauses.on_resume = self._parse_held_back
        self.read_pauses.hangup_watch = HangupWatch(self.transport, self.clock, self._probe_paused_peer)
        self.transport.registerProducer(self, True)
        self._hello_timeout = self.clock.callLater(HANDSHAKE_TIMEOUT, self._hello_timed_out)

    def connectionLost(self, reason):
        FrameReceiver.connectionLost(self, reason)
        if self._record is not None:
            self._record.close(self._close_reason or lost_reason(reason), self.clock.seconds())
        for call in (self._hello_timeout, self._refusal_call, self._resume_call):
            if call is not None and call.active():
                call.cancel()
        self._hello_timeout = self._refusal_call = self._resume_call = None
        if self.read_pauses is not None:
            self.read_pauses.close()
        if self._gate is not None:
            self._gate.close()
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _probe_paused_peer(self):
        """An empty frame (an envelope with nothing in it, which clients ignore) to a client we are
        not reading and that holds memory, so that one that went away is noticed
        (L{brokerd.wire.hangup_watch}); not to one that does not read what we write."""
        if self.writes.idle and SLOW_READER not in self.read_pauses.reasons and self.transport is not None:
            held = self._read_buffer.partial_frame_bytes if self._read_buffer is not None else 0
            if self.connection is not None:
                held += self.connection.held_bytes()
            if held >= LARGE_PARTIAL_FRAME:
                self.transport.write(EMPTY_FRAME)

    def _hello_timed_out(self):
        self._hello_timeout = None
        if self.connection is None:
            self._refused(f"no hello within {HANDSHAKE_TIMEOUT:.0f} s")
            self.stopped_reading = True
            self.transport.abortConnection()

    def dataReceived(self, data):
        if self.connection is not None:
            self.connection.bytes_received += len(data)
        FrameReceiver.dataReceived(self, data)

    def lengthLimitExceeded(self, length):
        when = "" if self.connection is not None else " before hello"
        self._close_connection(
            FrameError(f"frame of {length} bytes is larger than the limit of {self.MAX_LENGTH} bytes{when}")
        )

    def partialFrameReceived(self):
        # The start of a large frame holds memory: like a publish, it is gated while the broker is blocked.
        if (
            self.watermark.blocked
            and self.connection is not None
            and self._read_buffer.partial_frame_bytes >= LARGE_PARTIAL_FRAME
        ):
            self._publisher_gate().check()

    def _publisher_gate(self):
        if self._gate is None:
            self._gate = PublisherGate(self.watermark, self.transport)
        return self._gate

    # -- IPushProducer: the transport tells us when the client is not reading what we write

    def pauseProducing(self):
        self.writes.pause()
        self.read_pauses.pause(SLOW_READER)
        if self.connection is not None:
            self.connection.pause_deliveries()

    def resumeProducing(self):
        self.writes.resume()
        self.read_pauses.resume(SLOW_READER)
        if self.connection is not None:
            self.connection.resume_deliveries()

    def stopProducing(self):
        self.writes.release()

    def _parse_held_back(self):
        """Reading resumed: parse what was read but held back, on the next turn (not inside a release)."""
        if self._resume_call is None or not self._resume_call.active():
            self._resume_call = self.clock.callLater(0, self._parse_now)

    def _parse_now(self):
        self._resume_call = None
        if not self.read_pauses.reasons and not self.stopped_reading:
            self.dataReceived(b"")

    def stringReceived(self, frame):
        envelope = Envelope()
        try:
            envelope.ParseFromString(frame)
        except DecodeError as problem:
            self._close_connection(FrameError(f"frame of {len(frame)} bytes is not a valid envelope: {problem}"))
            return
        kind = envelope.WhichOneof("payload")
        channel_id = envelope.channel
        if channel_id in self._closing_channels:
            # AMQP: once we close a channel, its frames are dropped until the client's close-ok.
            if kind == "channel_close_ok":
                self._closing_channels.discard(channel_id)
            elif kind == "channel_close":
                self._closing_channels.discard(channel_id)
                self.on_channel_close(envelope, envelope.channel_close)
            return
        try:
            handler = self._handlers.get(kind)
            if handler is None:
                raise self._unknown(kind)
            if self.connection is None and kind != "hello":
                raise UnexpectedFrame(f"expected hello as the first frame, got {kind}")
            handler(self, envelope, getattr(envelope, kind))
        except ChannelError as error:
            self._close_channel(channel_id, error, envelope.correlation_id)
        except BrokerError as error:
            self._close_connection(error)
        except Exception:
            log.failure("native request {kind} on channel {channel} failed", kind=kind, channel=channel_id)
            self._close_connection(InternalError(f"the broker failed to handle {kind}; see its log"))

    @staticmethod
    def _unknown(kind):
        if kind is None:
            return MethodNotImplemented("frame carries no request this broker knows")
        return CommandInvalid(f"{kind} is sent by the server, not the client")

    # -- replies

    @staticmethod
    def _reply_to(request):
        """An empty envelope answering C{request} (same channel and correlation id)."""
        return Envelope(channel=request.channel, correlation_id=request.correlation_id)

    def _ok(self, request):
        reply = self._reply_to(request)
        reply.ok.SetInParent()
        self.sendFrame(reply.SerializeToString())

    def _close_channel(self, channel_id, error, correlation_id=0):
        log.debug("closing channel {channel}: {error}", channel=channel_id, error=error)
        if self.connection is not None:
            self.connection.close_channel(channel_id)
        self._closing_channels.add(channel_id)
        envelope = Envelope(channel=channel_id, correlation_id=correlation_id)
        envelope.channel_close.reply_code = error.reply_code
        envelope.channel_close.reply_text = error.reply_text
        self.sendFrame(envelope.SerializeToString())

    def _close_connection(self, error):
        if self._record is None:
            self._refused(error)
        elif self._close_reason is None:
            self._close_reason = f"the broker closed it: {error}"
        self.stopped_reading = True
        envelope = Envelope()
        envelope.connection_close.reply_code = error.reply_code
        envelope.connection_close.reply_text = error.reply_text
        self.sendFrame(envelope.SerializeToString())
        self.closeAfterFlush()

    def _refused(self, error):
        """A client refused before hello: logged at a bounded rate with every other (L{RefusalLog})."""
        self.refusal_log.refused(self.clock, peer_host(self.transport), peer_address(self.transport), error)

    # -- connection

    def on_hello(self, envelope, hello):
        """
        The client's hello: its credentials are checked as AMQP's are (a
        refused login is answered with 403 after the refusal delay), then its
        vhost (530 at once, as AMQP's connection.open); the connection's
        channels check every operation against the user's permissions there.
        """
        if self.connection is not None or self._refusal_call is not None:
            raise CommandInvalid("hello was already received on this connection")
        if hello.protocol_version != PROTOCOL_VERSION:
            raise CommandInvalid(
                f"client speaks native protocol version {hello.protocol_version}; this broker speaks {PROTOCOL_VERSION}"
            )
        try:
            user = self._logged_in_user(hello)
        except LoginRefused as refused:
            self._refuse_login(AccessRefused(str(refused)))
            return
        vhost = hello.vhost or "/"
        access = self.authenticator.check_vhost_access(user, vhost)
        self.connection = Connection(self.broker, vhost, hello.client_name, NATIVE, self.transport, user,
                                     access=access)
        self.writes.counted = self.connection
        self.connection.closer = self._close_connection
        self.MAX_LENGTH = self.max_frame_size
        if self._hello_timeout is not None and self._hello_timeout.active():
            self._hello_timeout.cancel()
        self._hello_timeout = None
        reply = self._reply_to(envelope)
        reply.hello_ok.protocol_version = PROTOCOL_VERSION
        reply.hello_ok.server_version = brokerd.__version__
        reply.hello_ok.max_frame_size = self.max_frame_size
        self.sendFrame(reply.SerializeToString())
        self._record = ConnectionRecord(
            "native", self.transport, user, self.connection.vhost.name,
            client_text(hello.client_name) or "unnamed client", self.clock.seconds(),
        )

    def _logged_in_user(self, hello):
        """The user C{hello}'s credentials log in, by its mechanism (PLAIN unless it names EXTERNAL)."""
        authenticator = self.authenticator
        # PLAIN is the native protocol's password login, allowed while AMQP allows one (PLAIN or AMQPLAIN).
        offered = [PLAIN] if not PASSWORD_MECHANISMS.isdisjoint(authenticator.mechanisms) else []
        if EXTERNAL in authenticator.mechanisms:
            offered.append(EXTERNAL)
        mechanism = hello.mechanism or PLAIN
        if mechanism not in offered:
            raise LoginRefused(f"unsupported authentication mechanism {client_text(mechanism)!r}; use one of"
                               f" {', '.join(offered)}")  # cut: a stranger's text goes into the log
        if mechanism == EXTERNAL:
            return authenticator.check_certificate_login(peer_host(self.transport), self.transport)
        return authenticator.check_password_login(PLAIN, hello.username, hello.password.encode(),
                                                  peer_host(self.transport))

    def _refuse_login(self, error):
        """A refused login: nothing more is read, and C{error} is sent after the refusal delay, as AMQP's is."""
        self.stopped_reading = True
        if self._hello_timeout is not None and self._hello_timeout.active():
            self._hello_timeout.cancel()
        self._hello_timeout = None
        self._refusal_call = self.clock.callLater(self.refusal_delay, self._close_connection, error)

    def on_connection_close(self, envelope, close):
        if self._close_reason is None:
            self._close_reason = f"the client closed it: {close.reply_code} {client_text(close.reply_text)!r}"
        self.stopped_reading = True
        reply = self._reply_to(envelope)
        reply.connection_close_ok.SetInParent()
        self.sendFrame(reply.SerializeToString())
        self.closeAfterFlush()

    def on_connection_close_ok(self, envelope, close_ok):
        self.closeAfterFlush()

    # -- channels

    def on_channel_open(self, envelope, open_):
        if envelope.channel == 0:
            raise InvalidChannel("channel 0 is the connection itself and cannot be opened")
        opened = len(self.connection.channels) + len(self._closing_channels)
        if opened >= self.channel_max and envelope.channel not in self.connection.channels:
            raise NotAllowed(f"number of channels opened ({opened}) has reached the channel_max ({self.channel_max})")
        self.connection.open_channel(envelope.channel, NativeChannelPeer(self, envelope.channel))
        self._ok(envelope)

    def on_channel_close(self, envelope, close):
        self.connection.close_channel(envelope.channel)
        reply = self._reply_to(envelope)
        reply.channel_close_ok.SetInParent()
        self.sendFrame(reply.SerializeToString())

    def on_channel_close_ok(self, envelope, close_ok):
        pass  # only meaningful while we wait for it, handled in stringReceived

    on_management_request = answer_management_request

    _handlers = {}


NativeServerProtocol._handlers = {
    name[len("on_") :]: function
    for cls in reversed(NativeServerProtocol.__mro__)
    for name, function in vars(cls).items()
    if name.startswith("on_")
}


class NativeServerFactory(ServerFactory):
    """Makes a L{NativeServerProtocol} per client of one broker."""

    noisy = False

    def __init__(self, broker, max_frame_size=DEFAULT_MAX_FRAME_SIZE, channel_max=DEFAULT_CHANNEL_MAX,
                 authenticator=None, refusal_delay=LOGIN_REFUSAL_DELAY):
        """
        @param authenticator: the broker's L{brokerd.access.interfaces.IAccessControl},
            the object AMQP logins use, so that one access database serves both
            protocols; without one, guest/guest in memory.
        @param refusal_delay: seconds a refused login waits for its answer.
        """
        self.broker = broker
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.authenticator = authenticator if authenticator is not None else AccessControl()
        self.refusal_delay = refusal_delay
        self.management = management_serving(broker, self.authenticator)
        self.refusal_log = RefusalLog(protocol="native", before="hello")
        self._protocols = weakref.WeakSet()  # every connection made, to close them at shutdown

    def stopFactory(self):
        self.refusal_log.stop()

    def buildProtocol(self, address):
        protocol = NativeServerProtocol(self.broker, self.max_frame_size, self.channel_max, self.refusal_log,
                                        self.authenticator, self.refusal_delay)
        protocol.factory, protocol.management = self, self.management
        self._protocols.add(protocol)
        return protocol

    def open_protocols(self):
        """The connections whose sockets are still open."""
        return [protocol for protocol in self._protocols if protocol.transport is not None
                and not getattr(protocol.transport, "disconnected", True)]

    def close_connections(self, error):
        """Send connection_close with C{error} to every client that said hello; drop the others."""
        for protocol in self.open_protocols():
            if protocol.connection is not None and not protocol.stopped_reading:
                protocol._close_connection(error)
            else:
                protocol.stopped_reading = True
                protocol.transport.loseConnection()
