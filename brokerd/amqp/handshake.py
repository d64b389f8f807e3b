"""The connection-level side of the AMQP server: handshake, heartbeats, timeouts, close.

The frame receiver (L{brokerd.amqp.server.AmqpServerProtocol}) holds one
L{AmqpHandshake} per connection and hands it every channel-0 frame: start /
start-ok (credentials checked by L{brokerd.amqp.auth}) / tune / tune-ok / open
(the vhost and the user's permissions on it checked by L{brokerd.access.login}),
update-secret (accepted, as RabbitMQ's internal users backend does),
connection.close in both directions, and connection.blocked / unblocked while
the broker holds publishers back. The handshake also owns the connection's
timers (the handshake timeout, the refusal delay, the wait for close-ok,
heartbeats both ways), the model's L{Connection} it creates on
connection.open, and the connection's log lines.
What it asks of the receiver is L{IFrameReader}: when the client last sent
bytes, the frame limit, and dropping unread bytes and channels on close.

Until a client has logged in it is a stranger: a channel-0 method is checked
against the handshake's state from its index alone, before its arguments are
decoded, and any error (a refused login, a malformed or misplaced frame) is
answered only after L{brokerd.access.login.LOGIN_REFUSAL_DELAY}, as RabbitMQ
delays a failed handshake, so that guessing passwords is slow. Nothing more is
read from such a connection, other clients are served meanwhile, and the
refusals are logged at a bounded rate (L{brokerd.wire.refusal_log.RefusalLog}).
"""

from functools import partial

from pamqp import commands
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import Interface

import brokerd
from brokerd.amqp import frames
from brokerd.amqp.auth import LoginRefused
from brokerd.amqp.blocked_notice import MEMORY_ALARM, OVER_SHARE, BlockedNotice, alarm_reason
from brokerd.amqp.settings import SERVER_CAPABILITIES
from brokerd.amqp.table_arguments import decode_method
from brokerd.errors import (
    AccessRefused,
    CommandInvalid,
    FrameError,
    FrameSyntaxError,
    InvalidChannel,
    MethodNotImplemented,
    NotAllowed,
)
from brokerd.session.connection import AMQP_0_9_1, HANDSHAKE_TIMEOUT, Connection
from brokerd.wire.backpressure import PublisherGate
from brokerd.wire.connection_log import (
    ConnectionRecord,
    client_text,
    describe_amqp_client,
    lost_reason,
    peer_address,
    peer_host,
)

log = Logger()

CLOSE_OK_TIMEOUT = 5.0

# Handshake states, in order.
(
    AWAITING_HEADER, AWAITING_START_OK, AUTHENTICATING, AWAITING_TUNE_OK, AWAITING_OPEN, OPEN,
    CLOSING,
) = range(7)


class IFrameReader(Interface):
    """
    The frame receiver as the handshake that it holds sees it: the reading
    side of one AMQP connection. The handshake decides; the reader keeps the
    bytes, the frame limit and the channels.
    """

    def last_read():
        """
        When the client last sent bytes, on the connection's clock, for the
        heartbeat check: now, while its bytes wait unread (the broker is
        blocked, or the client does not read), as its heartbeats wait too.
        """

    def limit_frames(frame_max):
        """Frames from now on may be C{frame_max} bytes long, as tune-ok negotiated."""

    def drop_unread():
        """Forget what was read and not parsed yet: the connection is closing."""

    def refuse_reading(refusing):
        """
        With C{refusing} true, drop what is unread and read nothing more (a
        refusal is on its way); with false, read again.
        """

    def forget_channels():
        """The connection closed: its channels, with the contents they were assembling, are gone."""

    def close_channel(channel_id, error):
        """The broker closes channel C{channel_id} for C{error} (a delivery not acked in time)."""


