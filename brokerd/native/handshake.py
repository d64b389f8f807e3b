"""The connection-level side of the native server: hello, login, limits, closing.

The server protocol (L{brokerd.native.server.NativeServerProtocol}) holds one
L{NativeHandshake} per connection and hands it the connection's own requests:
hello, connection_close and connection_close_ok. The handshake owns what
lives as long as the connection: the model's L{Connection} it makes on hello,
the L{PublisherGate} that holds the client back while the broker is blocked,
the hello timeout, a refused login's delayed answer, the connection's log
lines, and closing the connection in both directions. What it asks of the
protocol is L{IEnvelopeReader}: a larger frame limit once hello is done, and
no more reading once the connection is closing.

The hello carries the client's protocol version, credentials and vhost,
checked by the broker's L{brokerd.access.login.AccessControl}, the one AMQP's
logins use: a refused login is answered with connection_close 403
ACCESS_REFUSED in RabbitMQ's words after the refusal delay (nothing more is
read meanwhile), an unknown vhost or one the user has no permissions on with
530 NOT_ALLOWED; the connection's channels then check every operation against
the user's permissions.

Until hello, frames are capped at L{PRE_HELLO_MAX_FRAME_SIZE} bytes and a
client has L{HANDSHAKE_TIMEOUT} seconds to send it (as AMQP caps frames until
tune-ok and times out its handshake); clients refused before hello are logged
at a bounded rate (L{brokerd.wire.refusal_log}), as AMQP's refusals before
login, and one that said hello gets an accepted and a closed line
(L{brokerd.wire.connection_log}).
"""

from zope.interface import Attribute, Interface

import brokerd
from brokerd.access.login import (
    EXTERNAL,
    LOGIN_REFUSAL_DELAY,
    PASSWORD_MECHANISMS,
    PLAIN,
    AccessControl,
    LoginRefused,
)
from brokerd.errors import AccessRefused, CommandInvalid
from brokerd.native.framing import PROTOCOL_VERSION
from brokerd.native.replies import reply_to
from brokerd.proto.native_pb2 import Envelope
from brokerd.session.connection import HANDSHAKE_TIMEOUT, NATIVE, Connection
from brokerd.wire.backpressure import PublisherGate
from brokerd.wire.connection_log import (
    ConnectionRecord,
    client_text,
    lost_reason,
    peer_address,
    peer_host,
)
from brokerd.wire.refusal_log import RefusalLog

# A 128 MiB body plus room for its properties:
DEFAULT_MAX_FRAME_SIZE = 128 * 1024 * 1024 + 64 * 1024
PRE_HELLO_MAX_FRAME_SIZE = 4096  # the largest frame before hello (AMQP's limit before tune-ok)
DEFAULT_CHANNEL_MAX = 2047  # channels open at once on one connection (AMQP's default channel_max)


class NativeSettings:
    """
    What a native listener offers in hello_ok and enforces, shared by its connections.

    @ivar authenticator: the broker's L{brokerd.access.interfaces.IAccessControl}
        (the one AMQP logins use, so that one access database serves both
        protocols); without one, guest/guest in memory.
    @ivar max_frame_size: the largest frame once hello is done.
    @ivar channel_max: how many channels a connection may have open at once, whatever their numbers.
    @ivar refusal_delay: seconds a refused login waits for its answer.
    @ivar refusal_log: the listener's log of clients refused before hello, at a bounded rate.
    """

    def __init__(
        self, authenticator=None, max_frame_size=DEFAULT_MAX_FRAME_SIZE,
        channel_max=DEFAULT_CHANNEL_MAX, refusal_delay=LOGIN_REFUSAL_DELAY,
    ):
        self.authenticator = authenticator if authenticator is not None else AccessControl()
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.refusal_delay = refusal_delay
        self.refusal_log = RefusalLog(protocol="native", before="hello")


class IEnvelopeReader(Interface):
    """
    The server protocol as the handshake it holds sees it: the reading side
    of one native connection. The handshake decides; the reader keeps the
    bytes and the frame limit.
    """

    stopped_reading = Attribute(
        "True once no more frames are read from the client: the connection is closing."
    )

    def limit_frames(max_frame_size):
        """Frames from now on may be C{max_frame_size} bytes long: hello is done."""

    def stop_reading():
        """Read no more frames: the connection is closing, or a refusal is on its way."""

    def close_channel(channel_id, error):
        """The broker closes channel C{channel_id} for C{error} (a delivery not acked in time)."""


