"""The connection-level half of the AMQP server: handshake, heartbeats, close.

L{ConnectionMethods} is mixed into L{brokerd.amqp.server.AmqpServerProtocol}:
start / start-ok (credentials checked by L{brokerd.amqp.auth}) / tune /
tune-ok / open, heartbeats both ways, connection.close in both directions, and
connection.blocked / unblocked while the broker holds publishers back.
"""

from pamqp import commands
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

import brokerd
from brokerd.amqp import frames
from brokerd.amqp.auth import MECHANISMS, Authenticator, LoginRefused
from brokerd.connection import Connection
from brokerd.errors import AccessRefused, CommandInvalid, NotAllowed
from brokerd.model.watermark import PublisherGate

log = Logger()

DEFAULT_FRAME_MAX = 131072
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_HEARTBEAT = 60
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
HANDSHAKE_TIMEOUT = 10.0
CLOSE_OK_TIMEOUT = 5.0

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": False,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}

# Handshake states, in order.
AWAITING_HEADER, AWAITING_START_OK, AUTHENTICATING, AWAITING_TUNE_OK, AWAITING_OPEN, OPEN, CLOSING = range(7)


class AmqpSettings:
    """What the server offers in connection.tune and enforces after it."""

    def __init__(
        self,
        authenticator=None,
        frame_max=DEFAULT_FRAME_MAX,
        channel_max=DEFAULT_CHANNEL_MAX,
        heartbeat=DEFAULT_HEARTBEAT,
        max_message_size=DEFAULT_MAX_MESSAGE_SIZE,
    ):
        self.authenticator = authenticator or Authenticator()
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.max_message_size = max_message_size


