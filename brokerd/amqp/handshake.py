"""The connection-level half of the AMQP server: handshake, heartbeats, close.

L{ConnectionMethods} is mixed into L{brokerd.amqp.server.AmqpServerProtocol}:
start / start-ok (credentials checked by L{brokerd.amqp.auth}) / tune /
tune-ok / open, update-secret (the new secret re-checked), heartbeats both
ways, connection.close in both directions, and connection.blocked / unblocked
while the broker holds publishers back.

Until a client has logged in it is a stranger: a channel-0 method is checked
against the handshake's state from its index alone, before its arguments are
decoded, and any error (a refused login, a malformed or misplaced frame) is
answered only after L{LOGIN_REFUSAL_DELAY}, as RabbitMQ delays a failed
handshake, so that guessing passwords is slow. Nothing more is read from such
a connection, other clients are served meanwhile, and the refusals are logged
at a bounded rate (L{RefusalLog}).
"""

import collections

from pamqp import commands
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

import brokerd
from brokerd.amqp import frames
from brokerd.amqp.arguments import decode_method
from brokerd.amqp.auth import MECHANISMS, Authenticator, LoginRefused
from brokerd.connection import AMQP_0_9_1, Connection
from brokerd.connectionlog import ConnectionRecord, client_text, describe_amqp_client, lost_reason
from brokerd.errors import (
    AccessRefused,
    CommandInvalid,
    FrameError,
    FrameSyntaxError,
    InvalidChannel,
    MethodNotImplemented,
    NotAllowed,
)
from brokerd.model.watermark import PublisherGate

log = Logger()

DEFAULT_FRAME_MAX = 131072
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_HEARTBEAT = 60
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
HANDSHAKE_TIMEOUT = 10.0
CLOSE_OK_TIMEOUT = 5.0
# A client that has not logged in gets its refusal (403 for a wrong password,
# 501/502/503/540 for a bad frame) this many seconds after the fault, so that a
# password guesser gets at most one answer per second and connection. RabbitMQ
# waits 3 s (SILENT_CLOSE_DELAY) before closing a failed handshake.
LOGIN_REFUSAL_DELAY = 1.0
# Refusals before login are logged as one line, then at most one summary line
# (how many more, from where) per this many seconds.
REFUSAL_LOG_INTERVAL = 10.0
REFUSAL_LOG_PEERS = 1024  # distinct addresses counted per summary; more are counted as "other"

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
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
        refusal_delay=LOGIN_REFUSAL_DELAY,
    ):
        self.authenticator = authenticator or Authenticator()
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.max_message_size = max_message_size
        self.refusal_delay = refusal_delay
        self.refusal_log = RefusalLog()


