"""The leader's replication port: authenticates followers and streams operations to them."""

import heapq
from collections import deque

from twisted.internet import defer, protocol
from twisted.logger import Logger

from brokerd.replication import auth, codec
from brokerd.replication.codec import StreamError

HANDSHAKE_TIMEOUT = 10.0
REFUSALS_KEPT = 100


class FollowerLink(protocol.Protocol):
    """
    One follower's connection on the leader. Before the follower has proved
    it holds the secret it gets nothing but a challenge: anything else it
    sends, a wrong answer, or silence past the handshake timeout, is logged
    and the connection dropped. Then it receives the stream from the
    operation after its resume point, written only while the transport
    accepts more (the link is the transport's streaming producer), so a slow
    follower stalls its own link, not the leader's memory.

    @ivar acked: the highest sequence the follower's durable commit covers.
    @ivar in_sync: whether it counts for L{ReplicationServer.confirmed_up_to}:
        set once it has acked everything streamed, cleared when its lag
        passes the server's C{max_lag_bytes}.
    """

    log = Logger()

    def __init__(self, server):
        self.server = server
        self.decoder = codec.FrameDecoder(codec.HANDSHAKE_FRAME_LIMIT)
        self.node = None
        self.acked = 0
        self.next = 1  # the next sequence to write
        self.in_sync = False
        self.paused = False
        self.pauses = 0
        self.bytes_written = 0
        self._nonce = auth.nonce()
        self._streaming = False
        self._timeout = None

    def connectionMade(self):
        self.peer = str(self.transport.getPeer())
        self._timeout = self.server.reactor.callLater(HANDSHAKE_TIMEOUT, self._drop,
                                                      "no answer to the challenge in time")
        self.transport.write(codec.frame(codec.HELLO, codec.MAGIC + self._nonce))

    def dataReceived(self, data):
        try:
            for kind, payload in self.decoder.feed(data):
                if self._streaming:
                    self._received_ack(kind, payload)
                else:
                    self._authenticate(kind, payload)
        except StreamError as problem:
            self._drop(str(problem))

    def _authenticate(self, kind, payload):
        if kind != codec.AUTH:
            raise StreamError(f"sent a {codec.KINDS[kind]} frame before authenticating")
        follower_nonce, mac, resume, cluster, node = codec.decode_auth(payload)
        server = self.server
        expected = auth.follower_proof(server.secret, self._nonce, follower_nonce, cluster, node,
                                       resume)
        if not auth.same(expected, mac):
            raise StreamError("failed authentication (wrong secret, or not a brokerd follower)")
        self._cancel_timeout()
        self.node = node
        stream = server.stream
        if cluster and cluster != server.cluster_id:
            return self._refuse(f"follower {node!r} holds data of cluster {cluster!r},"
                                f" not of this cluster {server.cluster_id!r}")
        if resume > stream.last_sequence:
            return self._refuse(f"follower {node!r} is at operation {resume}, ahead of the"
                                f" leader's {stream.last_sequence}")
        if resume + 1 < stream.first_retained:
            return self._refuse(f"follower {node!r} is at operation {resume}; the leader keeps"
                                f" operations from {stream.first_retained} only: it needs a"
                                f" snapshot")
        self.transport.write(codec.frame(
            codec.WELCOME,
            auth.leader_proof(server.secret, self._nonce, follower_nonce, server.cluster_id)
            + codec.pack_name(server.cluster_id)))
        self.acked, self.next, self._streaming = resume, resume + 1, True
        self.log.info("replication follower {node} ({peer}) joined at operation {resume}",
                      node=node, peer=self.peer, resume=resume)
        self.transport.registerProducer(self, True)
        server.joined(self)
        self.push()

    def _received_ack(self, kind, payload):
        if kind != codec.ACK or len(payload) != codec.SEQUENCE.size:
            raise StreamError(f"sent a {codec.KINDS[kind]} frame of {len(payload)} bytes where"
                              f" an ack belongs")
        (sequence,) = codec.SEQUENCE.unpack(payload)
        if not self.acked <= sequence < self.next:
            raise StreamError(f"acked operation {sequence}, outside {self.acked} to"
                              f" {self.next - 1}")
        self.acked = sequence
        self.server.acked(self)

    def push(self, _sequence=None):
        """Write what the follower lacks while the transport takes it."""
        stream = self.server.stream
        while self._streaming and not self.paused and self.next <= stream.last_sequence:
            try:
                parts, size = stream.frame(self.next)
            except KeyError:
                return self._refuse(f"follower {self.node!r} fell behind the operations the"
                                    f" leader keeps (at {self.next}, kept from"
                                    f" {stream.first_retained}): it needs a snapshot")
            self.transport.writeSequence(parts)
            self.bytes_written += size
            self.next += 1
        if self._streaming:
            self.server.check_lag(self)

    def lag(self):
        """C{(operations, bytes)} the follower's durable commits are behind the leader."""
        stream = self.server.stream
        return stream.last_sequence - self.acked, stream.bytes_after(self.acked)

    def pauseProducing(self):
        self.paused = True
        self.pauses += 1

    def resumeProducing(self):
        self.paused = False
        self.push()

    def stopProducing(self):
        self._streaming = False

    def _refuse(self, reason):
        self.server.refused(self.peer, reason)
        self._streaming = False
        self.transport.write(codec.frame(codec.REFUSE, reason.encode("utf-8")))
        self.transport.loseConnection()

    def _drop(self, reason):
        self._cancel_timeout()
        self.server.refused(self.peer, reason)
        self._streaming = False
        self.transport.abortConnection()

    def _cancel_timeout(self):
        if self._timeout is not None and self._timeout.active():
            self._timeout.cancel()
        self._timeout = None

    def connectionLost(self, reason):
        self._cancel_timeout()
        self._streaming = False
        self.server.left(self)


