"""A leader's store operations streamed to a follower on every other backend: after both stores are
closed and reopened, the follower holds what the leader holds; a follower restarted mid-stream
resumes after its last durable operation and duplicates nothing."""

from twisted.internet import defer, reactor
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from brokerd.interfaces import IDelayedMessageStore, IMessageStore, IPagingStore, ITimedCommits
from brokerd.proto import messages_pb2
from brokerd.replication import codec
from tests.support.broker import wait_until
from tests.support.replication import BACKENDS, Follower, Leader, contents, messages, topology


class StreamedStoresMatch(unittest.TestCase):

    @defer.inlineCallbacks
    def check_streamed(self, leader_backend, follower_backend):
        leader = yield Leader().start(self, leader_backend)
        for interface in (IMessageStore, IPagingStore, IDelayedMessageStore, ITimedCommits):
            verifyObject(interface, leader.store)
        follower = yield Follower().start(self, follower_backend)
        yield follower.connect(leader)
        topology(leader.store)
        messages(leader.store, 0, 60)
        yield leader.store.sync()
        last = leader.stream.last_sequence
        yield leader.server.confirmed_up_to(last)
        self.assertEqual(follower.applier.durable_sequence, last)
        self.assertEqual(leader.store.unreplicated, 0)
        self.assertEqual(follower.client.acks_sent, follower.applier.commits)
        self.assertLess(follower.applier.commits, last, "commits are grouped, not one per operation")
        expected = yield leader.reopened_contents()
        found = yield follower.reopened_contents()
        self.assertEqual(found.keys(), expected.keys())
        for key in expected:
            self.assertEqual(found[key], expected[key], key)
        self.assertTrue(any(len(item[3]) == 1024 * 1024 for item in found[("/", "orders")]))
        self.assertTrue(any(item[5] for item in found[("/", "orders")]), "delivery counts are kept")
        self.assertEqual(len(found["delayed"]), 3)

    @defer.inlineCallbacks
    def test_a_follower_restarted_mid_stream_resumes_without_duplicates(self):
        leader = yield Leader().start(self, "sqlite")
        follower = yield Follower().start(self, "chunked")
        yield follower.connect(leader)
        topology(leader.store)
        messages(leader.store, 0, 30)
        first = leader.stream.last_sequence
        yield leader.server.confirmed_up_to(first)
        path = follower.path
        yield follower.stop()
        messages(leader.store, 30, 30)  # made while the follower is away
        restarted = yield Follower().start(self, "chunked", path)
        self.assertEqual(restarted.applier.durable_sequence, first)
        self.assertEqual(restarted.applier.cluster_id, "c1")
        yield restarted.connect(leader)
        messages(leader.store, 60, 30)
        last = leader.stream.last_sequence
        yield wait_until(lambda: restarted.applier.durable_sequence == last, timeout=30)
        expected = yield leader.reopened_contents()
        found = yield restarted.reopened_contents()
        self.assertEqual(found, expected)

    @defer.inlineCallbacks
    def test_replaying_operations_a_store_already_holds_duplicates_nothing(self):
        """As after a crash that kept a commit's data but not its state record."""
        leader = yield Leader().start(self, "filelog")
        follower = yield Follower().start(self, "sqlite")
        yield follower.connect(leader)
        topology(leader.store)
        messages(leader.store, 0, 20)
        last = leader.stream.last_sequence
        yield leader.server.confirmed_up_to(last)
        yield follower.stop()
        restarted = yield Follower().start(self, "sqlite", follower.path)
        again = restarted.applier
        self.assertEqual(again.durable_sequence, last)
        # Forget the state record: replay the whole stream onto the store that holds it all.
        again.applied_sequence = again.durable_sequence = 0
        sequence, runs = 1, 0
        while sequence <= last:
            data, sequence = leader.stream.frames_from(sequence, 1 << 30)
            for _, payload in codec.FrameDecoder(codec.DEFAULT_FRAME_LIMIT).feed(data):
                decoded = codec.decode_operation(payload)
                runs += decoded[1] == codec.APPEND_RUN
                again.apply(*decoded)
        self.assertTrue(runs, "appends alike replayed as runs")
        again.commit()
        yield wait_until(lambda: again.durable_sequence == last)
        expected = yield leader.reopened_contents()
        found = yield restarted.reopened_contents()
        self.assertEqual(found, expected)


class CommitDrivenStream(unittest.TestCase):
    """A leader whose store says when its commits start streams what each will cover then."""

    @defer.inlineCallbacks
    def test_each_commit_reaches_the_follower_and_what_no_sync_asks_for_follows_soon(self):
        leader = yield Leader().start(self, "chunked", tap_reactor=reactor)
        follower = yield Follower().start(self, "filelog")
        yield follower.connect(leader)
        topology(leader.store)
        messages(leader.store, 0, 40)
        yield leader.store.sync()
        yield leader.server.confirmed_up_to(leader.stream.last_sequence)
        self.assertEqual(follower.applier.durable_sequence, leader.stream.last_sequence)
        leader.store.save_exchange(messages_pb2.ExchangeRecord(vhost="/", name="late", durable=True))
        last = leader.stream.last_sequence
        yield wait_until(lambda: follower.applier.durable_sequence == last, timeout=10)
        expected = yield leader.reopened_contents()
        self.assertEqual((yield follower.reopened_contents()), expected)


for _leader in BACKENDS:
    for _follower in BACKENDS:
        def _test(self, leader_backend=_leader, follower_backend=_follower):
            return self.check_streamed(leader_backend, follower_backend)
        _test.__name__ = f"test_{_leader}_leader_to_{_follower}_follower"
        setattr(StreamedStoresMatch, _test.__name__, _test)