class RefusalLog:
    """
    Logs the connections refused before login, shared by all connections of a
    listener: the first refusal as one line, then, while refusals keep coming,
    one line per L{REFUSAL_LOG_INTERVAL} with how many there were and the
    addresses they came from, so a flood of failed logins cannot flood the log.
    The native protocol's listener has one too, for clients refused before hello.
    """

    def __init__(self, interval=REFUSAL_LOG_INTERVAL, protocol="AMQP", before="login"):
        self.interval = interval
        self.protocol = protocol  # the protocol and the handshake step named in the lines
        self.before = before
        self._window = None  # the call that ends the current interval, while one runs
        self._peers = collections.Counter()  # host -> refusals not logged yet
        self._unlisted = 0  # refusals from hosts beyond REFUSAL_LOG_PEERS
        self._last = None

    def refused(self, clock, host, peer, error):
        """Log (now or in the next summary) that C{peer} (at C{host}) was refused with C{error}, an error or a text."""
        if self._window is None:
            log.info("refused {protocol} client {peer} before {before}: {error}", protocol=self.protocol, peer=peer,
                     before=self.before, error=error)
            self._window = clock.callLater(self.interval, self._summarise, clock)
            return
        if host in self._peers or len(self._peers) < REFUSAL_LOG_PEERS:
            self._peers[host] += 1
        else:
            self._unlisted += 1
        self._last = (peer, error)

    def stop(self):
        """The listener stopped: no more summaries (refusals not yet summarised are dropped)."""
        if self._window is not None and self._window.active():
            self._window.cancel()
        self._window = None
        self._peers.clear()
        self._unlisted = 0

    def _summarise(self, clock):
        count = sum(self._peers.values()) + self._unlisted
        if not count:
            self._window = None
            return
        hosts = ", ".join(f"{host} ({number})" for host, number in self._peers.most_common(5))
        if len(self._peers) > 5 or self._unlisted:
            hosts += f" and {count - sum(number for _, number in self._peers.most_common(5))} from other addresses"
        peer, error = self._last
        log.info(
            "refused {count} more {protocol} clients before {before} in the last {seconds:.0f} s, from {hosts};"
            " the last, {peer}: {error}",
            count=count, protocol=self.protocol, before=self.before, seconds=self.interval, hosts=hosts, peer=peer,
            error=error,
        )
        self._peers.clear()
        self._unlisted = 0
        self._window = clock.callLater(self.interval, self._summarise, clock)


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

    def _connection_frame(self, index, data, start, end):
        """
        A method frame on channel 0 whose arguments are C{data[start:end]}.
        Its place in the handshake is checked from C{index} before anything is
        decoded, so a stranger cannot make the broker decode what it would refuse.
        """
        if self._state == CLOSING:
            if index == _CONNECTION_CLOSE:
                self.send(frames.method_frame(0, commands.Connection.CloseOk()))
                self._drop_after_flush()
            elif index == _CONNECTION_CLOSE_OK:
                self._drop_after_flush()
            return
        expected = _CONNECTION_METHODS.get(index)
        if expected is None:
            name = frames.method_name(index)
            if index not in commands.INDEX_MAPPING:
                raise MethodNotImplemented(f"unknown method class {index >> 16} id {index & 0xFFFF}")
            if index >> 16 == 10:
                raise CommandInvalid(f"{name} is not expected from a client")
            if self._state == OPEN:  # RabbitMQ's code and words; channel 0 is never a channel
                raise InvalidChannel(f"unexpected method in connection state running: {name} on channel 0")
            raise CommandInvalid(f"{name} on channel 0, which carries only connection methods")
        state, handler = expected
        if state is not None and self._state != state:
            raise CommandInvalid(f"{frames.method_name(index)} is out of order in the connection handshake")
        handler(self, decode_method(index, data, start, end, FrameSyntaxError))

    def _frame_too_large(self, length):
        """The error for a frame whose payload of C{length} bytes is over the limit."""
        size = length + frames.FRAME_OVERHEAD
        if self._state < AWAITING_OPEN:
            return FrameError(
                f"frame of {size} bytes exceeds {frames.FRAME_MIN_SIZE} bytes, the largest allowed before"
                " connection.tune-ok"
            )
        return FrameError(f"frame of {size} bytes exceeds frame_max {self.frame_max}")

    def on_start_ok(self, method):
        self.client_properties = method.client_properties or {}
        capabilities = self.client_properties.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        self._state = AUTHENTICATING
        response = method.response
        if isinstance(response, str):
            response = response.encode()  # pamqp decoded these bytes as UTF-8: the same bytes again
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
        if failure.check(LoginRefused):
            reason = str(failure.value)
        else:
            log.failure("checking the login of {peer} failed", failure, peer=self._peer_name())
            reason = "the broker could not check the login; see its log"
        self._close_connection(AccessRefused(reason))

    def on_tune_ok(self, method):
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
        name = self.client_properties.get("connection_name") or self.client_properties.get("product") or ""
        self.connection = Connection(self.broker, method.virtual_host or "/", str(name), AMQP_0_9_1, self.transport,
                                     self.user, self.client_properties)
        self._gate = PublisherGate(self._watermark, self.transport, self._blocked_changed)
        self._state = OPEN
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = None
        self.send(frames.method_frame(0, commands.Connection.OpenOk()))
        self._record = ConnectionRecord(
            "AMQP", self.transport, self.user, self.connection.vhost.name,
            describe_amqp_client(self.client_properties), self.clock.seconds(),
        )

    def on_update_secret(self, method):
        """
        connection.update-secret (pika and aiormq use it to refresh credentials):
        the new secret is checked as the password of the user who logged in.
        A refused one closes the connection with RabbitMQ's 530, which RabbitMQ
        sends when an authentication backend refuses the new secret.
        """
        secret = method.new_secret
        if isinstance(secret, str):
            secret = secret.encode()  # pamqp decoded these bytes as UTF-8: the same bytes again
        d = self.settings.authenticator.check_secret(self.user, secret)
        d.addCallbacks(self._secret_updated, self._secret_refused, callbackArgs=(method.reason,))

    def _secret_updated(self, user, reason):
        if self._state != OPEN:
            return
        log.debug("AMQP connection {peer}: user {user!r} updated secret, reason: {reason!r}",
                  peer=self._peer_name(), user=self.user, reason=reason)
        self.send(frames.method_frame(0, commands.Connection.UpdateSecretOk()))

    def _secret_refused(self, failure):
        if self._state != OPEN:
            return
        if failure.check(LoginRefused):
            error = NotAllowed("New secret was refused by one of the backends")
        else:
            log.failure("checking the new secret of {peer} failed", failure, peer=self._peer_name())
            error = NotAllowed("Secret update failed")
        self._close_connection(error, _CONNECTION_UPDATE_SECRET)

    def on_close(self, method):
        self._ending(f"the client closed it: {method.reply_code} {client_text(method.reply_text)!r}")
        self._shut_model_connection()
        self._state = CLOSING
        self.send(frames.method_frame(0, commands.Connection.CloseOk()))
        self._drop_after_flush()

    def _close_connection(self, error, index=0):
        """
        Send connection.close for C{error}; the socket is dropped on close-ok or
        after a timeout. A client that has not logged in gets it only after
        the refusal delay, and reads nothing more meanwhile.
        """
        if self._state == CLOSING:
            return
        if self.user is None:
            self._refuse_before_login(error, index)
            return
        if self._record is None:
            log.info("closing AMQP connection from {peer}: {error}", peer=self._peer_name(), error=error)
        self._ending(f"the broker closed it: {error}")
        self._send_close(error, index)

    def _ending(self, reason):
        """Keep why the connection ends (the first reason given) for its closing log line."""
        if self._close_reason is None:
            self._close_reason = reason

    def _log_closed(self, lost):
        """The closing log line of an accepted connection; C{lost} is the transport's reason."""
        if self._record is not None:
            self._record.close(self._close_reason or lost_reason(lost), self.clock.seconds())

    def _refuse_before_login(self, error, index):
        self.settings.refusal_log.refused(self.clock, self._peer_host(), self._peer_name(), error)
        self._state = CLOSING
        self._flow.refusing = True
        self._read_buffer.clear()
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        self._timeout_call = self.clock.callLater(self.settings.refusal_delay, self._refusal_delay_over, error, index)

    def _refusal_delay_over(self, error, index):
        self._timeout_call = None
        self._flow.refusing = False
        self._send_close(error, index)

    def _send_close(self, error, index):
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
            if self.user is None:
                self.settings.refusal_log.refused(
                    self.clock, self._peer_host(), self._peer_name(), f"no login within {HANDSHAKE_TIMEOUT:.0f} s"
                )
            else:
                log.info("dropping {peer}: no connection.open within {seconds} s", peer=self._peer_name(),
                         seconds=HANDSHAKE_TIMEOUT)
            self._state = CLOSING
            self.transport.abortConnection()

    def _heartbeat_tick(self):
        now = self.clock.seconds()
        if now - self._received_at > 2 * self.heartbeat:
            if self._record is None:
                log.info("missed heartbeats from {peer}, timeout: {seconds} s", peer=self._peer_name(),
                         seconds=self.heartbeat)
            self._ending(f"missed heartbeats from the client, timeout: {self.heartbeat} s")
            self._heartbeat_loop.stop()
            self._shut_model_connection()
            self._state = CLOSING
            self.transport.abortConnection()
            return
        if now - self._sent_at >= self.heartbeat / 2.0 and self._outgoing is None:
            self.transport.write(frames.HEARTBEAT_FRAME)
            self._sent_at = now


_CONNECTION_CLOSE = commands.Connection.Close.index
_CONNECTION_CLOSE_OK = commands.Connection.CloseOk.index
_CONNECTION_UPDATE_SECRET = commands.Connection.UpdateSecret.index
# method index -> (the handshake state it belongs to, or None for any, and its handler)
_CONNECTION_METHODS = {
    commands.Connection.StartOk.index: (AWAITING_START_OK, ConnectionMethods.on_start_ok),
    commands.Connection.TuneOk.index: (AWAITING_TUNE_OK, ConnectionMethods.on_tune_ok),
    commands.Connection.Open.index: (AWAITING_OPEN, ConnectionMethods.on_open),
    _CONNECTION_CLOSE: (None, ConnectionMethods.on_close),
    _CONNECTION_UPDATE_SECRET: (OPEN, ConnectionMethods.on_update_secret),
}
