"""Leader epochs: a follower promoted to leader numbers on from its stores, the other followers
of the old leader resume from it without a copy when its history holds their position, and are
told to resync (a distinct answer, not a refusal) when it cannot."""

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.replication import replica
from tests.support.broker import wait_until
from tests.support.replication import Q1, Follower, Leader, messages, topology


def has_id_header(record):
    return record.properties.HasField("replication_id")


class Promotion(unittest.TestCase):

    @defer.inlineCallbacks
    def cluster_of_three(self, *, b_misses=0):
        """A (sqlite) leads B (chunked) and C (filelog); B leaves C{b_misses} operations early."""
        a = yield Leader().start(self, "sqlite")
        b = yield Follower().start(self, "chunked")
        c = yield Follower().start(self, "filelog")
        yield b.connect(a, node="b")
        yield c.connect(a, node="c")
        topology(a.store)
        messages(a.store, 0, 40)
        yield a.server.confirmed_up_to(a.stream.last_sequence)
        if b_misses:
            yield b.disconnect()
            messages(a.store, 40, 1)
            yield a.server.confirmed_up_to(a.stream.last_sequence)
        return a, b, c

    @defer.inlineCallbacks
    def test_the_others_resume_from_a_promoted_follower_and_end_equal_to_it(self):
        a, b, c = yield self.cluster_of_three()
        a_last = a.stream.last_sequence
        yield a.stop()
        yield c.client.when_lost()
        new = yield Leader().promote(self, b, epoch=2)
        self.assertEqual(new.stream.last_sequence, a_last, "numbering goes on from B's stores")
        self.assertEqual(new.server.history, ((1, a_last), (0, 0)))
        reads = new.store.store  # what the broker reads: ids and the state record hidden
        self.assertFalse(any(replica.is_state(item) for item in reads.topology()))
        recovered = reads.recover(Q1)
        self.assertTrue(recovered)
        self.assertFalse(any(has_id_header(record) for _, record, _ in recovered))
        self.assertFalse(has_id_header(reads.load(recovered[0][0])))
        yield c.connect(new, node="c")
        self.assertEqual(c.client.link.state, "streaming")
        for handle, _, _ in recovered[:7]:
            new.store.ack(Q1, handle)
        new.store.returned(Q1, recovered[8][0], 4)
        messages(new.store, 100, 20)
        self.assertEqual(new.store.unreplicated, 0, "acks of recovered messages stream by id")
        yield wait_until(lambda: c.applier.durable_sequence == new.stream.last_sequence)
        self.assertEqual((c.client.resyncs, list(new.server.resyncs)), (0, []), "no copy was made")
        expected = yield new.reopened_contents()
        self.assertEqual((yield c.reopened_contents()), expected)
        kept = {record.body for _, record, _ in recovered[7:]}
        self.assertFalse({record.body for _, record, _ in recovered[:7]} & {item[3] for item in expected[Q1]})
        self.assertLessEqual(kept, {item[3] for item in expected[Q1]})

    @defer.inlineCallbacks
    def test_the_old_leaders_store_joining_the_new_leader_is_told_to_resync(self):
        a, b, c = yield self.cluster_of_three()
        yield a.stop()
        new = yield Leader().promote(self, b, epoch=2)
        old = yield Follower().start(self, a.backend, a.path)
        self.assertFalse(old.applier.resumable)
        client = yield old.connect(new, node="a", resync=False)
        yield client.when_lost()
        self.assertTrue(client.reason.startswith(
            "resync needed: its stores were last written as a leader's"), client.reason)
        self.assertEqual([node for node, _ in new.server.resyncs], ["a"])
        self.assertEqual(list(new.server.refusals), [])

    @defer.inlineCallbacks
    def test_a_follower_ahead_of_the_promoted_one_is_told_to_resync(self):
        a, b, c = yield self.cluster_of_three(b_misses=1)
        b_last, c_last = b.applier.durable_sequence, c.applier.durable_sequence
        self.assertLess(b_last, c_last)
        yield a.stop()
        new = yield Leader().promote(self, b, epoch=5)
        client = yield c.connect(new, node="c", resync=False)
        yield client.when_lost()
        self.assertEqual(client.reason, f"resync needed: it is at operation {c_last} of epoch 1,"
                                        f" ahead of this leader's {b_last} for that epoch")

    @defer.inlineCallbacks
    def test_a_promoted_leaders_store_following_again_resyncs_and_an_unknown_epoch_too(self):
        a, b, c = yield self.cluster_of_three()
        yield a.stop()
        new = yield Leader().promote(self, b, epoch=2)
        messages(new.store, 100, 5)
        yield new.stop()
        again = yield Follower().start(self, b.backend, b.path)
        self.assertEqual(again.applier.role, replica.LEADER)
        third = yield Leader().promote(self, c, epoch=3)
        client = yield again.connect(third, node="b", resync=False)
        yield client.when_lost()
        self.assertIn("last written as a leader's", client.reason)
        stranger = yield Leader().start(self, "sqlite", epoch=9, history=((7, 100),))
        late = yield Follower().start(self, "chunked")
        yield late.connect(stranger, resync=False)  # a fresh follower: epoch 0, not in the history
        yield late.client.when_lost()
        self.assertEqual(late.client.reason, "resync needed: it holds epoch 0, which is not in the"
                                             " history of this leader (epoch 9)")
