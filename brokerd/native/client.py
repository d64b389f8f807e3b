"""A Twisted client for brokerd's native protocol, with a Deferred API::

    client = yield connect(
        reactor, "tcp:127.0.0.1:5673", username="alice", password="s3cret", vhost="/"
    )
    channel = yield client.channel()
    yield channel.queue_declare("jobs", durable=True)
    channel.basic_publish("", "jobs", b"hello", properties={"delivery_mode": 2})
    tag = yield channel.basic_consume("jobs", on_delivery)

Over TLS the endpoint is C{tls:HOST:PORT:trustRoots=CA_DIR}, which checks
that the broker's certificate names HOST before the hello is sent.

The hello logs in with a user name and password (guest/guest unless given;
guest may log in from loopback only) or, with C{mechanism="EXTERNAL"}, as the
user a TLS client certificate names; a refused login fails C{connect} with
L{ConnectionClosed} 403, an unknown vhost with 530.

Requests return Deferreds that fire with the broker's answer or fail with
L{ChannelClosed} / L{ConnectionClosed} carrying the broker's reply code.
Deliveries go to the callback given to C{basic_consume} as L{Delivery} objects.

This module is the connection half (the hello, the connection's frames routed
to its channels, closing); the channel API, deliveries, properties and errors
live in L{brokerd.native.clientchannel} and are importable from here.
"""

import itertools

from twisted.internet import defer
from twisted.internet.endpoints import connectProtocol

from brokerd.native.clientchannel import (
    BrokerClosed,
    ChannelClosed,
    ClientChannel,
    ConnectionClosed,
    Delivery,
    PublishNacked,
    make_properties,
)
from brokerd.native.framing import PROTOCOL_VERSION, FrameReceiver
from brokerd.proto.native_pb2 import Envelope
from brokerd.wire.client_endpoints import UnverifiedTLS, client_endpoint

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_PASSWORD",
    "DEFAULT_USER",
    "BrokerClosed",
    "BrokerNotVerified",
    "ChannelClosed",
    "ClientChannel",
    "ConnectionClosed",
    "Delivery",
    "NativeClientProtocol",
    "PublishNacked",
    "UnverifiedTLS",
    "connect",
    "make_properties",
]

DEFAULT_ENDPOINT = "tcp:127.0.0.1:5673"
DEFAULT_USER = DEFAULT_PASSWORD = "guest"


class NativeClientProtocol(FrameReceiver):
    """
    A connection to brokerd.

    @ivar ready: fires with this protocol once the broker accepted C{hello}.
    @ivar closed: fires with the L{ConnectionClosed} reason when the
        connection ends.
    """

    def __init__(
        self, clock, vhost="/", client_name="brokerd-native-client", max_frame_size=2**31 - 1,
        username=DEFAULT_USER, password=DEFAULT_PASSWORD, mechanism="",
    ):
        """
        @param mechanism: C{""} (PLAIN: C{username} and C{password}) or
            C{"EXTERNAL"} (the user the TLS client certificate names).
        """
        # The reactor it connects with: its writes wait for that one's turns.
        FrameReceiver.__init__(self, clock)
        self.vhost = vhost
        self.username = username
        self._password = password
        self.mechanism = mechanism
        self.client_name = client_name
        self.MAX_LENGTH = max_frame_size
        self.ready = defer.Deferred()
        self.closed = defer.Deferred()
        self.server_version = None
        self.close_reason = None
        self._channels = {}
        self._channel_ids = itertools.count(1)
        self._correlation_ids = itertools.count(1)

    def connectionMade(self):
        envelope = Envelope()
        envelope.hello.protocol_version = PROTOCOL_VERSION
        envelope.hello.vhost = self.vhost
        envelope.hello.client_name = self.client_name
        envelope.hello.username = self.username
        envelope.hello.password = self._password
        envelope.hello.mechanism = self.mechanism
        self.sendFrame(envelope.SerializeToString())

    def stringReceived(self, frame):
        envelope = Envelope()
        envelope.ParseFromString(frame)
        kind = envelope.WhichOneof("payload")
        if envelope.channel:
            channel = self._channels.get(envelope.channel)
            if channel is not None:
                channel._frame_received(envelope, kind)
            return
        if kind == "hello_ok":
            self.server_version = envelope.hello_ok.server_version
            self.server_max_frame_size = envelope.hello_ok.max_frame_size
            self.ready.callback(self)
        elif kind == "connection_close":
            close = envelope.connection_close
            self.close_reason = ConnectionClosed(close.reply_code, close.reply_text)
            reply = Envelope()
            reply.connection_close_ok.SetInParent()
            self.sendFrame(reply.SerializeToString())
            self.closeAfterFlush()
        elif kind == "connection_close_ok":
            self.closeAfterFlush()

    def connectionLost(self, reason):
        FrameReceiver.connectionLost(self, reason)
        refusal = None if self.ready.called else tls_refusal(reason)
        if refusal is not None:
            self.close_reason = BrokerNotVerified(refusal)
            self.ready.errback(self.close_reason)
        if self.close_reason is None:
            self.close_reason = ConnectionClosed(
                320, f"connection lost: {reason.getErrorMessage()}"
            )
        for channel in list(self._channels.values()):
            channel._closed(
                ChannelClosed(self.close_reason.reply_code, self.close_reason.reply_text)
            )
        if not self.ready.called:
            self.ready.errback(self.close_reason)
        self.closed.callback(self.close_reason)

    def channel(self):
        """Open a new channel; fires with a L{ClientChannel}."""
        if self.close_reason is not None:
            return defer.fail(self.close_reason)
        channel_id = next(self._channel_ids)
        channel = self._channels[channel_id] = ClientChannel(self, channel_id)
        return channel._request("channel_open").addCallback(lambda _: channel)

    def close(self):
        """Close the connection politely; fires when it is closed."""
        if self.close_reason is None:
            self.close_reason = ConnectionClosed(200, "closed by client")
            envelope = Envelope()
            envelope.connection_close.reply_code = 200
            envelope.connection_close.reply_text = "OK"
            self.sendFrame(envelope.SerializeToString())
        return self.closed


