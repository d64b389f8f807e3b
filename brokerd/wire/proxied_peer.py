"""
A listener whose connections may start with a PROXY protocol v2 header
(L{brokerd.wire.proxy_header}) naming the client a proxy took them from: a cluster's follower
relays its clients to the leader with one, so that the leader sees each client's own address.

L{ProxyHeaderFactory} stands in front of a listener's factory. Each connection's protocol is
made at once, as without it (its handshake timer runs, a connection ceiling counts it), on a
L{PeerTransport}: the connection's own transport but for C{getPeer}, which a believed header
sets. The first bytes decide. A client's first bytes are not the header's signature: they are
handed to its protocol at once, and from then on the socket delivers to that protocol directly,
so nothing is added per read or per write. A header is read whole, its declared length checked
before it is held, then given to the C{check} the listener was made with, which answers the
client's address to believe or raises L{HeaderRefused}. A refused connection is dropped before
its protocol sees a byte, and the refusal logged (bounded, as L{RefusalLog} bounds them).
"""

from twisted.internet.protocol import Factory, Protocol
from zope.interface import directlyProvides, providedBy

from brokerd.wire.connection_log import peer_address, peer_host
from brokerd.wire.proxy_header import (
    DEFAULT_MAX_BODY, FIXED_SIZE, HeaderRefused, body_length, may_start,
)
from brokerd.wire.refusal_log import RefusalLog


class PeerTransport:
    """
    A connection's transport as its protocol sees it: the transport itself (every attribute and
    interface of it) but for C{getPeer}, which answers C{peer} once a believed header set it.

    @ivar transport: the connection's transport.
    @ivar peer: the client's address a believed header named, or None.
    """

    def __init__(self, transport):
        self.transport = transport
        self.peer = None
        # Bound once: a write costs what it costs on the transport.
        self.write = transport.write
        self.writeSequence = transport.writeSequence
        directlyProvides(self, providedBy(transport))

    def getPeer(self):
        peer = self.peer
        return peer if peer is not None else self.transport.getPeer()

    def __getattr__(self, name):
        if name.startswith("__"):  # zope's and pickle's questions are about this object
            raise AttributeError(name)
        return getattr(self.transport, name)

    def __repr__(self):
        return f"<PeerTransport of {self.transport!r}, peer {self.getPeer()}>"


class ProxyHeaderGate(Protocol):
    """
    A connection's protocol until its first bytes decide: then its socket delivers to
    C{served} (the listener's own protocol, connected at once on a L{PeerTransport}).
    """

    def __init__(self, listener, served):
        self.listener = listener
        self.served = served
        self.peer_transport = None
        self._held = b""
        self._refused = False

    def logPrefix(self):
        prefix = getattr(self.served, "logPrefix", None)
        return prefix() if prefix is not None else type(self.served).__name__

    def makeConnection(self, transport):
        Protocol.makeConnection(self, transport)
        self.peer_transport = PeerTransport(transport)
        self.served.makeConnection(self.peer_transport)

    def dataReceived(self, data):
        if self._refused:
            return
        held = self._held + data if self._held else data
        if not may_start(held):
            self._hand_over(held)
            return
        self._held = held
        if len(held) < FIXED_SIZE:
            return
        try:
            end = FIXED_SIZE + body_length(held[:FIXED_SIZE], self.listener.max_body)
            if len(held) < end:
                return
            self.peer_transport.peer = self.listener.check(held[:end])
        except HeaderRefused as refusal:
            self._refuse(str(refusal))
            return
        self._hand_over(held[end:])

    def connectionLost(self, reason):
        # Only while the first bytes have not decided: the socket tells the protocol after.
        self._held = b""
        self.served.connectionLost(reason)

    def _hand_over(self, data):
        self._held = b""
        self.transport.protocol = self.served  # Twisted's socket reads its protocol each time
        if data:
            self.served.dataReceived(data)

    def _refuse(self, reason):
        self._refused = True
        self._held = b""
        self.listener.refused(self.transport, reason)
        self.transport.abortConnection()


class ProxyHeaderFactory(Factory):
    """
    A listener's factory that reads the PROXY header a connection may start with (see the
    module's description) and serves every connection with C{factory}'s protocol.
    """

    noisy = False

    def __init__(self, factory, check, clock, label, max_body=DEFAULT_MAX_BODY):
        """
        @param factory: the listener's own factory; a connection it builds no protocol for is
            closed before a byte is read, as without a header reader.
        @param check: C{check(header)} with a whole header's bytes: the client's address to
            believe (an C{IPv4Address} or C{IPv6Address}), or L{HeaderRefused} saying why not.
        @param label: names the listener in the refusal lines (C{--amqp}).
        @param max_body: bytes a header may declare after its fixed part; more are refused
            before they are read.
        """
        self.factory = factory
        self.check = check
        self.clock = clock
        self.max_body = max_body
        self.refusals = RefusalLog(protocol=label, before="believing its PROXY header")

    def logPrefix(self):
        prefix = getattr(self.factory, "logPrefix", None)
        return prefix() if prefix is not None else type(self.factory).__name__

    def doStart(self):
        self.factory.doStart()

    def doStop(self):
        self.refusals.stop()
        self.factory.doStop()

    def buildProtocol(self, address):
        served = self.factory.buildProtocol(address)
        if served is None:
            return None  # Twisted closes the socket
        return ProxyHeaderGate(self, served)

    def refused(self, transport, reason):
        """Log (bounded) that the connection on C{transport} was refused for C{reason}."""
        self.refusals.refused(self.clock, peer_host(transport), peer_address(transport), reason)
