"""A follower running with a state record written now and then: its stores say "running" while
it follows, so a crash leaves them to resync rather than resume from a sequence their data may
have passed; a clean stop writes the exact sequence and the stores resume from it."""

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.replication import replica
from tests.support.broker import wait_until
from tests.support.replication import Follower, Leader, messages, topology


def stored_state(store):
    return next(replica.read_state(item) for item in store.topology() if replica.is_state(item))


class LazyStateRecordTests(unittest.TestCase):
    @defer.inlineCallbacks
    def follow(self, state_seconds):
        leader = yield Leader().start(self, "sqlite")
        follower = yield Follower().start(self, "chunked", state_seconds=state_seconds)
        yield follower.applier.start_running()
        yield follower.connect(leader)
        topology(leader.store)
        for first in range(0, 60, 10):
            messages(leader.store, first, 10)
            yield leader.server.confirmed_up_to(leader.stream.last_sequence)
        return leader, follower

    @defer.inlineCallbacks
    def test_a_running_follower_writes_its_state_seldom_and_a_crash_leaves_it_to_resync(self):
        leader, follower = yield self.follow(state_seconds=3600)
        self.assertGreater(follower.applier.commits, 3)
        state = stored_state(follower.store)
        self.assertEqual(state.role, replica.RUNNING)
        self.assertLess(state.sequence, follower.applier.durable_sequence,
                        "the record was not rewritten with each commit")
        yield follower.disconnect()
        path = follower.path
        store, follower.store = follower.store, None
        yield store.close()  # as a crash leaves it: no clean stop
        restarted = yield Follower().start(self, "chunked", path)
        self.assertFalse(restarted.applier.resumable)
        client = yield restarted.connect(leader, node="n3")
        yield wait_until(lambda: client.resyncs > 0, timeout=30)
        yield wait_until(lambda: restarted.applier.durable_sequence == leader.stream.last_sequence,
                         timeout=30)
        self.assertEqual((yield restarted.reopened_contents()), (yield leader.reopened_contents()))

    @defer.inlineCallbacks
    def test_a_clean_stop_writes_the_exact_state_and_the_follower_resumes(self):
        leader, follower = yield self.follow(state_seconds=3600)
        yield follower.disconnect()
        durable = yield follower.applier.stop_running()
        self.assertEqual(durable, leader.stream.last_sequence)
        self.assertEqual(stored_state(follower.store), replica.StoreState(
            "c1", follower.applier.epoch, durable, replica.FOLLOWER, follower.applier.history))
        path = follower.path
        yield follower.stop()
        restarted = yield Follower().start(self, "chunked", path)
        self.assertTrue(restarted.applier.resumable)
        client = yield restarted.connect(leader, node="n3")
        messages(leader.store, 60, 10)
        yield wait_until(lambda: restarted.applier.durable_sequence == leader.stream.last_sequence,
                         timeout=30)
        self.assertEqual(client.resyncs, 0)
        self.assertEqual((yield restarted.reopened_contents()), (yield leader.reopened_contents()))
