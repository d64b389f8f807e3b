"""
Leadership and membership of a brokerd cluster, decided by etcd alone.

A L{Candidate} holds a lease (L{LeaseKeeper}); under it, it creates its member key
C{members/NAME} if absent (a second live node with the same name is refused) and, when the
cluster has no leader and the in-sync set admits it, the C{leader} key, in one transaction that
also checks the in-sync set did not change since it was read. Every node watches the cluster's
keys, so when the leader's lease ends and etcd deletes its key, the others campaign at once.
A leader whose lease can no longer be trusted steps down (fencing, see L{brokerd.cluster.lease}).
"""

import json

from twisted.internet import defer, task
from twisted.logger import Logger

from brokerd.cluster import etcd
from brokerd.cluster.errors import DuplicateNodeName, EtcdError, LeadershipLost, LeaseNotFound
from brokerd.cluster.lease import DEFAULT_TTL, LeaseKeeper
from brokerd.cluster.view import ClusterView
from brokerd.cluster.watch import KeyWatch

RETRY_SECONDS = 0.5
# etcd revokes an expired lease on its own tick (500 ms) after the TTL: how long to look again,
# and how long past a lease's TTL its key may linger before the name counts as taken.
EXPIRY_TICK = 0.5
EXPIRY_SLACK = 10

log = Logger()


def ignore(*args):
    """The default of every L{Candidate} callback."""


