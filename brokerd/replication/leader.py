"""The leader's replication port: authenticates followers and streams operations to them."""

from collections import deque

from twisted.internet import protocol
from twisted.logger import Logger

from brokerd.replication.link import FollowerLink
from brokerd.replication.waiters import SequenceWaiters

HANDSHAKE_TIMEOUT = 10.0
REFUSALS_KEPT = 100
# The history of a leader whose stores were empty when its stream began: a new
# follower (epoch 0, sequence 0) resumes it from its first operation.
FRESH_HISTORY = ((0, 0),)


class ReplicationServer(protocol.Factory):
    """
    The leader's replication port (listen on it with any Twisted endpoint):
    streams L{OutboundStream}'s operations to every authenticated follower
    of the same cluster, tracks each one's acks and lag, and answers
    L{confirmed_up_to}. A follower that cannot resume is told to resync and
    then given a snapshot of the stream's taps (see L{brokerd.replication.resume}).

    Two links of the same node name: the newer replaces the older (a
    follower that restarted may connect again before the leader has noticed
    its old connection died); the older is dropped, logged in L{refusals}.

    @ivar epoch: this leader's epoch (grows with each election).
    @ivar history: C{((epoch, end sequence), ...)} of the streams this leader's
        stream continues, newest first.
    @ivar refusals: the latest C{(peer, reason)} of connections refused or dropped.
    @ivar resyncs: the latest C{(node, reason)} of followers told to resync.
    """

    log = Logger()

    def __init__(self, stream, secret, cluster_id, *, reactor, max_lag_bytes=16 * 1024 * 1024,
                 epoch=1, history=FRESH_HISTORY, access_document=None,
                 handshake_timeout=HANDSHAKE_TIMEOUT):
        """
        @param stream: the L{OutboundStream} its taps record into.
        @param secret: the cluster's shared secret (bytes).
        @param reactor: schedules the handshake timeout and a snapshot's turns.
        @param epoch: this leader's epoch (the wiring passes etcd's revision of the leader key).
        @param history: see L{history}; L{promote.Leadership} gives both.
        @param access_document: if given, called for the access database's
            JSON document (bytes) that a snapshot starts with.
        """
        self.stream = stream
        self.secret = secret
        self.cluster_id = cluster_id
        self.reactor = reactor
        self.max_lag_bytes = max_lag_bytes
        self.epoch = epoch
        self.history = tuple(history)
        self.access_document = access_document
        self.handshake_timeout = handshake_timeout
        self.followers = set()
        self.refusals = deque(maxlen=REFUSALS_KEPT)
        self.resyncs = deque(maxlen=REFUSALS_KEPT)
        self._waiters = SequenceWaiters()
        stream.subscribe(self._recorded)

    def buildProtocol(self, addr):
        return FollowerLink(self)

    def confirmed_up_to(self, sequence):
        """
        A Deferred firing with C{sequence} once every connected in-sync
        follower has acked an operation at or after it (at once when none is).
        """
        waiter = self._waiters.wait(sequence)
        self._release_waiters()
        return waiter

    def status(self):
        """Each follower's node name, acked sequence, lag, in-sync state, mode and pauses."""
        found = []
        for link in sorted(self.followers, key=lambda link: link.node):
            operations, size = link.lag()
            found.append({"node": link.node, "acked": link.acked, "in_sync": link.in_sync,
                          "lag_operations": operations, "lag_bytes": size,
                          "paused": link.paused, "pauses": link.pauses, "mode": link.mode})
        return found

    def replace(self, link):
        """Drop the older links of C{link}'s node name, before C{link} joins."""
        for other in tuple(self.followers):
            if other is not link and other.node == link.node:
                self.log.warn("replication follower {node} connected again from {peer}; its"
                              " older link from {old} is dropped", node=link.node,
                              peer=link.peer, old=other.peer)
                other.replaced()
                self.followers.discard(other)

    def joined(self, link):
        self.followers.add(link)
        link.in_sync = False

    def resynced(self, link, reason):
        self.resyncs.append((link.node, reason))
        self.log.warn("replication follower {node} must resync: {reason}", node=link.node,
                      reason=reason)

    def left(self, link):
        if link in self.followers:
            self.followers.discard(link)
            self.log.info("replication follower {node} left at operation {acked}",
                          node=link.node, acked=link.acked)
            self._release_waiters()

    def acked(self, link):
        if not link.in_sync and link.mode == "stream" and link.acked == self.stream.last_sequence:
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
        self._waiters.release(
            min((link.acked for link in self.followers if link.in_sync), default=None))
