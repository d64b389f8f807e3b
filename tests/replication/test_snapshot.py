"""A follower that cannot resume is told to resync: it wipes its stores, receives a snapshot of the
leader's stores taken at one stream position, then the operations after it, while the leader goes
on publishing and acking; it ends holding what the leader holds, and the snapshot never blocks the
leader's reactor for long."""

import gc
import time

from twisted.internet import defer, reactor
from twisted.trial import unittest

from brokerd.proto import messages_pb2
from brokerd.replication import replica
from brokerd.replication.follower import SNAPSHOT_COMMIT_BYTES
from tests.support.broker import wait_until
from tests.support.replication import (
    MIB, Q1, Q2, Follower, Leader, OnLoad, message, messages, topology)


class Traffic:
    """
    Publishes to and acks from the leader's store on every reactor turn until the follower's
    snapshot has been sent, acking from the newest message back, which a snapshot in queue
    order sends last. It stops at the snapshot's end: the follower then catches up with what
    was published meanwhile, and no later publishing can push that past the leader's
    retention.

    C{gaps} are the times between turns less the cyclic collector's pauses within them: the
    collector walks every object of this test process (its size depends on the tests run
    before), and a pause of its own is not a stall of the snapshot's making.
    """

    def __init__(self, leader, handles):
        self.leader, self.handles = leader, list(handles)
        self.published = self.acked = self.during_snapshot = 0
        self.position = None  # the snapshot's stream position, once seen
        self.gaps = []
        self.finished = False
        self._collecting = self._collected = 0.0
        gc.callbacks.append(self._collector)
        self._last = time.monotonic()
        self._call = reactor.callLater(0, self._turn)

    def _collector(self, phase, info):
        if phase == "start":
            self._collecting = time.monotonic()
        else:
            self._collected += time.monotonic() - self._collecting

    def _turn(self):
        now = time.monotonic()
        self.gaps.append(now - self._last - self._collected)
        self._last, self._collected = now, 0.0
        snapshots = [link.snapshot for link in self.leader.server.followers if link.snapshot]
        if snapshots:
            self.position = snapshots[0].position
            self.during_snapshot += 1
        elif self.position is not None:
            return self.stop()
        store = self.leader.store
        store.append(message(b"during %d" % self.published, n=self.published), [Q1, Q2])
        self.published += 1
        if self.handles and self.published % 2:
            store.ack(Q1, self.handles.pop())
            self.acked += 1
        self._call = reactor.callLater(0, self._turn)

    def stop(self):
        self.finished = True
        if self._collector in gc.callbacks:
            gc.callbacks.remove(self._collector)
        if self._call.active():
            self._call.cancel()