class Candidate:
    """
    One node of cluster C{keys} (a L{brokerd.cluster.view.ClusterKeys}) taking part in its
    leadership as C{node} (a L{brokerd.cluster.view.NodeInfo}).

    Callbacks, all optional: C{on_elected()} when this node became leader;
    C{on_stepped_down(reason)} when it stopped being leader (before anything else it does once
    its lease is not to be trusted); C{on_leader(info)} whenever the cluster's leader changes
    (a L{NodeInfo}, or None while there is none).

    @ivar keeper: the L{LeaseKeeper} of this node's lease (its fencing deadline, keepalives).
    @ivar view: the cluster as this node last read it (L{ClusterView}).
    @ivar ended: a Deferred firing once, with the reason, when this node can no longer take part
        (its lease is lost, or L{stop} was called). The broker should then stop serving.
    """

    def __init__(self, client, clock, keys, node, ttl=DEFAULT_TTL, on_elected=ignore,
                 on_stepped_down=ignore, on_leader=ignore, retry_seconds=RETRY_SECONDS):
        self._client, self._clock, self._keys, self.node = client, clock, keys, node
        self.keeper = LeaseKeeper(client, clock, ttl)
        self._on_elected, self._on_stepped_down, self._on_leader = (
            on_elected, on_stepped_down, on_leader)
        self._retry_seconds = retry_seconds
        self.view = ClusterView(keys)
        self.ended = defer.Deferred()
        self._watch = None
        self._leading = False
        self._won_revision = None  # the revision at which this node took the leader key
        self._campaigning = False
        self._retry = None
        self._announced = None
        self._waiting_logged = False

    def is_leader(self):
        """Whether this node leads now: it won the leader key and its lease is still trusted.
        Ask before every act only a leader may do (a confirm); the answer is never stale."""
        return self._leading and self.keeper.valid()

    @property
    def elected_revision(self):
        """etcd's revision when this node last took the leader key (None before): it grows
        with every election, so it numbers the terms of the cluster's leaders."""
        return self._won_revision

    @property
    def lease(self):
        """The lease this node's keys live under (None before L{start})."""
        return self.keeper.lease

    @defer.inlineCallbacks
    def start(self):
        """
        Grants the lease, joins as a member, and starts watching (and campaigning). Fires once
        this node knows the cluster (its first reading of the keys); fails with the etcd
        client's error when etcd cannot be reached, or L{DuplicateNodeName}.
        """
        lease = yield self.keeper.start()
        self.keeper.lost.addCallback(self._lease_lost)
        try:
            yield self._join(lease.id)
        except BaseException:
            yield self.keeper.revoke()
            raise
        self._watch = KeyWatch(self._client, self._clock, self._keys.root, self._snapshot,
                               self._changed, prefix=True, retry_seconds=self._retry_seconds,
                               probe_seconds=self.keeper.keepalive_interval)
        watching = self._watch.start()
        yield defer.DeferredList([watching, self.ended], fireOnOneCallback=True)
        if not watching.called:
            raise LeadershipLost(f"{self.node.name} lost its lease before it could read the "
                                 f"cluster's keys: {self.ended.result}")

    @defer.inlineCallbacks
    def _join(self, lease_id):
        """
        Creates this node's member key under C{lease_id}. When another lease holds it, that may
        be this node's previous run, whose lease has not expired yet: wait it out (etcd's
        remaining TTL, rounded down, plus a second); a holder that renewed meanwhile is a live
        node of the same name, and refused.
        """
        key = self._keys.member(self.node.name)
        waited, deadline = False, None
        while True:
            result = yield self._client.txn(
                [etcd.key_absent(key)], [etcd.put_request(key, self.node.to_json(), lease_id)],
                [etcd.range_request(key)],
            )
            holders = [] if result.succeeded else result.responses[0].kvs
            if result.succeeded or (holders and holders[0].lease == lease_id):
                return
            holder = holders[0].lease if holders else None  # None: it went meanwhile
            left = 0
            if holder:
                try:
                    left = yield self._client.lease_time_to_live(holder)
                except LeaseNotFound:
                    pass  # expired: etcd deletes the key on its next tick
            now = self._clock.seconds()
            deadline = now + left + EXPIRY_SLACK if deadline is None else deadline
            if holder == 0 or (holder and (waited and left > 0 or now > deadline)):
                raise DuplicateNodeName(
                    f"node name {self.node.name!r} is taken in cluster {self._keys.cluster!r}: "
                    f"its member key is held by a live node (lease {holder:x}); give each node "
                    "its own name"
                )
            if now > deadline:
                raise EtcdError(f"the member key of {self.node.name!r} could not be created")
            if left > 0:
                log.info("node name {name!r} is held by lease {lease:x} for {left} s more; "
                         "waiting for it to expire", name=self.node.name, lease=holder, left=left)
                waited = True
            yield task.deferLater(self._clock, left + 1 if left > 0 else EXPIRY_TICK)

    def _snapshot(self, kvs, revision):
        self.view.reset()
        for kv in kvs:
            self.view.apply(kv, deleted=False)
        self._updated()

    def _changed(self, events):
        for event in events:
            self.view.apply(event.kv, event.deleted)
        self._updated()

    def _updated(self):
        if self.ended.called:
            return
        leader = self.view.leader if self.view.has_leader else None
        if leader != self._announced:
            self._announced = leader
            self._on_leader(leader)
        ours = self.view.has_leader and self.view.leader_lease == self.lease.id
        # The watch may still bring revisions from before this node took the key.
        current = self._watch is not None and self._watch.revision >= (self._won_revision or 0)
        if self._leading and current and not ours:
            self._step_down("the leader key is no longer this node's")
        self._campaign()

    def _campaign(self):
        if (self._leading or self._campaigning or self.ended.called or self.view.has_leader
                or (self._retry is not None and self._retry.active())):
            return
        if not self.view.admits(self.node.name):
            if not self._waiting_logged:
                log.info("not in the in-sync set {names}: waiting to be admitted before taking "
                         "the lead", names=self.view.in_sync)
                self._waiting_logged = True
            return
        self._waiting_logged = False
        if not self.keeper.valid():
            return
        self._campaigning = True
        leader = self._keys.leader
        attempt = self._client.txn(
            [etcd.key_absent(leader),
             etcd.mod_revision_is(self._keys.isr, self.view.in_sync_revision)],
            [etcd.put_request(leader, self.node.to_json(), self.lease.id)],
            [etcd.range_request(leader)],
        )
        attempt.addCallbacks(self._campaigned, self._campaign_failed)

    def _campaigned(self, result):
        self._campaigning = False
        if self.ended.called:
            return
        holders = [] if result.succeeded else result.responses[0].kvs
        if result.succeeded or (holders and holders[0].lease == self.lease.id):
            if self.keeper.valid():
                self._leading = True
                self._won_revision = result.revision
                log.info("{name} leads cluster {cluster}", name=self.node.name,
                         cluster=self._keys.cluster)
                self._on_elected()
            return
        # Another node took the key, or the in-sync set changed since it was read: the watch
        # brings either; look again a moment later.
        self._retry_later()

    def _campaign_failed(self, failure):
        self._campaigning = False
        failure.trap(EtcdError)
        if failure.check(LeaseNotFound):
            self.keeper.gone(f"etcd no longer has lease {self.lease.id:x}: {failure.value}")
            return
        log.warn("campaign for the lead failed: {error}", error=failure.value)
        self._retry_later()

    def _retry_later(self):
        if not self.ended.called:
            self._retry = self._clock.callLater(self._retry_seconds, self._campaign)

    def _step_down(self, reason):
        if self._leading:
            self._leading = False
            log.warn("{name} steps down: {reason}", name=self.node.name, reason=reason)
            self._on_stepped_down(reason)

    def _lease_lost(self, reason):
        self._step_down(reason)
        self._end(reason)

    def _end(self, reason):
        if self._watch is not None:
            self._watch.stop()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        if not self.ended.called:
            self.ended.callback(reason)

    @defer.inlineCallbacks
    def put_in_sync_set(self, names):
        """
        Writes the in-sync set, as the leader only: the write is made in etcd only while the
        leader key is still under this node's lease. Fails with L{LeadershipLost} otherwise.
        """
        if not self.is_leader():
            raise LeadershipLost(f"{self.node.name} is not the leader: the in-sync set is not its")
        value = json.dumps(sorted(set(names))).encode()
        result = yield self._client.txn([etcd.lease_is(self._keys.leader, self.lease.id)],
                                        [etcd.put_request(self._keys.isr, value)])
        if not result.succeeded:
            self._step_down("the leader key is no longer under this node's lease")
            raise LeadershipLost(f"{self.node.name} lost the lead before writing the in-sync set")
        return result.revision

    @defer.inlineCallbacks
    def stop(self):
        """Leaves the cluster: steps down, stops watching, and revokes the lease, so the leader
        key (if it was this node's) and the member key go at once."""
        self._step_down("stopping")
        self._end("stopped")
        yield self.keeper.revoke()

