"""Leadership through a real etcd, candidates in this process: one leader, takeover when its lease
goes, the in-sync set deciding who may lead, one name per live node, and the leader's guarded
writes."""

import json

from twisted.internet import defer, reactor
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from brokerd.cluster.clock import SteadyClock
from brokerd.cluster.errors import DuplicateNodeName, EtcdUnavailable, LeadershipLost
from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.view import ClusterKeys, NodeInfo
from tests.support.broker import wait_until
from tests.support.etcd import free_port, needs_etcd, start_etcd

TTL = 2


class Events:
    """What one candidate's callbacks told, in order."""

    def __init__(self):
        self.seen = []

    def callbacks(self):
        return {"on_elected": lambda: self.seen.append(("elected",)),
                "on_stepped_down": lambda reason: self.seen.append(("stepped-down", reason)),
                "on_leader": lambda info: self.seen.append(("leader", info.name if info else None))}


@needs_etcd
class LeadershipTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)
        self.client = EtcdClient(reactor, self.etcd.url, timeout=2.0)
        self.keys = ClusterKeys("c1")
        self.clock = SteadyClock(reactor)

    def candidate(self, name, ttl=TTL, client=None):
        events = Events()
        node = Candidate(client or self.client, self.clock, self.keys, NodeInfo(name, {"amqp": f"tcp:{name}:5672"}),
                         ttl=ttl, retry_seconds=0.1, **events.callbacks())
        node.events = events
        self.addCleanup(node.stop)
        return node

    @defer.inlineCallbacks
    def started(self, *names, ttl=TTL):
        nodes = [self.candidate(name, ttl) for name in names]
        for node in nodes:
            yield node.start()
        yield wait_until(lambda: all(node.view.leader for node in nodes))
        return nodes

    @defer.inlineCallbacks
    def test_one_of_two_candidates_leads_and_both_know_it_and_its_addresses(self):
        a, b = yield self.started("a", "b")
        # a trusts its lease only while its keepalives are answered in time: on a loaded
        # machine that may lapse for a moment, and a leader then claims nothing until it is back
        yield wait_until(a.is_leader, timeout=TTL * 2)
        self.assertFalse(b.is_leader())
        self.assertEqual(b.view.leader, NodeInfo("a", {"amqp": "tcp:a:5672"}))
        self.assertEqual(sorted(b.view.members), ["a", "b"])
        self.assertEqual(sorted(a.events.seen), [("elected",), ("leader", "a")])
        self.assertEqual(b.events.seen, [("leader", "a")])
        stored = yield self.client.range(self.keys.leader)
        self.assertEqual(stored.kvs[0].lease, a.lease.id)
        self.assertEqual(json.loads(stored.kvs[0].value), {"name": "a", "addresses": {"amqp": "tcp:a:5672"}})

    @defer.inlineCallbacks
    def test_when_the_leaders_lease_is_revoked_the_other_takes_over_within_the_ttl(self):
        a, b = yield self.started("a", "b")
        started = reactor.seconds()
        yield self.client.lease_revoke(a.lease.id)
        yield wait_until(b.is_leader, timeout=TTL + 1)
        self.assertLess(reactor.seconds() - started, TTL + 1)
        yield wait_until(lambda: a.ended.called, timeout=TTL + 1)
        self.assertFalse(a.is_leader())
        self.assertEqual([event[0] for event in a.events.seen].count("stepped-down"), 1)
        self.assertIn("no longer has lease", a.ended.result)
        # b may win the key a moment before its watch brings the key back to it.
        yield wait_until(lambda: b.view.has_leader and b.view.leader.name == "b", timeout=2)

    @defer.inlineCallbacks
    def test_a_stopped_leader_hands_over_at_once(self):
        a, b = yield self.started("a", "b", ttl=10)
        yield a.stop()
        yield wait_until(b.is_leader, timeout=2)
        self.assertEqual(a.events.seen[-1], ("stepped-down", "stopping"))

    def waiting_lines(self):
        """The log lines of candidates waiting to be admitted to the in-sync set, as they come."""
        lines = []

        def observe(event):
            if event.get("log_namespace") == "brokerd.cluster.leadership":
                text = formatEvent(event)
                if text.startswith("not in the in-sync set"):
                    lines.append(text)

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        return lines

    @defer.inlineCallbacks
    def test_only_a_member_of_the_in_sync_set_may_take_the_lead(self):
        waiting = self.waiting_lines()
        yield self.client.put(self.keys.isr, json.dumps(["b"]))
        (a,) = yield self.started_without_leader("a")
        # a read the cluster and chose not to campaign: no transaction of its is on its way.
        self.assertEqual(waiting, ["not in the in-sync set ['b']: waiting to be admitted before taking the lead"])
        self.assertFalse(a.is_leader())
        b = self.candidate("b")
        yield b.start()
        yield wait_until(b.is_leader)
        self.assertFalse(a.is_leader())
        # The leader writes the set; a, now in it, takes over when b goes.
        yield b.put_in_sync_set(["a", "b"])
        yield b.stop()
        yield wait_until(a.is_leader)

    @defer.inlineCallbacks
    def started_without_leader(self, *names):
        nodes = [self.candidate(name) for name in names]
        for node in nodes:
            yield node.start()
        return nodes

    @defer.inlineCallbacks
    def test_a_damaged_in_sync_set_admits_nobody(self):
        waiting = self.waiting_lines()
        yield self.client.put(self.keys.isr, b'{"not": "a list"}')
        (a,) = yield self.started_without_leader("a")
        self.assertEqual(len(waiting), 1)
        found = yield self.client.range(self.keys.leader)
        self.assertEqual(found.kvs, [])
        yield self.client.put(self.keys.isr, b"[]")
        yield wait_until(a.is_leader)
        self.flushLoggedErrors()

    @defer.inlineCallbacks
    def test_the_leader_writes_the_in_sync_set(self):
        (a,) = yield self.started("a")
        self.assertTrue(a.is_leader())
        yield a.put_in_sync_set(["a"])
        found = yield self.client.range(self.keys.isr)
        self.assertEqual(json.loads(found.kvs[0].value), ["a"])

    @defer.inlineCallbacks
    def test_a_second_live_node_with_the_same_name_is_refused_by_name(self):
        (first,) = yield self.started("n1")
        second = self.candidate("n1")
        with self.assertRaises(DuplicateNodeName) as raised:
            yield second.start()
        self.assertIn("'n1'", str(raised.exception))
        self.assertIn("c1", str(raised.exception))
        self.assertTrue(first.is_leader())
        # The refused node gave its lease back: nothing of it is left in etcd.
        members = yield self.client.range(self.keys.members, prefix=True)
        self.assertEqual([kv.lease for kv in members.kvs], [first.lease.id])

    @defer.inlineCallbacks
    def test_a_member_key_kept_without_a_lease_is_refused_at_once(self):
        yield self.client.put(self.keys.member("n1"), NodeInfo("n1").to_json())
        node = self.candidate("n1", ttl=10)
        with self.assertRaises(DuplicateNodeName) as raised:
            yield node.start()
        self.assertIn("'n1'", str(raised.exception))

    @defer.inlineCallbacks
    def test_a_leader_that_loses_the_leader_key_steps_down_and_campaigns_again(self):
        (a,) = yield self.started("a", ttl=10)
        yield self.client.delete(self.keys.leader)
        yield wait_until(lambda: ("stepped-down", "the leader key is no longer this node's") in a.events.seen)
        yield wait_until(a.is_leader)
        self.assertEqual(a.events.seen.count(("elected",)), 2)

    @defer.inlineCallbacks
    def test_leadership_outlives_a_short_etcd_restart_and_takeover_still_follows(self):
        a, b = yield self.started("a", "b", ttl=10)
        self.etcd.kill()
        self.etcd.restart()
        # Keepalives and watches carry on through the restart: a still leads when its next keepalives are answered.
        sent = a.keeper.keepalives_sent
        yield wait_until(lambda: a.keeper.keepalives_sent > sent + 1, timeout=10)
        self.assertTrue(a.is_leader())
        self.assertFalse(b.is_leader())
        yield self.client.lease_revoke(a.lease.id)
        yield wait_until(b.is_leader, timeout=5)

    @defer.inlineCallbacks
    def test_a_follower_cannot_write_the_in_sync_set(self):
        a, b = yield self.started("a", "b")
        with self.assertRaises(LeadershipLost):
            yield b.put_in_sync_set(["b"])


class UnreachableTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_node_whose_etcd_is_unreachable_fails_to_start_naming_the_urls(self):
        urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
        node = Candidate(EtcdClient(reactor, ",".join(urls), timeout=1.0), SteadyClock(reactor), ClusterKeys("c"),
                         NodeInfo("n"), ttl=TTL)
        with self.assertRaises(EtcdUnavailable) as raised:
            yield node.start()
        for url in urls:
            self.assertIn(url, str(raised.exception))
        self.assertFalse(node.is_leader())