class Resync(unittest.TestCase):

    @defer.inlineCallbacks
    def test_a_wiped_follower_resyncs_under_traffic_and_ends_equal_to_the_leader(self):
        leader = yield Leader().start(self, "chunked", retain_bytes=256 * 1024)
        follower = yield Follower().start(self, "sqlite")
        yield follower.connect(leader)
        topology(leader.store)
        messages(leader.store, 0, 30)
        yield leader.server.confirmed_up_to(leader.stream.last_sequence)
        yield follower.disconnect()
        before = follower.applier.durable_sequence
        handles = [leader.store.append(message(b"x" * (i % 300), n=i), [Q1]) for i in range(3000)]
        leader.store.save_queue(messages_pb2.QueueRecord(vhost="/", name="later", durable=True))
        self.assertGreater(leader.stream.first_retained, before + 1)
        traffic = Traffic(leader, handles)
        self.addCleanup(traffic.stop)
        client = yield follower.connect(leader)
        self.assertEqual(client.resyncs, 1)
        yield wait_until(lambda: traffic.finished, timeout=60)
        last = leader.stream.last_sequence
        yield wait_until(lambda: follower.applier.durable_sequence == last, timeout=30)
        self.assertIsNone(client.reason)
        self.assertEqual(follower.applier.role, replica.FOLLOWER)
        self.assertGreater(traffic.during_snapshot, 10, "the leader published while the snapshot ran")
        self.assertGreater(last, traffic.position, "operations after the snapshot's position followed it")
        self.assertIn("keeps operations from", leader.server.resyncs[0][1])
        self.assertEqual(list(leader.server.refusals), [])
        expected = yield leader.reopened_contents()
        found = yield follower.reopened_contents()
        self.assertEqual(found.keys(), expected.keys())
        for key in expected:
            self.assertEqual(found[key], expected[key], key)
        self.assertEqual(len(found["delayed"]), 3)
        self.assertLess(max(traffic.gaps), 0.5, "no long reactor stall while the snapshot ran")

    @defer.inlineCallbacks
    def test_messages_acked_before_their_turn_are_skipped_not_resurrected(self):
        def ack_the_rest():  # the snapshot has read 10 messages of 2000
            snapshots.extend(link.snapshot for link in leader.server.followers)
            for handle in handles[1000:]:
                leader.store.ack(Q1, handle)
            leader.store.purge(Q1, handles[500:1000])
        snapshots = []
        leader = yield Leader().start(self, "filelog", history=(),
                                      wrap=lambda store: OnLoad(store, 10, ack_the_rest))
        topology(leader.store)
        handles = [leader.store.append(message(b"m%d" % i, n=i), [Q1]) for i in range(2000)]
        follower = yield Follower().start(self, "chunked")
        client = yield follower.connect(leader)
        (link,) = leader.server.followers
        yield wait_until(lambda: link.mode == "stream")
        yield wait_until(lambda: follower.applier.durable_sequence == leader.stream.last_sequence)
        self.assertEqual(client.resyncs, 1)
        (snapshot,) = snapshots
        self.assertEqual((snapshot.messages, snapshot.skipped), (500, 1500))
        expected = yield leader.reopened_contents()
        found = yield follower.reopened_contents()
        self.assertEqual(len(found[Q1]), 500)
        self.assertEqual(found, expected)

    @defer.inlineCallbacks
    def test_an_interrupted_snapshot_leaves_stores_that_resync_again(self):
        def drop_the_follower():
            for link in leader.server.followers:
                link.transport.abortConnection()
        leader = yield Leader().start(self, "sqlite", history=(),
                                      wrap=lambda store: OnLoad(store, 50, drop_the_follower))
        topology(leader.store)
        for i in range(100):
            leader.store.append(message(b"y" * 2000, n=i), [Q1])
        follower = yield Follower().start(self, "filelog")
        client = yield follower.connect(leader)
        yield client.when_lost()
        self.assertEqual(client.resyncs, 1)
        yield follower.stop()
        again = yield Follower().start(self, "filelog", follower.path)
        self.assertEqual(again.applier.role, replica.PARTIAL)
        client = yield again.connect(leader, resync=False)
        yield client.when_lost()
        self.assertIn("unfinished snapshot", client.reason)

    @defer.inlineCallbacks
    def test_a_memory_leaders_snapshot_matches_what_a_follower_from_the_start_holds(self):
        """The memory store reads bodies back by Deferred only: the snapshot waits for each."""
        leader = yield Leader().start(self, "memory", retain_bytes=MIB + MIB // 4)
        first = yield Follower().start(self, "sqlite")
        yield first.connect(leader, node="first")
        topology(leader.store)
        messages(leader.store, 0, 40)
        yield leader.server.confirmed_up_to(leader.stream.last_sequence)
        late = yield Follower().start(self, "chunked")
        client = yield late.connect(leader, node="late")
        self.assertGreater(leader.stream.first_retained, 1)
        for number in range(20):
            leader.store.append(message(b"while %d" % number, n=number), [Q1, Q2])
        last = leader.stream.last_sequence
        yield wait_until(lambda: late.applier.durable_sequence == last == first.applier.durable_sequence)
        self.assertEqual(client.resyncs, 1)
        self.assertEqual((yield late.reopened_contents()), (yield first.reopened_contents()))

    @defer.inlineCallbacks
    def test_a_snapshot_is_committed_every_few_megabytes_not_after_every_read(self):
        leader = yield Leader().start(self, "chunked", history=())
        topology(leader.store)
        for number in range(1200):  # about 2.4 MB of snapshot, some 40 reads of 64 KiB
            leader.store.append(message(b"z" * 2000, n=number), [Q1])
        yield leader.store.sync()
        follower = yield Follower().start(self, "filelog")
        before = follower.applier.commits
        client = yield follower.connect(leader)
        last = leader.stream.last_sequence
        yield wait_until(lambda: follower.applier.durable_sequence == last)
        self.assertEqual(client.resyncs, 1)
        self.assertLess(2000 * 1200, SNAPSHOT_COMMIT_BYTES)
        # The wipe's commit, and one once the snapshot has ended (one more may run as it ends).
        self.assertLessEqual(follower.applier.commits - before, 3)
        self.assertEqual(len((yield follower.reopened_contents())[Q1]), 1200)
