"""
The leader's in-sync set: which followers a confirm waits for, and its upkeep in etcd.

A follower counts for confirms only once etcd's in-sync set names it, and stops counting only
once etcd's set no longer does: the set is written (by the leader, under its lease) before a
change takes effect. So every node etcd lets take the lead holds every confirmed operation:
a follower that falls behind is first taken out of etcd's set, and only then may confirms
go on without it (Kafka's in-sync replicas, kept in etcd as LavinMQ keeps them).

A follower leaves the set when its durable commits lag the leader's stream by more than
the server's C{max_lag_bytes} (the server marks it so as it streams), or by operations
older than C{max_lag_seconds}, or when its link closes; it joins (again) once it has
acknowledged every operation streamed. With fewer nodes in the set
(the leader included) than C{min_isr}, confirms are held until enough followers catch up.
"""

import bisect

from twisted.internet import defer, task
from twisted.logger import Logger

from brokerd.cluster.errors import EtcdError, LeadershipLost
from brokerd.replication.leader import ReplicationServer
from brokerd.replication.waiters import SequenceWaiters

CHECK_FRACTION = 4  # lag is checked this many times per max_lag_seconds
SAMPLE_SECONDS = 0.01  # the stream's (sequence, time) pairs are noted at most this often


class InSyncSet:
    """
    Keeps the leader's in-sync set true in etcd and answers L{wait}: a Deferred that fires
    once an operation is durable on every follower of the set written in etcd, while this
    node still leads.

    @ivar written: the follower names etcd's set holds (this node's name aside).
    @ivar shrinks: how many times a follower was taken out of the set.
    @ivar on_resized: called with the set's new L{size} each time etcd's set changes (the
        leader holds its publishers back while it is below C{min_isr}).
    """

    log = Logger()

    def __init__(self, server, candidate, node_name, *, reactor, min_isr=1,
                 max_lag_seconds=5.0):
        """
        @param server: the leader's L{brokerd.replication.leader.ReplicationServer}.
        @param candidate: this node's L{brokerd.cluster.leadership.Candidate}, which writes
            the set under the leader's lease and answers whether this node still leads.
        """
        self.server = server
        self.candidate = candidate
        self.node_name = node_name
        self.reactor = reactor
        self.min_isr = min_isr
        self.max_lag_seconds = max_lag_seconds
        self.written = frozenset()
        self.shrinks = 0
        self.on_resized = lambda size: None
        self._writing = False
        self._waiters = SequenceWaiters()
        self._times = []  # (sequence, seconds) samples of when operations were recorded
        self._newest = (0, 0.0)  # the newest operation and when, sampled or not
        self._check = task.LoopingCall(self.update)
        self._check.clock = reactor

    def start(self):
        """Write a set of this node alone (it holds all that was confirmed), then keep it."""
        self.server.stream.subscribe(self._recorded)
        self._check.start(max(self.max_lag_seconds / CHECK_FRACTION, 0.05), now=False)
        return self._write(frozenset())

    def stop(self):
        self.server.stream.unsubscribe(self._recorded)
        if self._check.running:
            self._check.stop()

    def wait(self, sequence):
        """A Deferred firing once operation C{sequence} is confirmed by the set (see above)."""
        waiter = self._waiters.wait(sequence)
        self._release()
        return waiter

    def size(self):
        """How many nodes etcd's set holds, this leader included."""
        return len(self.written) + 1

    def update(self, *_):
        """Look at the followers again: leave, join, release (called on every change)."""
        links = {link.node: link for link in self.server.followers}
        for link in links.values():
            if link.in_sync and self._too_far_behind(link):
                link.in_sync = False
                self.log.warn("replication follower {node} left the in-sync set: its commits"
                              " lag more than {seconds} s", node=link.node,
                              seconds=self.max_lag_seconds)
        wanted = frozenset(name for name, link in links.items() if link.in_sync)
        if wanted != self.written and not self._writing:
            self._write(wanted)
        self._release()

    def _too_far_behind(self, link):
        stream = self.server.stream
        if link.acked >= stream.last_sequence:
            return False  # a lag in bytes is the server's to see (check_lag), as it streams
        # The first sample at or after the oldest operation the follower lacks: that
        # operation was recorded no later than the sample, so its age is at least this.
        index = bisect.bisect_left(self._times, (link.acked + 1, float("-inf")))
        if index < len(self._times):
            recorded_by = self._times[index][1]
        elif self._newest[0] > link.acked:
            recorded_by = self._newest[1]
        else:
            # It lacks only operations the stream has not announced yet: this turn's. (The
            # newest noted one is older than they are, by however long the leader was idle.)
            return False
        return self.reactor.seconds() - recorded_by > self.max_lag_seconds

    def _recorded(self, sequence):
        now = self.reactor.seconds()
        self._newest = (sequence, now)
        if not self._times or now - self._times[-1][1] >= SAMPLE_SECONDS:
            self._times.append((sequence, now))
            oldest = min((link.acked for link in self.server.followers), default=sequence)
            cut = bisect.bisect_left(self._times, (oldest, 0.0))
            if cut > 1024:
                del self._times[:cut - 1]

    def _write(self, names):
        self._writing = True
        writing = defer.maybeDeferred(self.candidate.put_in_sync_set,
                                      {self.node_name, *names})
        writing.addCallbacks(self._written, self._not_written, callbackArgs=(frozenset(names),))
        return writing

    def _written(self, _, names):
        self._writing = False
        if names != self.written:
            if self.written - names:
                self.shrinks += 1
            self.log.info("in-sync set is now {names}",
                          names=sorted({self.node_name, *names}))
            self.written = names
            self.on_resized(self.size())
        self.update()

    def _not_written(self, failure):
        self._writing = False
        failure.trap(EtcdError, LeadershipLost)
        self.log.warn("the in-sync set could not be written: {error}", error=failure.value)
        if self.candidate.is_leader():
            self.reactor.callLater(0.2, self.update)

    def _release(self):
        if not self._waiters or not self.candidate.is_leader() or self.size() < self.min_isr:
            return
        links = {link.node: link for link in self.server.followers}
        if any(name not in links for name in self.written):
            return  # a follower of the set is gone: wait until etcd no longer names it
        self._waiters.release(min((links[name].acked for name in self.written), default=None))


def no_delay(transport):
    """
    Send small writes at once (TCP_NODELAY): a follower's acknowledgements are a few bytes
    each, and Nagle's algorithm would hold one back until the leader's delayed ack of the
    previous one, some 40 ms, which every confirm would wait for.
    """
    set_no_delay = getattr(transport, "setTcpNoDelay", None)
    if set_no_delay is not None:
        set_no_delay(True)


class WatchedReplicationServer(ReplicationServer):
    """
    A L{ReplicationServer} that calls C{on_change()} after every change of its followers
    (one joined, acknowledged or left), so that an L{InSyncSet} looks again; a lag the
    server notices while streaming is seen at the set's next periodic look.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_change = lambda: None

    def joined(self, link):
        no_delay(link.transport)
        super().joined(link)
        self.on_change()

    def left(self, link):
        super().left(link)
        self.on_change()

    def acked(self, link):
        super().acked(link)
        self.on_change()