class BrokerNotVerified(ConnectionClosed):
    """
    The TLS server was not the broker the endpoint named (its certificate is for
    another name, or from an authority not trusted): nothing was sent to it.
    """

    def __init__(self, text):
        super().__init__(0, text)
        self.args = (text,)

    def __str__(self):
        return self.reply_text


def tls_refusal(reason):
    """
    What a connection lost with C{reason} (a Failure) says of the server when
    it is the TLS client's refusal of the server's certificate, else None.
    """
    try:
        from OpenSSL.SSL import Error as TlsError
        from service_identity import VerificationError
    except ImportError:  # no TLS support installed: no TLS refusal either
        return None
    if reason.check(VerificationError):
        names = []
        for error in reason.value.errors:
            wanted = error.mismatched_id
            name = getattr(wanted, "hostname", None) or getattr(wanted, "ip", None)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return (
            f"the server's certificate is not for {', '.join(names)}"
            " (the login was not sent)"
        )
    if reason.check(TlsError):
        reasons = [part[-1] for part in reason.value.args[0] if isinstance(part, tuple)]
        return (
            f"the TLS handshake failed: {', '.join(reasons) or reason.getErrorMessage()}"
            " (the login was not sent)"
        )
    return None


def connect(reactor, endpoint=DEFAULT_ENDPOINT, vhost="/", client_name="brokerd-native-client",
            username=DEFAULT_USER, password=DEFAULT_PASSWORD, mechanism="",
            insecure_skip_verify=False):
    """
    Connect and log in as C{username} (or, with C{mechanism="EXTERNAL"}, as
    the user the TLS client certificate names); fires with a ready
    L{NativeClientProtocol}, or fails with L{ConnectionClosed} (403: login
    refused; 530: no such vhost, or no permissions on it).

    Over TLS, give C{tls:HOST:PORT[:trustRoots=CA_DIR]}: the hello is sent only
    to a server whose certificate names HOST and comes from those authorities
    (else the system's). An C{ssl:} endpoint, which checks no name, fails with
    L{UnverifiedTLS} unless C{insecure_skip_verify} is true.
    """
    try:
        client = client_endpoint(reactor, endpoint, insecure_skip_verify)
    except UnverifiedTLS:
        return defer.fail()
    protocol = NativeClientProtocol(
        reactor, vhost, client_name, username=username, password=password, mechanism=mechanism
    )
    d = connectProtocol(client, protocol)
    d.addCallback(lambda _: protocol.ready)
    return d
