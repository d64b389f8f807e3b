"""
The lease's fencing deadline on a driven clock, with a real etcd answering (or, stopped, not
answering) the keepalives: a holder stops trusting its lease 2/3 of the TTL after the sending of
the last keepalive etcd answered, which is before etcd can expire it.
"""

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from brokerd.cluster import etcd
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.lease import LeaseKeeper
from brokerd.cluster.view import ClusterKeys, NodeInfo
from tests.support.broker import wait_until
from tests.support.etcd import needs_etcd, start_etcd

TTL = 9  # divisible by 3: the keepalive interval is 3 s and the fence 6 s after a send


@needs_etcd
class FencingTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)
        self.client = etcd.EtcdClient(reactor, self.etcd.url, timeout=2.0)
        self.clock = task.Clock()
        self.keeper = LeaseKeeper(self.client, self.clock, ttl=TTL)
        self.lost = []
        self.keeper.lost.addCallback(lambda reason: self.lost.append((self.clock.seconds(), reason)))

    def tearDown(self):
        return self.keeper.revoke()

    @defer.inlineCallbacks
    def renewed(self, at):
        """Advances the clock to C{at}, where a keepalive goes out, and waits for etcd's answer."""
        before = self.keeper.deadline
        self.clock.advance(at - self.clock.seconds())
        yield wait_until(lambda: self.keeper.deadline != before or self.lost)

    @defer.inlineCallbacks
    def test_keepalives_every_third_of_the_ttl_move_the_deadline_from_their_send_time(self):
        lease = yield self.keeper.start()
        self.assertEqual(lease.ttl, TTL)
        self.assertEqual(self.keeper.deadline, 6)
        self.clock.advance(2.9)
        self.assertEqual(self.keeper.keepalives_sent, 0)
        yield self.renewed(3)
        self.assertEqual(self.keeper.keepalives_sent, 1)
        self.assertEqual(self.keeper.deadline, 3 + 6)
        yield self.renewed(6)
        self.assertEqual(self.keeper.deadline, 6 + 6)
        self.assertTrue(self.keeper.valid())
        self.assertEqual(self.lost, [])

    @defer.inlineCallbacks
    def test_a_late_answer_counts_from_when_the_keepalive_was_sent(self):
        yield self.keeper.start()
        self.etcd.pause()
        self.clock.advance(3)  # the keepalive goes out and waits on the stopped etcd
        self.clock.advance(1.5)  # ...while time passes before its answer
        self.etcd.resume()
        yield wait_until(lambda: self.keeper.deadline != 6)
        self.assertEqual(self.keeper.deadline, 3 + 6)

    @defer.inlineCallbacks
    def test_no_answer_for_two_thirds_of_the_ttl_steps_down_before_the_lease_could_expire(self):
        yield self.keeper.start()
        yield self.renewed(3)
        last_answered_send = 3
        self.etcd.pause()
        self.addCleanup(self.etcd.resume)
        self.clock.advance(3)  # the keepalive at 6 gets no answer; retries go out as the clock moves
        while self.clock.seconds() < 8.9:
            self.clock.advance(0.1)
            self.assertTrue(self.keeper.valid())
        self.assertEqual(self.lost, [])
        self.clock.rightNow = 9.0
        self.clock.advance(0)
        self.assertEqual(len(self.lost), 1)
        stepped_down_at, reason = self.lost[0]
        self.assertEqual(stepped_down_at, last_answered_send + TTL * 2 / 3)
        self.assertLess(stepped_down_at, last_answered_send + TTL)  # etcd keeps the lease until then at least
        self.assertIn("no keepalive", reason)
        self.assertFalse(self.keeper.valid())

    @defer.inlineCallbacks
    def test_a_holder_stopped_past_its_ttl_is_fenced_before_it_sends_anything(self):
        yield self.keeper.start()
        yield self.renewed(3)
        sent = self.keeper.keepalives_sent
        # A process stopped (SIGSTOP) for longer than the TTL wakes with every timer due at once.
        self.clock.advance(3 + TTL)
        self.assertEqual([reason[:12] for _, reason in self.lost], ["no keepalive"])
        self.assertEqual(self.keeper.keepalives_sent, sent)
        self.assertFalse(self.keeper.valid())

    @defer.inlineCallbacks
    def test_valid_is_false_at_the_deadline_even_before_any_timer_ran(self):
        yield self.keeper.start()
        self.clock.rightNow = 6.0  # time moved; no delayed call has run yet
        self.assertFalse(self.keeper.valid())
        self.assertEqual(len(self.lost), 1)

    @defer.inlineCallbacks
    def test_a_lease_revoked_in_etcd_is_lost_at_the_next_keepalive(self):
        lease = yield self.keeper.start()
        yield self.client.lease_revoke(lease.id)
        yield self.renewed(3)
        self.assertEqual(len(self.lost), 1)
        self.assertIn("no longer has lease", self.lost[0][1])

    @defer.inlineCallbacks
    def test_giving_the_lease_up_during_a_keepalive_leaves_no_keepalive_to_come(self):
        yield self.keeper.start()
        self.etcd.pause()
        self.clock.advance(3)  # a keepalive goes out and waits on the stopped etcd
        self.assertEqual(self.keeper.keepalives_sent, 1)
        self.keeper.gone("told so")  # as when another call learns the lease is gone
        self.etcd.resume()
        self.assertEqual([reason for _, reason in self.lost], ["told so"])
        # The cancelled keepalive fails as a request the client gave up; nothing follows it.
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(TTL)
        self.assertEqual(self.keeper.keepalives_sent, 1)

    @defer.inlineCallbacks
    def test_revoking_removes_the_leased_keys_at_once(self):
        lease = yield self.keeper.start()
        yield self.client.put(b"/fence/k", b"v", lease=lease.id)
        yield self.keeper.revoke()
        found = yield self.client.range(b"/fence/k")
        self.assertEqual(found.kvs, [])
        self.assertEqual(self.lost[0][1], "revoked")