class ReplicationServer(protocol.Factory):
    """
    The leader's replication port (listen on it with any Twisted endpoint):
    streams L{OutboundStream}'s operations to every authenticated follower
    of the same cluster, tracks each one's acks and lag, and answers
    L{confirmed_up_to}.

    @ivar refusals: the latest C{(peer, reason)} of connections refused or dropped.
    """

    log = Logger()

    def __init__(self, stream, secret, cluster_id, *, reactor, max_lag_bytes=16 * 1024 * 1024):
        self.stream = stream
        self.secret = secret
        self.cluster_id = cluster_id
        self.reactor = reactor
        self.max_lag_bytes = max_lag_bytes
        self.followers = set()
        self.refusals = deque(maxlen=REFUSALS_KEPT)
        self._waiters = []  # heap of (sequence, order, Deferred)
        self._order = 0
        stream.subscribe(self._recorded)

    def buildProtocol(self, addr):
        return FollowerLink(self)

    def confirmed_up_to(self, sequence):
        """
        A Deferred firing with C{sequence} once every connected in-sync
        follower has acked an operation at or after it (at once when none is).
        """
        waiter = defer.Deferred()
        self._order += 1
        heapq.heappush(self._waiters, (sequence, self._order, waiter))
        self._release_waiters()
        return waiter

    def status(self):
        """Each follower's node name, acked sequence, lag, in-sync state and pauses."""
        found = []
        for link in sorted(self.followers, key=lambda link: link.node):
            operations, size = link.lag()
            found.append({"node": link.node, "acked": link.acked, "in_sync": link.in_sync,
                          "lag_operations": operations, "lag_bytes": size,
                          "paused": link.paused, "pauses": link.pauses})
        return found

    def joined(self, link):
        self.followers.add(link)
        link.in_sync = link.acked == self.stream.last_sequence  # durable up to the head already

    def left(self, link):
        if link in self.followers:
            self.followers.discard(link)
            self.log.info("replication follower {node} left at operation {acked}",
                          node=link.node, acked=link.acked)
            self._release_waiters()

    def acked(self, link):
        if not link.in_sync and link.acked == self.stream.last_sequence:
            link.in_sync = True
            self.log.info("replication follower {node} is in sync", node=link.node)
        self.check_lag(link)
        self._release_waiters()

    def check_lag(self, link):
        if link.in_sync and self.stream.bytes_after(link.acked) > self.max_lag_bytes:
            link.in_sync = False
            self.log.warn("replication follower {node} left the in-sync set: {size} bytes behind",
                          node=link.node, size=self.stream.bytes_after(link.acked))
            self._release_waiters()

    def refused(self, peer, reason):
        self.refusals.append((peer, reason))
        self.log.warn("replication peer {peer} refused: {reason}", peer=peer, reason=reason)

    def _recorded(self, sequence):
        for link in tuple(self.followers):
            link.push()

    def _release_waiters(self):
        floor = min((link.acked for link in self.followers if link.in_sync), default=None)
        while self._waiters and (floor is None or self._waiters[0][0] <= floor):
            sequence, _, waiter = heapq.heappop(self._waiters)
            waiter.callback(sequence)
