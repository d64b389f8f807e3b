"""
Relaying a follower's clients to the leader: each connection a follower accepts on a relayed
listener is joined to a new connection to the leader, and bytes pass both ways unchanged.

Nothing is parsed, so every protocol passes (AMQP, the native protocol, HTTP); a cluster node
relays its plain listeners, not its TLS ones (see docs/clustering.rst). A load balancer or a
client's list of hosts keeps working when it picks a follower, as with LavinMQ's followers. The
one thing added is what the relay is told to send the leader first, before the client's first
byte: a header saying who the client is (L{brokerd.replication.relay_proof}), so that the
leader does not take the follower for it.

Memory stays bounded whatever either peer does: each side's transport is the streaming
producer of the other's (a side whose send buffer is full stops the other side being read),
and the bytes a client sends before the leader's connection is up are held up to a cap, past
which the client is not read. When the leader changes, L{RelayFactory.drop_all} closes every
relayed connection so that clients reconnect, and reach the new leader.
"""

from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol, ServerFactory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

DEFAULT_CONNECT_TIMEOUT = 5.0  # seconds a connection to the leader may take to open
DEFAULT_PENDING_CAP = 1024 * 1024  # bytes held for the leader while its connection opens

# Why one side's socket is not read (several may hold at once; see Reading).
PEER_FULL = "peer full"  # the other side's send buffer is full: its peer does not read
PENDING_FULL = "pending full"  # the leader is not connected yet and the pending bytes hit the cap

# Client endpoint types that would add a TLS layer of the relay's own on the way to the leader,
# where a client's TLS must pass through untouched.
WRAPPING_TYPES = ("ssl", "tls")

log = Logger()


def send_buffer_size(transport):
    """
    The bytes C{transport} was given and has not handed to the kernel yet: the send buffer of
    Twisted's socket transports (C{FileDescriptor}), which a relay fills and never reads.
    Zero for a transport without one, or once gone.
    """
    if transport is None:
        return 0
    data = getattr(transport, "dataBuffer", b"")
    return len(data) - getattr(transport, "offset", 0) + getattr(transport, "_tempDataLen", 0)


@implementer(IPushProducer)
class Reading:
    """
    Whether one side's socket is read, and why not: a set of reasons, so that lifting one
    (the leader connected) does not lift another (the other side's buffer is full).

    It is registered as the streaming producer of the I{other} side's transport, which pauses it
    when its send buffer fills and resumes it once drained (L{PEER_FULL}).
    """

    __slots__ = ("transport", "reasons")

    def __init__(self, transport):
        self.transport = transport
        self.reasons = set()

    @property
    def paused(self):
        return bool(self.reasons)

    def pause(self, reason):
        if not self.reasons:
            self.transport.pauseProducing()
        self.reasons.add(reason)

    def resume(self, reason):
        if reason not in self.reasons:
            return
        self.reasons.discard(reason)
        if not self.reasons:
            self.transport.resumeProducing()

    def pauseProducing(self):
        self.pause(PEER_FULL)

    def resumeProducing(self):
        self.resume(PEER_FULL)

    def stopProducing(self):
        """The other side's transport is gone; L{RelayedConnection} closes this side then."""


class ClientSide(Protocol):
    """A client's connection to the follower: hands everything to its L{RelayedConnection}."""

    def __init__(self, relayed):
        self.relayed = relayed

    def connectionMade(self):
        self.relayed.client_connected(self.transport)

    def dataReceived(self, data):
        self.relayed.from_client(data)

    def connectionLost(self, reason):
        self.relayed.client_lost()


class LeaderSide(Protocol):
    """The follower's connection to the leader for one client."""

    def __init__(self, relayed):
        self.relayed = relayed

    def connectionMade(self):
        self.relayed.leader_connected(self.transport)

    def dataReceived(self, data):
        self.relayed.from_leader(data)

    def connectionLost(self, reason):
        self.relayed.leader_lost()