@needs_etcd
class LeaderFencingTests(unittest.TestCase):
    """The same rule seen from a leader: it steps down, and says so, when its deadline passes."""

    @defer.inlineCallbacks
    def test_a_leader_whose_keepalives_go_unanswered_steps_down_before_its_lease_could_expire(self):
        etcd_process = start_etcd(self)
        client = etcd.EtcdClient(reactor, etcd_process.url, timeout=2.0)
        clock = task.Clock()
        stepped_down = []
        leader = Candidate(client, clock, ClusterKeys("fence"), NodeInfo("a"), ttl=TTL,
                           on_stepped_down=lambda reason: stepped_down.append((clock.seconds(), reason)))
        self.addCleanup(leader.stop)
        yield leader.start()
        yield wait_until(leader.is_leader)
        yield wait_until(lambda: leader.keeper.deadline == TTL * 2 / 3)
        clock.advance(3)  # the keepalive at 3 is answered
        yield wait_until(lambda: leader.keeper.deadline == 3 + TTL * 2 / 3)
        etcd_process.pause()
        self.addCleanup(etcd_process.resume)
        clock.advance(5.9)  # the keepalive at 6 goes out and gets no answer
        self.assertTrue(leader.is_leader())
        self.assertEqual(stepped_down, [])
        clock.advance(0.1)
        self.assertFalse(leader.is_leader())
        self.assertEqual(len(stepped_down), 1)
        self.assertEqual(stepped_down[0][0], 3 + TTL * 2 / 3)  # the last answered keepalive went out at 3
        self.assertLess(stepped_down[0][0], 3 + TTL)  # etcd keeps the lease until then at least
        self.assertIn("no keepalive", stepped_down[0][1])
        self.assertIn("no keepalive", leader.ended.result)


class LeaseOptionTests(unittest.SynchronousTestCase):
    def test_a_fence_at_or_past_the_ttl_or_a_ttl_etcd_refuses_is_refused(self):
        client = etcd.EtcdClient(reactor, "http://127.0.0.1:2379")
        for fraction in (0, 1, 1.5):
            self.assertRaises(ValueError, LeaseKeeper, client, task.Clock(), 10, fraction)
        self.assertRaises(ValueError, LeaseKeeper, client, task.Clock(), 1)