class NativeHandshake:
    """
    The connection-level side of one native connection: its hello and login,
    its limits, its timers and its closing. Held by the connection's server
    protocol, which hands it the connection-level requests.

    @ivar connection: the model's L{Connection}, from hello until the connection is lost.
    @ivar gate: the L{PublisherGate} that holds the client back while the broker is
        blocked, from hello on.
    """

    def __init__(self, reader, broker, settings, writes):
        """
        @param reader: the L{IEnvelopeReader} holding this handshake.
        @param settings: the listener's L{NativeSettings}.
        @param writes: the connection's L{brokerd.wire.write_buffer.WriteBuffer}.
        """
        self._reader = reader
        self._broker = broker
        self._clock = broker.clock
        self._settings = settings
        self._writes = writes
        self.transport = None
        self.connection = None
        self.gate = None
        self._hello_timeout = None
        self._refusal_call = None  # a refused login's answer, waiting out the refusal delay
        # The connection as logged once hello is answered (brokerd.wire.connection_log):
        self._record = None
        self._close_reason = None  # why it ends, for its closing log line

    # -- transport events, from the reader

    def connection_made(self, transport):
        self.transport = transport
        self._hello_timeout = self._clock.callLater(HANDSHAKE_TIMEOUT, self._hello_timed_out)

    def connection_lost(self, reason):
        if self._record is not None:
            self._record.close(self._close_reason or lost_reason(reason), self._clock.seconds())
        for call in (self._hello_timeout, self._refusal_call):
            if call is not None and call.active():
                call.cancel()
        self._hello_timeout = self._refusal_call = None
        if self.gate is not None:
            self.gate.close()
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _hello_timed_out(self):
        self._hello_timeout = None
        if self.connection is None:
            self._refused(f"no hello within {HANDSHAKE_TIMEOUT:.0f} s")
            self._reader.stop_reading()
            self.transport.abortConnection()

    # -- hello

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
                f"client speaks native protocol version {hello.protocol_version};"
                f" this broker speaks {PROTOCOL_VERSION}"
            )
        try:
            user = self._logged_in_user(hello)
        except LoginRefused as refused:
            self._refuse_login(AccessRefused(str(refused)))
            return
        settings = self._settings
        vhost = hello.vhost or "/"
        authenticator = settings.authenticator
        access = authenticator.check_vhost_access(user, vhost, self._broker.connections)
        self.connection = Connection(
            self._broker, vhost, hello.client_name, NATIVE, self.transport, user, access=access,
            limits=authenticator.limits, auth_mechanism=hello.mechanism or PLAIN,
        )
        self._writes.counted = self.connection
        self.connection.closer = self.close
        self.connection.channel_closer = self._reader.close_channel
        self.gate = PublisherGate(self._broker.watermark, self.transport,
                                  disk_alarm=self._broker.disk_alarm,
                                  in_sync_alarm=self._broker.in_sync_alarm)
        self._reader.limit_frames(settings.max_frame_size)
        if self._hello_timeout is not None and self._hello_timeout.active():
            self._hello_timeout.cancel()
        self._hello_timeout = None
        reply = reply_to(envelope)
        reply.hello_ok.protocol_version = PROTOCOL_VERSION
        reply.hello_ok.server_version = brokerd.__version__
        reply.hello_ok.max_frame_size = settings.max_frame_size
        self._writes.send_frame(reply.SerializeToString())
        self._record = ConnectionRecord(
            "native", self.transport, user, self.connection.vhost.name,
            client_text(hello.client_name) or "unnamed client", self._clock.seconds(),
        )

    def _logged_in_user(self, hello):
        """
        The user C{hello}'s credentials log in, by its mechanism (PLAIN unless
        it names EXTERNAL).
        """
        authenticator = self._settings.authenticator
        # PLAIN is the native protocol's password login, allowed while AMQP
        # allows one (PLAIN or AMQPLAIN).
        offered = [PLAIN] if not PASSWORD_MECHANISMS.isdisjoint(authenticator.mechanisms) else []
        if EXTERNAL in authenticator.mechanisms:
            offered.append(EXTERNAL)
        mechanism = hello.mechanism or PLAIN
        if mechanism not in offered:
            raise LoginRefused(  # cut: a stranger's text goes into the log
                f"unsupported authentication mechanism {client_text(mechanism)!r}; use one of"
                f" {', '.join(offered)}"
            )
        if mechanism == EXTERNAL:
            return authenticator.check_certificate_login(peer_host(self.transport), self.transport)
        return authenticator.check_password_login(PLAIN, hello.username, hello.password.encode(),
                                                  peer_host(self.transport))

    def _refuse_login(self, error):
        """
        A refused login: nothing more is read, and C{error} is sent after the
        refusal delay, as AMQP's is.
        """
        self._reader.stop_reading()
        if self._hello_timeout is not None and self._hello_timeout.active():
            self._hello_timeout.cancel()
        self._hello_timeout = None
        self._refusal_call = self._clock.callLater(self._settings.refusal_delay, self.close, error)

    def _refused(self, error):
        """
        A client refused before hello: logged at a bounded rate with every
        other (L{RefusalLog}).
        """
        transport = self.transport
        self._settings.refusal_log.refused(
            self._clock, peer_host(transport), peer_address(transport), error
        )

    # -- closing

    def on_connection_close(self, envelope, close):
        """The client closes the connection: answer close_ok and hang up once it is sent."""
        if self._close_reason is None:
            self._close_reason = (
                f"the client closed it: {close.reply_code} {client_text(close.reply_text)!r}"
            )
        self._reader.stop_reading()
        reply = reply_to(envelope)
        reply.connection_close_ok.SetInParent()
        self._writes.send_frame(reply.SerializeToString())
        self._writes.flush_and_close()

    def on_connection_close_ok(self, envelope, close_ok):
        """The client answered our connection_close: hang up once what is queued is sent."""
        self._writes.flush_and_close()

    def close(self, error):
        """
        The broker closes the connection for C{error}: nothing more is read,
        connection_close goes out and the socket closes once it is sent. A
        client that had not said hello is logged as refused.
        """
        if self._record is None:
            self._refused(error)
        elif self._close_reason is None:
            self._close_reason = f"the broker closed it: {error}"
        self._reader.stop_reading()
        envelope = Envelope()
        envelope.connection_close.reply_code = error.reply_code
        envelope.connection_close.reply_text = error.reply_text
        self._writes.send_frame(envelope.SerializeToString())
        self._writes.flush_and_close()

    def shut_down(self, error):
        """
        The broker stops: close with C{error} if the client said hello and is
        not closing already, else hang up.
        """
        if self.connection is not None and not self._reader.stopped_reading:
            self.close(error)
        else:
            self._reader.stop_reading()
            self.transport.loseConnection()