class ConnectionMethods:
    """Channel-0 methods and timers; expects the attributes AmqpServerProtocol sets up."""

    def _blocked_changed(self, blocked):
        """Tell a client that understands connection.blocked why its publishes stall."""
        if not self.client_capabilities.get("connection.blocked") or self._state != OPEN:
            return
        if blocked:
            self.send(frames.method_frame(0, commands.Connection.Blocked(reason="low on memory")))
        else:
            self.send(frames.method_frame(0, commands.Connection.Unblocked()))
        self.flush()

    # -- the connection handshake and close

    def _send_connection_start(self):
        start = commands.Connection.Start(
            server_properties={
                "product": "brokerd",
                "version": brokerd.__version__,
                "platform": "Python/Twisted",
                "information": "https://pypi.org/project/brokerd/",
                "capabilities": SERVER_CAPABILITIES,
            },
            mechanisms=" ".join(MECHANISMS),
            locales="en_US",
        )
        self.send(frames.method_frame(0, start))

    def _connection_method(self, index, method):
        handler = _CONNECTION_METHODS.get(type(method))
        if self._state == CLOSING:
            if isinstance(method, (commands.Connection.CloseOk, commands.Connection.Close)):
                if isinstance(method, commands.Connection.Close):
                    self.send(frames.method_frame(0, commands.Connection.CloseOk()))
                self._drop_after_flush()
            return
        if handler is None:
            if index >> 16 == 10:
                raise CommandInvalid(f"{method.name} is not expected from a client")
            raise CommandInvalid(f"{method.name} on channel 0, which carries only connection methods")
        handler(self, method)

    def _expect(self, state, method):
        if self._state != state:
            raise CommandInvalid(f"{method.name} is out of order in the connection handshake")

    def on_start_ok(self, method):
        self._expect(AWAITING_START_OK, method)
        self.client_properties = method.client_properties or {}
        capabilities = self.client_properties.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        self._state = AUTHENTICATING
        response = method.response
        if isinstance(response, str):
            response = response.encode("latin-1")
        d = self.settings.authenticator.login(method.mechanism, response, self._peer_host())
        d.addCallbacks(self._logged_in, self._login_refused)

    def _logged_in(self, user):
        if self._state != AUTHENTICATING:
            return
        self.user = user
        self._state = AWAITING_TUNE_OK
        tune = commands.Connection.Tune(
            channel_max=self.settings.channel_max, frame_max=self.settings.frame_max, heartbeat=self.settings.heartbeat
        )
        self.send(frames.method_frame(0, tune))

    def _login_refused(self, failure):
        if self._state != AUTHENTICATING:
            return
        reason = failure.value if failure.check(LoginRefused) else "login failed"
        log.info("refused login from {peer}: {reason}", peer=self._peer_name(), reason=reason)
        self._close_connection(AccessRefused(str(reason)))

    def on_tune_ok(self, method):
        self._expect(AWAITING_TUNE_OK, method)
        if method.frame_max and not frames.FRAME_MIN_SIZE <= method.frame_max <= self.settings.frame_max:
            raise NotAllowed(
                f"frame_max {method.frame_max} is outside {frames.FRAME_MIN_SIZE}..{self.settings.frame_max}"
            )
        if method.channel_max > self.settings.channel_max:
            raise NotAllowed(f"channel_max {method.channel_max} exceeds the server's {self.settings.channel_max}")
        self.frame_max = method.frame_max or self.settings.frame_max
        self._max_payload = self.frame_max - frames.FRAME_OVERHEAD
        self.channel_max = method.channel_max or self.settings.channel_max
        self.heartbeat = method.heartbeat
        if self.heartbeat:
            self._heartbeat_loop = LoopingCall(self._heartbeat_tick)
            self._heartbeat_loop.clock = self.clock
            self._heartbeat_loop.start(self.heartbeat / 2.0, now=False)
        self._state = AWAITING_OPEN

    def on_open(self, method):
        self._expect(AWAITING_OPEN, method)
        name = self.client_properties.get("connection_name") or self.client_properties.get("product") or ""
        self.connection = Connection(self.broker, method.virtual_host or "/", str(name))
        self._gate = PublisherGate(self._watermark, self.transport, self._blocked_changed)
        self._state = OPEN
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = None
        self.send(frames.method_frame(0, commands.Connection.OpenOk()))

    def on_close(self, method):
        log.debug("client closed: {code} {text}", code=method.reply_code, text=method.reply_text)
        self._shut_model_connection()
        self._state = CLOSING
        self.send(frames.method_frame(0, commands.Connection.CloseOk()))
        self._drop_after_flush()

    def _close_connection(self, error, index=0):
        """Send connection.close for C{error}; the socket is dropped on close-ok or after a timeout."""
        if self._state == CLOSING:
            return
        log.info("closing AMQP connection from {peer}: {error}", peer=self._peer_name(), error=error)
        self._shut_model_connection()
        self._state = CLOSING
        self._read_buffer.clear()
        close = commands.Connection.Close(
            reply_code=error.reply_code, reply_text=error.reply_text[:255], class_id=index >> 16,
            method_id=index & 0xFFFF,
        )
        self.send(frames.method_frame(0, close))
        self.flush()
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = self.clock.callLater(CLOSE_OK_TIMEOUT, self._drop_after_flush)

    def _shut_model_connection(self):
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()
        self._channels.clear()

    def _drop_after_flush(self):
        self.flush()
        if self.transport is not None:
            self.transport.loseConnection()

    def _handshake_timed_out(self):
        self._timeout_call = None
        if self._state < OPEN:
            log.info("dropping {peer}: no connection.open within {seconds} s", peer=self._peer_name(),
                     seconds=HANDSHAKE_TIMEOUT)
            self._state = CLOSING
            self.transport.abortConnection()

    def _heartbeat_tick(self):
        now = self.clock.seconds()
        if now - self._received_at > 2 * self.heartbeat:
            log.info("missed heartbeats from {peer}, timeout: {seconds} s", peer=self._peer_name(),
                     seconds=self.heartbeat)
            self._heartbeat_loop.stop()
            self._shut_model_connection()
            self._state = CLOSING
            self.transport.abortConnection()
            return
        if now - self._sent_at >= self.heartbeat / 2.0 and self._outgoing is None:
            self.transport.write(frames.HEARTBEAT_FRAME)
            self._sent_at = now


_CONNECTION_METHODS = {
    commands.Connection.StartOk: ConnectionMethods.on_start_ok,
    commands.Connection.TuneOk: ConnectionMethods.on_tune_ok,
    commands.Connection.Open: ConnectionMethods.on_open,
    commands.Connection.Close: ConnectionMethods.on_close,
}
