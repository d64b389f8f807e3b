"""The two log lines an operator follows a client connection by, on both protocols.

One line when a connection is accepted and one when it closes, each naming the
peer and local addresses, the user, the vhost and the client (product, version
and connection name, as the client sent them); the closing line adds how long
the connection lived and why it ended: the client closed it, the broker closed
it with a reply code and text, heartbeats were missed, or the TCP connection
was lost. RabbitMQ writes the same facts over several lines ("accepting AMQP
connection", "user ... authenticated and granted access to vhost", "closing
AMQP connection").

An AMQP connection is logged as accepted once connection.open is answered,
that is after login: RabbitMQ logs "accepting" on TCP accept, but here a client
that has not logged in writes nothing but the rate-bounded refusal lines, so
opening TCP connections in a loop cannot flood the log. What a client sent is
cut to L{MAX_CLIENT_TEXT} characters and unprintable characters are replaced,
so one line stays one line. L{peer_address} and L{peer_host} name a client the
same way in every line of both protocols, these and the refusal lines.
"""

from twisted.internet.error import ConnectionDone
from twisted.logger import Logger

log = Logger()

# Characters of one client-supplied value (product, version, name, close text) logged.
MAX_CLIENT_TEXT = 80


def client_text(value, limit=MAX_CLIENT_TEXT):
    """
    A value a client sent, made fit for one log line: text, printable, at most
    C{limit} characters.
    """
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: limit * 4]).decode("utf-8", "replace")
    if not isinstance(value, str):
        return ""
    cut = value[:limit]
    text = "".join(character if character.isprintable() else "?" for character in cut)
    return text + "..." if len(value) > limit else text


def describe_amqp_client(properties):
    """
    The client an AMQP connection's client properties name: C{"pika 1.4.4"},
    with its connection name if any.
    """
    product = client_text(properties.get("product")) or "unnamed client"
    version = client_text(properties.get("version"))
    name = client_text(properties.get("connection_name"))
    described = f"{product} {version}" if version else product
    return f"{described}, connection name {name!r}" if name else described


def address(transport_address):
    """C{host:port} of a transport address (or what it is, for a UNIX socket)."""
    if hasattr(transport_address, "port"):
        return f"{transport_address.host}:{transport_address.port}"
    return str(transport_address)


def peer_address(transport):
    """
    C{host:port} of the client at the other end of C{transport} (C{"None"}
    without a transport).
    """
    return address(transport.getPeer() if transport is not None else None)


def peer_host(transport):
    """The client's host alone, as refusals are counted by it (C{""} where there is none)."""
    return getattr(transport.getPeer() if transport is not None else None, "host", "")


def lost_reason(failure):
    """Why a connection ended that neither side closed at the protocol level."""
    if failure is None or failure.check(ConnectionDone):
        return "the client closed the TCP connection without closing the connection first"
    return f"the TCP connection was lost: {failure.getErrorMessage()}"


class ConnectionRecord:
    """One accepted connection as its log lines describe it; logs the accepted line when made."""

    __slots__ = ("protocol", "peer", "local", "user", "vhost", "client", "accepted_at", "closed")

    def __init__(self, protocol, transport, user, vhost, client, now):
        """
        @param protocol: C{"AMQP"} or C{"native"}.
        @param user: the user who logged in, or None for a connection made without one.
        @param client: the client's description (L{describe_amqp_client}).
        @param now: the clock's time, to tell later how long the connection lived.
        """
        self.protocol = protocol
        self.peer = address(transport.getPeer())
        self.local = address(transport.getHost())
        self.user = user
        self.vhost = vhost
        self.client = client
        self.accepted_at = now
        self.closed = False
        log.info(
            "accepted {protocol} connection {peer} -> {local}: {who}, vhost {vhost!r},"
            " client {client}",
            protocol=protocol, peer=self.peer, local=self.local, who=self._who(), vhost=vhost,
            client=client,
        )

    def _who(self):
        return f"user {self.user!r}" if self.user is not None else "no login"

    def close(self, reason, now):
        """Log the closing line, once, with C{reason}."""
        if self.closed:
            return
        self.closed = True
        log.info(
            "closed {protocol} connection {peer} -> {local}"
            " ({who}, vhost {vhost!r}, client {client}) after {seconds:.1f} s: {reason}",
            protocol=self.protocol, peer=self.peer, local=self.local, who=self._who(),
            vhost=self.vhost, client=self.client, seconds=max(0.0, now - self.accepted_at),
            reason=reason,
        )
