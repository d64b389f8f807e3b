"""
The leader's in-sync set against a real etcd: a follower counts for confirms once etcd's set
names it; one that stops acknowledging is taken out of etcd's set before any confirm goes on
without it; with fewer in sync than min-isr nothing is confirmed; and a node that no longer leads
confirms nothing.
"""

import json

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from brokerd.cluster.clock import SteadyClock
from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.view import ClusterKeys, NodeInfo
from brokerd.replication.in_sync import InSyncSet, WatchedReplicationServer
from tests.support.broker import wait_until
from tests.support.etcd import needs_etcd, start_etcd
from tests.support.replication import Follower, Leader, messages, topology


@needs_etcd
class InSyncSetTests(unittest.TestCase):
    @defer.inlineCallbacks
    def setUp(self):
        self.etcd = start_etcd(self)
        self.client = EtcdClient(reactor, self.etcd.url, timeout=2.0)
        self.keys = ClusterKeys("c1")
        self.candidate = Candidate(self.client, SteadyClock(reactor), self.keys, NodeInfo("lead"),
                                   ttl=4, retry_seconds=0.1)
        self.addCleanup(self.candidate.stop)
        yield self.candidate.start()
        yield wait_until(self.candidate.is_leader)
        self.leader = yield Leader().start(self, "sqlite", server_class=WatchedReplicationServer)

    @defer.inlineCallbacks
    def in_sync_set(self, **settings):
        in_sync = InSyncSet(self.leader.server, self.candidate, "lead", reactor=reactor, **settings)
        self.leader.server.on_change = in_sync.update
        self.addCleanup(in_sync.stop)
        yield in_sync.start()
        return in_sync

    @defer.inlineCallbacks
    def etcd_set(self):
        stored = yield self.client.range(self.keys.isr)
        return json.loads(stored.kvs[0].value) if stored.kvs else None

    @defer.inlineCallbacks
    def test_a_follower_that_stops_acknowledging_leaves_etcds_set_before_a_confirm_goes_on(self):
        in_sync = yield self.in_sync_set(max_lag_seconds=0.5)
        self.assertEqual((yield self.etcd_set()), ["lead"], "a new leader's set is itself alone")
        follower = yield Follower().start(self, "chunked")
        yield follower.connect(self.leader, node="f1")
        topology(self.leader.store)
        messages(self.leader.store, 0, 20)
        yield wait_until(lambda: in_sync.written == {"f1"})
        self.assertEqual((yield self.etcd_set()), ["f1", "lead"])
        yield in_sync.wait(self.leader.stream.last_sequence)
        self.assertEqual(follower.applier.durable_sequence, self.leader.stream.last_sequence)

        follower.client.link.transport.pauseProducing()  # it reads nothing more: no more acks
        messages(self.leader.store, 20, 5)
        waiting = in_sync.wait(self.leader.stream.last_sequence)
        seen = []
        waiting.addCallback(lambda _: seen.append(set(in_sync.written)))
        yield wait_until(lambda: seen, timeout=10)
        self.assertEqual(seen, [set()], "released only once etcd's set had lost the follower")
        self.assertEqual((yield self.etcd_set()), ["lead"])
        self.assertLess(follower.applier.durable_sequence, self.leader.stream.last_sequence)
        self.assertGreaterEqual(in_sync.shrinks, 1)

        follower.client.link.transport.resumeProducing()
        yield wait_until(lambda: in_sync.written == {"f1"}, timeout=10)
        self.assertEqual((yield self.etcd_set()), ["f1", "lead"])

    @defer.inlineCallbacks
    def test_operations_of_the_turn_after_an_idle_spell_do_not_make_a_follower_look_behind(self):
        clock = task.Clock()  # the set's own time, moved by hand past its lag bound
        in_sync = InSyncSet(self.leader.server, self.candidate, "lead", reactor=clock,
                            max_lag_seconds=0.5)
        self.leader.server.on_change = in_sync.update
        self.addCleanup(in_sync.stop)
        yield in_sync.start()
        follower = yield Follower().start(self, "chunked")
        yield follower.connect(self.leader, node="f1")
        topology(self.leader.store)
        messages(self.leader.store, 0, 5)
        (link,) = self.leader.server.followers
        yield wait_until(lambda: in_sync.written == {"f1"}
                         and link.acked == self.leader.stream.last_sequence)
        clock.advance(10)  # the leader published nothing for 10 s
        messages(self.leader.store, 5, 3)  # streamed at the end of this turn
        in_sync.update()  # the lag check, in the same turn
        self.assertTrue(link.in_sync, "operations of this very turn are not 10 s old")
        self.assertEqual(in_sync.shrinks, 0)

    @defer.inlineCallbacks
    def test_with_fewer_in_sync_than_min_isr_nothing_is_confirmed_until_a_follower_catches_up(self):
        in_sync = yield self.in_sync_set(min_isr=2)
        topology(self.leader.store)
        messages(self.leader.store, 0, 10)
        held = in_sync.wait(self.leader.stream.last_sequence)
        # wait() releases at once what it may: with no follower, the leader alone would do.
        self.assertFalse(held.called, "the leader alone is not enough")
        follower = yield Follower().start(self, "filelog")
        yield follower.connect(self.leader, node="f1")
        yield held
        self.assertEqual(in_sync.size(), 2)

    @defer.inlineCallbacks
    def test_a_node_that_no_longer_leads_confirms_nothing(self):
        in_sync = yield self.in_sync_set()
        topology(self.leader.store)
        yield in_sync.wait(self.leader.stream.last_sequence)
        yield self.client.lease_revoke(self.candidate.lease.id)
        yield wait_until(lambda: not self.candidate.is_leader(), timeout=10)
        messages(self.leader.store, 0, 5)
        held = in_sync.wait(self.leader.stream.last_sequence)
        self.assertFalse(held.called, "no follower to wait for, yet no confirm: it does not lead")
        in_sync.update()
        self.assertFalse(held.called)