class RelayedConnection:
    """
    One client joined to one connection to the leader.

    Until the leader's side is up, what the client sends is kept in C{pending} (at most the
    relay's cap plus one read; reading the client pauses at the cap). Either side going closes
    the other once what it was sent is written (C{loseConnection} flushes).

    @ivar target: the leader's endpoint string this connection was sent to (None: no leader).
    """

    def __init__(self, relay):
        self.relay = relay
        self.target = None
        self.client = None  # the client's transport
        self.leader = None  # the leader's transport, once connected
        self.client_reading = None
        self.leader_reading = None
        self.pending = []
        self.pending_size = 0
        self.connecting = None  # the Deferred of the leader's connection while it opens
        self.deadline = None  # the delayed call ending that attempt
        self.timed_out = False
        self.closed = False

    def buffered_bytes(self):
        """What this connection holds: bytes pending for the leader and both send buffers."""
        return self.pending_size + send_buffer_size(self.client) + send_buffer_size(self.leader)

    def client_connected(self, transport):
        self.client = transport
        self.client_reading = Reading(transport)
        _no_delay(transport)
        self.relay.connection_opened(self)
        try:
            self.target = self.relay.current_target()
            if self.target is None:
                self.fail("no leader is known")
                return
            endpoint = self.relay.endpoint_for(self.target)
        except Exception as error:  # a bad target string, or the lookup broke: this client only
            self.fail(str(error) or type(error).__name__)
            return
        self.connecting = endpoint.connect(LeaderFactory(self))
        self.deadline = self.relay.reactor.callLater(self.relay.connect_timeout, self._time_out)
        self.connecting.addBoth(self._connect_ended)

    def _time_out(self):
        self.deadline = None
        self.timed_out = True
        self._cancel_connecting()

    def _connect_ended(self, result):
        self.connecting = None
        if self.deadline is not None:
            self.deadline, deadline = None, self.deadline
            deadline.cancel()
        if not isinstance(result, Failure):
            return None
        if self.timed_out:
            self.fail(f"no connection within {self.relay.connect_timeout:g} s")
        elif not self.closed:  # else the client went, or drop_all: the attempt was cancelled
            self.fail(result.getErrorMessage() or result.type.__name__)
        return None

    def fail(self, reason):
        """The client cannot be relayed: count it, say why in one line and close the client."""
        self.relay.failures += 1
        log.warn("relay of {client} to {target}: {reason}; closing the client",
                 client=_peer(self.client), target=self.target or "the leader", reason=reason)
        self.close()

    def leader_connected(self, transport):
        self.connecting = None
        if self.closed:
            transport.abortConnection()
            return
        self.leader = transport
        try:
            header = self.relay.header_for(self.client)
        except ValueError as problem:
            self.fail(f"cannot tell the leader who the client is: {problem}")
            return
        self.leader_reading = Reading(transport)
        _no_delay(transport)
        self.relay.relayed += 1
        # Each side stops the other being read while its own send buffer is full.
        transport.registerProducer(self.client_reading, True)
        self.client.registerProducer(self.leader_reading, True)
        pending, self.pending, self.pending_size = self.pending, [], 0
        self.client_reading.resume(PENDING_FULL)
        if header:
            transport.write(header)
        if pending:
            transport.writeSequence(pending)

    def from_client(self, data):
        if self.leader is not None:
            self.leader.write(data)
            return
        if self.closed:
            return
        self.pending.append(data)
        self.pending_size += len(data)
        if self.pending_size >= self.relay.pending_cap:
            self.client_reading.pause(PENDING_FULL)

    def from_leader(self, data):
        self.client.write(data)

    def client_lost(self):
        self.closed = True
        self._cancel_connecting()
        if self.leader is not None:
            _close(self.leader)
        self._forget()

    def leader_lost(self):
        self.closed = True
        _close(self.client)
        self._forget()

    def close(self):
        """Close both sides, flushing what each was sent."""
        self.closed = True
        self._cancel_connecting()
        for transport in (self.client, self.leader):
            if transport is not None:
                _close(transport)

    def drop(self):
        """Close both sides at once, unflushed: the leader they joined is no longer the leader."""
        self.closed = True
        self._cancel_connecting()
        for transport in (self.client, self.leader):
            if transport is not None:
                transport.abortConnection()

    def _cancel_connecting(self):
        if self.connecting is not None:
            connecting, self.connecting = self.connecting, None
            connecting.cancel()

    def _forget(self):
        self.pending, self.pending_size = [], 0
        self.relay.connection_closed(self)