class AmqpHandshake:
    """
    The connection-level side of one AMQP connection: its handshake state,
    the channel-0 methods, heartbeats, timeouts and closing. Held by the
    connection's frame receiver, which hands it the channel-0 frames.

    @ivar broker: the broker the connection is a client of.
    @ivar state: where the connection is, from L{AWAITING_HEADER} to L{CLOSING}.
    @ivar user: who logged in, or None.
    @ivar connection: the model's L{Connection}, from connection.open until the connection closes.
    @ivar gate: the L{PublisherGate} that holds the client back while the broker
        is blocked, once open.
    @ivar frame_max: the negotiated frame size (the server's until tune-ok).
    @ivar channel_max: the negotiated number of channels open at once.
    @ivar heartbeat: the negotiated heartbeat interval in seconds (0: none).
    @ivar client_properties: the client properties of the client's start-ok.
    @ivar client_capabilities: the capabilities table among them.
    """

    def __init__(self, reader, broker, settings, writes, inbound=None):
        """
        @param reader: the L{IFrameReader} holding this handshake.
        @param writes: the connection's L{brokerd.wire.write_buffer.WriteBuffer}.
        @param inbound: the connection's L{brokerd.wire.connection_memory.ConnectionMemory}.
        """
        self._inbound = inbound
        self._blocked = BlockedNotice(writes)
        self._alarm_reason = None  # what the broker's alarms told the client
        self._reader = reader
        self.broker = broker
        self._clock = broker.clock
        self._settings = settings
        self._writes = writes
        self.transport = None
        self.state = AWAITING_HEADER
        self.user = None
        self.connection = None
        self.gate = None
        self.frame_max = settings.frame_max
        self.channel_max = settings.channel_max
        self.heartbeat = 0
        self.client_properties = {}
        self.auth_mechanism = None  # the SASL mechanism of start-ok
        self.client_capabilities = {}
        self._timeout_call = None
        self._heartbeat_loop = None
        self._record = None  # the connection as logged once accepted (brokerd.wire.connection_log)
        self._close_reason = None  # why it ends, for its closing log line

    # -- transport events, from the reader

    def connection_made(self, transport):
        self.transport = transport
        self._timeout_call = self._clock.callLater(HANDSHAKE_TIMEOUT, self._handshake_timed_out)

    def connection_lost(self, reason):
        self.state = CLOSING
        self._log_closed(reason)
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = None
        if self._heartbeat_loop is not None and self._heartbeat_loop.running:
            self._heartbeat_loop.stop()
        if self.gate is not None:
            self.gate.close()
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def header_received(self):
        """The client sent AMQP 0-9-1's protocol header: offer connection.start."""
        self.state = AWAITING_START_OK
        start = commands.Connection.Start(
            server_properties={
                "product": "brokerd",
                "version": brokerd.__version__,
                "platform": "Python/Twisted",
                "information": "https://pypi.org/project/brokerd/",
                "capabilities": SERVER_CAPABILITIES,
                **self._settings.node_properties,
            },
            mechanisms=" ".join(self._settings.authenticator.offered_mechanisms(self.transport)),
            locales="en_US",
        )
        self._writes.send(frames.method_frame(0, start))

    def wrong_header(self, problem):
        """The client's first bytes are not AMQP 0-9-1's header: answer with ours and hang up."""
        self._refused(problem)
        self.state = CLOSING
        self.transport.write(frames.PROTOCOL_HEADER)
        self.transport.loseConnection()

    def _blocked_changed(self, blocked, reason=MEMORY_ALARM):
        """Tell a client that understands connection.blocked why its publishes stall."""
        if self.client_capabilities.get("connection.blocked") and self.state == OPEN:
            self._blocked.change(reason, blocked)

    def _alarms_changed(self, blocked_by):
        """The broker's resource alarms (C{blocked_by}) hold this publisher, or no longer do."""
        if blocked_by:
            self._alarm_reason = alarm_reason(blocked_by, self.broker.in_sync_alarm)
        self._blocked_changed(bool(blocked_by), self._alarm_reason)

    # -- the connection handshake and close

    def method_frame(self, index, data, start, end):
        """
        A method frame on channel 0 whose arguments are C{data[start:end]}.
        Its place in the handshake is checked from C{index} before anything is
        decoded, so a stranger cannot make the broker decode what it would refuse.
        """
        if self.state == CLOSING:
            if index == _CONNECTION_CLOSE:
                self._writes.send(frames.method_frame(0, commands.Connection.CloseOk()))
                self._writes.flush_and_close()
            elif index == _CONNECTION_CLOSE_OK:
                self._writes.flush_and_close()
            return
        expected = _CONNECTION_METHODS.get(index)
        if expected is None:
            name = frames.method_name(index)
            if index not in commands.INDEX_MAPPING:
                raise MethodNotImplemented(
                    f"unknown method class {index >> 16} id {index & 0xFFFF}"
                )
            if index >> 16 == 10:
                raise CommandInvalid(f"{name} is not expected from a client")
            if self.state == OPEN:  # RabbitMQ's code and words; channel 0 is never a channel
                raise InvalidChannel(
                    f"unexpected method in connection state running: {name} on channel 0"
                )
            raise CommandInvalid(f"{name} on channel 0, which carries only connection methods")
        state, handler = expected
        if state is not None and self.state != state:
            raise CommandInvalid(
                f"{frames.method_name(index)} is out of order in the connection handshake"
            )
        handler(self, decode_method(index, data, start, end, FrameSyntaxError))

    def frame_too_large(self, length):
        """The error for a frame whose payload of C{length} bytes is over the limit."""
        size = length + frames.FRAME_OVERHEAD
        if self.state < AWAITING_OPEN:
            return FrameError(
                f"frame of {size} bytes exceeds {frames.FRAME_MIN_SIZE} bytes,"
                " the largest allowed before connection.tune-ok"
            )
        return FrameError(f"frame of {size} bytes exceeds frame_max {self.frame_max}")

    def on_start_ok(self, method):
        self.client_properties = method.client_properties or {}
        capabilities = self.client_properties.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        self.state = AUTHENTICATING
        response = method.response
        self.auth_mechanism = method.mechanism
        if isinstance(response, str):
            response = response.encode()  # pamqp decoded these bytes as UTF-8: the same bytes again
        d = self._settings.authenticator.login(
            method.mechanism, response, peer_host(self.transport), self.transport
        )
        d.addCallbacks(self._logged_in, self._login_refused)

    def _logged_in(self, user):
        if self.state != AUTHENTICATING:
            return
        self.user = user
        self.state = AWAITING_TUNE_OK
        settings = self._settings
        tune = commands.Connection.Tune(
            channel_max=settings.channel_max, frame_max=settings.frame_max,
            heartbeat=settings.heartbeat,
        )
        self._writes.send(frames.method_frame(0, tune))

    def _login_refused(self, failure):
        if self.state != AUTHENTICATING:
            return
        if failure.check(LoginRefused):
            reason = str(failure.value)
        else:
            log.failure(
                "checking the login of {peer} failed", failure, peer=peer_address(self.transport)
            )
            reason = "the broker could not check the login; see its log"
        self.close(AccessRefused(reason))

    def on_tune_ok(self, method):
        settings = self._settings
        if method.frame_max and not frames.FRAME_MIN_SIZE <= method.frame_max <= settings.frame_max:
            raise NotAllowed(
                f"frame_max {method.frame_max} is outside"
                f" {frames.FRAME_MIN_SIZE}..{settings.frame_max}"
            )
        if method.channel_max > settings.channel_max:
            raise NotAllowed(
                f"channel_max {method.channel_max} exceeds the server's {settings.channel_max}"
            )
        self.frame_max = method.frame_max or settings.frame_max
        self._reader.limit_frames(self.frame_max)
        self.channel_max = method.channel_max or settings.channel_max
        self.heartbeat = method.heartbeat
        if self.heartbeat:
            self._heartbeat_loop = LoopingCall(self._heartbeat_tick)
            self._heartbeat_loop.clock = self._clock
            self._heartbeat_loop.start(self.heartbeat / 2.0, now=False)
        self.state = AWAITING_OPEN

    def on_open(self, method):
        """
        connection.open: the vhost must exist and the user must have
        permissions on it (RabbitMQ's 530 and texts otherwise); the
        connection's channels check every operation against those.
        """
        vhost = method.virtual_host or "/"
        authenticator = self._settings.authenticator
        resource_access = authenticator.check_vhost_access(
            self.user, vhost, self.broker.connections
        )
        properties = self.client_properties
        name = properties.get("connection_name") or properties.get("product") or ""
        self.connection = Connection(
            self.broker, vhost, str(name), AMQP_0_9_1, self.transport, self.user, properties,
            resource_access, limits=authenticator.limits, auth_mechanism=self.auth_mechanism,
        )
        self.connection.tuning = {
            "channel_max": self.channel_max, "frame_max": self.frame_max, "timeout": self.heartbeat,
        }
        self._writes.counted = self.connection
        if self._inbound is not None:  # its transactions count against the connection's share
            self.connection.inbound = self._inbound
            self._inbound.on_blocked = partial(self._blocked_changed, reason=OVER_SHARE)
        self.connection.closer = self.close
        self.connection.channel_closer = self._reader.close_channel
        self.gate = PublisherGate(self.broker.watermark, self.transport, self._alarms_changed,
                                  self.broker.disk_alarm, self.broker.in_sync_alarm)
        self.state = OPEN
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = None
        self._writes.send(frames.method_frame(0, commands.Connection.OpenOk()))
        self._record = ConnectionRecord(
            "AMQP", self.transport, self.user, self.connection.vhost.name,
            describe_amqp_client(self.client_properties), self._clock.seconds(),
        )

    def on_update_secret(self, method):
        """
        connection.update-secret (pika and aiormq use it to refresh credentials):
        answered update-secret-ok, as RabbitMQ's internal users backend answers
        any new secret: a password cannot expire, so there is nothing to re-check
        on a connection that already logged in.
        """
        log.debug("AMQP connection {peer}: user {user!r} updated secret, reason: {reason!r}",
                  peer=peer_address(self.transport), user=self.user,
                  reason=client_text(method.reason))
        self._writes.send(frames.method_frame(0, commands.Connection.UpdateSecretOk()))

    def on_close(self, method):
        self._ending(
            f"the client closed it: {method.reply_code} {client_text(method.reply_text)!r}"
        )
        self._shut_model_connection()
        self.state = CLOSING
        self._writes.send(frames.method_frame(0, commands.Connection.CloseOk()))
        self._writes.flush_and_close()

    def close(self, error, index=0):
        """
        Send connection.close for C{error}, raised by method C{index}; the
        socket is dropped on close-ok or after a timeout. A client that has
        not logged in gets it only after the refusal delay, and reads nothing
        more meanwhile.
        """
        if self.state == CLOSING:
            return
        if self.user is None:
            self._refuse_before_login(error, index)
            return
        if self._record is None:
            log.info(
                "closing AMQP connection from {peer}: {error}",
                peer=peer_address(self.transport), error=error,
            )
        self._ending(f"the broker closed it: {error}")
        self._send_close(error, index)

    def shut_down(self, error):
        """The broker stops: close with C{error} if the client logged in, else just hang up."""
        if self.user is not None:
            self.close(error)
        else:
            self.state = CLOSING
            self.transport.loseConnection()

    def _ending(self, reason):
        """Keep why the connection ends (the first reason given) for its closing log line."""
        if self._close_reason is None:
            self._close_reason = reason

    def _log_closed(self, lost):
        """The closing log line of an accepted connection; C{lost} is the transport's reason."""
        if self._record is not None:
            self._record.close(self._close_reason or lost_reason(lost), self._clock.seconds())

    def _refused(self, problem):
        """Log (through the listener's refusal log) that the client was refused for C{problem}."""
        transport = self.transport
        self._settings.refusal_log.refused(
            self._clock, peer_host(transport), peer_address(transport), problem
        )

    def _refuse_before_login(self, error, index):
        self._refused(error)
        self.state = CLOSING
        self._reader.refuse_reading(True)
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = self._clock.callLater(
            self._settings.refusal_delay, self._refusal_delay_over, error, index
        )

    def _refusal_delay_over(self, error, index):
        self._timeout_call = None
        self._reader.refuse_reading(False)
        self._send_close(error, index)

    def _send_close(self, error, index):
        self._shut_model_connection()
        self.state = CLOSING
        self._reader.drop_unread()
        close = commands.Connection.Close(
            reply_code=error.reply_code, reply_text=frames.short_reply_text(error.reply_text),
            class_id=index >> 16, method_id=index & 0xFFFF,
        )
        self._writes.send(frames.method_frame(0, close))
        self._writes.flush()
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = self._clock.callLater(CLOSE_OK_TIMEOUT, self._writes.flush_and_close)

    def _shut_model_connection(self):
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()
        self._reader.forget_channels()

    def _handshake_timed_out(self):
        self._timeout_call = None
        if self.state < OPEN:
            if self.user is None:
                self._refused(f"no login within {HANDSHAKE_TIMEOUT:.0f} s")
            else:
                log.info(
                    "dropping {peer}: no connection.open within {seconds} s",
                    peer=peer_address(self.transport), seconds=HANDSHAKE_TIMEOUT,
                )
            self.state = CLOSING
            self.transport.abortConnection()

    def _heartbeat_tick(self):
        """
        Every half interval: drop a client silent for two intervals; send one a
        heartbeat if we were silent.
        """
        now = self._clock.seconds()
        if now - self._reader.last_read() > 2 * self.heartbeat:
            if self._record is None:
                log.info(
                    "missed heartbeats from {peer}, timeout: {seconds} s",
                    peer=peer_address(self.transport), seconds=self.heartbeat,
                )
            self._ending(f"missed heartbeats from the client, timeout: {self.heartbeat} s")
            self._heartbeat_loop.stop()
            self._shut_model_connection()
            self.state = CLOSING
            self.transport.abortConnection()
            return
        if now - self._writes.written_at >= self.heartbeat / 2.0 and self._writes.idle:
            self._writes.write_now(frames.HEARTBEAT_FRAME)


_CONNECTION_CLOSE = commands.Connection.Close.index
_CONNECTION_CLOSE_OK = commands.Connection.CloseOk.index
_CONNECTION_UPDATE_SECRET = commands.Connection.UpdateSecret.index
# method index -> (the handshake state it belongs to, or None for any, and its handler)
_CONNECTION_METHODS = {
    commands.Connection.StartOk.index: (AWAITING_START_OK, AmqpHandshake.on_start_ok),
    commands.Connection.TuneOk.index: (AWAITING_TUNE_OK, AmqpHandshake.on_tune_ok),
    commands.Connection.Open.index: (AWAITING_OPEN, AmqpHandshake.on_open),
    _CONNECTION_CLOSE: (None, AmqpHandshake.on_close),
    _CONNECTION_UPDATE_SECRET: (OPEN, AmqpHandshake.on_update_secret),
}