class LeaderFactory(Factory):
    """Makes the one L{LeaderSide} of a L{RelayedConnection}."""

    noisy = False

    def __init__(self, relayed):
        self.relayed = relayed

    def buildProtocol(self, address):
        return LeaderSide(self.relayed)


class RelayFactory(ServerFactory):
    """
    Accepts clients and relays each to the endpoint C{target()} names when it connects.

    @ivar relayed: connections joined to the leader so far.
    @ivar failures: clients closed because no leader was known or it could not be reached.
    """

    noisy = False

    def __init__(self, reactor, target, connect_timeout=DEFAULT_CONNECT_TIMEOUT,
                 pending_cap=DEFAULT_PENDING_CAP, client_from_string=clientFromString,
                 header=None):
        """
        @param target: called for each accepted client: the leader's client endpoint string for
            this listener's kind (C{tcp:HOST:PORT}; the leader's TLS port for a TLS listener,
            whose bytes pass through), or None while no leader is known.
        @param header: called with a client's transport once its connection to the leader is
            open: the bytes the leader is sent before the client's (who the client is), or
            ValueError, which closes the client naming it; None: nothing is sent first.
        @param connect_timeout: seconds the connection to the leader may take to open.
        @param pending_cap: bytes a client may send before the leader's side is connected;
            past it the client is not read until it is.
        @param client_from_string: makes the client endpoint of a target string.
        """
        if connect_timeout <= 0:
            raise ValueError(f"connect timeout must be positive, not {connect_timeout!r}")
        if pending_cap <= 0:
            raise ValueError(f"pending cap must be positive, not {pending_cap!r}")
        self.reactor = reactor
        self.target = target
        self.connect_timeout = connect_timeout
        self.pending_cap = pending_cap
        self._client_from_string = client_from_string
        self._header = header
        self._connections = set()
        self.relayed = 0
        self.failures = 0

    def buildProtocol(self, address):
        return ClientSide(RelayedConnection(self))

    @property
    def active(self):
        """Clients connected now (joined to the leader or on their way)."""
        return len(self._connections)

    def connections(self):
        """The L{RelayedConnection}s open now."""
        return list(self._connections)

    def buffered_bytes(self):
        """The bytes every relayed connection holds now (pending and in send buffers)."""
        return sum(connection.buffered_bytes() for connection in self._connections)

    def drop_all(self):
        """
        Close every relayed connection at once (the leader changed: its clients reconnect,
        through the next L{target} answer); returns how many were dropped.
        """
        dropped = list(self._connections)
        for connection in dropped:
            connection.drop()
        return len(dropped)

    def current_target(self):
        return self.target()

    def header_for(self, client):
        """What the leader is sent first on the connection of C{client} (a transport)."""
        return self._header(client) if self._header is not None else b""

    def endpoint_for(self, target):
        """The client endpoint for C{target}; ValueError if it is not a plain stream endpoint."""
        kind = target.partition(":")[0].strip().lower()
        if kind in WRAPPING_TYPES:
            raise ValueError(f"{kind}: would wrap the client's bytes in a TLS layer of the relay's "
                             "own; a relay's target is the leader's tcp:HOST:PORT")
        return self._client_from_string(self.reactor, target)

    def connection_opened(self, connection):
        self._connections.add(connection)

    def connection_closed(self, connection):
        self._connections.discard(connection)


def _close(transport):
    """Close C{transport} once its send buffer is written."""
    # Twisted resumes a paused producer when the buffer drains, instead of closing then: the other
    # side is gone, so it has nothing more to give (a guard; the side is normally not paused here).
    transport.unregisterProducer()
    transport.loseConnection()


def _no_delay(transport):
    """Small frames (an AMQP ack) go on at once: the relay adds no wait for more of them."""
    if hasattr(transport, "setTcpNoDelay"):
        transport.setTcpNoDelay(True)


def _peer(transport):
    if transport is None:
        return "a client"
    peer = transport.getPeer()
    return f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"
