"""Deep and recovered durable queues over a paging store keep handles, not messages: what a client sees.

Written once, for every store that provides L{IPagingStore}: a real L{Broker}
over a real store in a temporary directory; the figures checked are the ones
users see (deliveries, message counts, the memory watermark) and what comes
back after a restart. Each backend's test module subclasses L{PagingContract}.
"""

import shutil
import tempfile

from twisted.internet import defer, reactor

from brokerd.errors import NotFound
from brokerd.model.policy_effects import Policy
from brokerd.model.paging import PAGE_OUT_DEPTH
from brokerd.storage.durability import SyncPolicy
from tests.support.broker import make_broker, open_channel, properties

SIZE = 100  # bytes of every body, so the watermark counts SIZE a message held in memory
DEEP = 5000  # messages in a deep queue: 2000 in memory and 3000 paged


def body(number):
    return (b"m%05d" % number).ljust(SIZE, b".")


def props(number, persistent=True):
    return properties(persistent, message_id=f"id-{number}", content_type="text/plain")


class PagingContract:
    """
    Mixed into a C{twisted.trial.unittest.TestCase}; the subclass provides:

    @ivar backend: the L{IStoreBackend} whose stores are tested.
    @ivar options: backend options for every store of the tests.
    @ivar no_cache_options: options that keep no written message in memory, so reads go to the files.
    @ivar file_reads_stat: the stats() key counting messages read back from the files.
    @ivar damage_text: words of the reason a queue is unavailable after L{damage_record}.
    """

    options = {}
    no_cache_options = {}
    file_reads_stat = None
    damage_text = None

    def setUp(self):
        self.data_dir = tempfile.mkdtemp(prefix="brokerd-paging-test-")
        self.addCleanup(shutil.rmtree, self.data_dir, True)

    @defer.inlineCallbacks
    def open_store(self, **options):
        store = self.backend.make_store(self.data_dir, SyncPolicy(), reactor=reactor, **{**self.options, **options})
        self.addCleanup(store.close)
        yield store.open()
        return store

    @defer.inlineCallbacks
    def started(self, **options):
        """A broker over a fresh store, with the durable queue "jobs" declared: (broker, clock, channel, peer)."""
        self.store = yield self.open_store(**options)
        broker, clock = make_broker(self.store)
        channel, peer = open_channel(broker)
        channel.queue_declare("jobs", durable=True)
        return broker, clock, channel, peer

    @defer.inlineCallbacks
    def restarted(self, **options):
        """Close the store, reopen it and recover a new broker from it: (broker, clock, counts)."""
        yield self.store.close()
        recovered = yield self.recovered(**options)
        return recovered

    @defer.inlineCallbacks
    def recovered(self, **options):
        """Open the (closed) store again and recover a new broker from it: (broker, clock, counts)."""
        self.store = yield self.open_store(**options)
        broker, clock = make_broker(self.store)
        counts = broker.recover()
        return broker, clock, counts

    @staticmethod
    def publish(channel, numbers, queue="jobs", persistent=True):
        for number in numbers:
            channel.basic_publish("", queue, props(number, persistent), body(number))

    @staticmethod
    def queue(broker, name="jobs"):
        return broker.vhost("/").queues[name]

    def get_all(self, channel, queue="jobs", no_ack=False):
        """basic.get until empty: (number, redelivered) of each message, checking body, properties and count."""
        got = []
        while True:
            expected_left = self.queue(channel.connection.broker, queue).message_count - 1
            result = channel.basic_get(queue, no_ack)
            if result is None:
                self.assertEqual(expected_left, -1, "basic.get answered empty with messages ready")
                return got
            _tag, redelivered, message, left = result
            number = int(message.body[1:6])
            self.assertEqual((message.body, message.properties.message_id, message.properties.content_type),
                             (body(number), f"id-{number}", "text/plain"))
            self.assertEqual(left, expected_left)
            got.append((number, redelivered))

    # -- deep queues

    @defer.inlineCallbacks
    def test_a_byte_limit_a_policy_sets_on_a_deep_queue_counts_its_paged_backlog(self):
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(DEEP))
        broker.vhost("/").set_policies([Policy("/", "bytes", "^jobs$", {"max-length-bytes": 1000 * SIZE})])
        self.assertEqual(self.queue(broker).message_count, 1000)
        self.assertEqual(broker.watermark.queued_bytes, 1000 * SIZE)
        self.assertEqual(self.get_all(channel, no_ack=True), [(number, False) for number in range(DEEP - 1000, DEEP)])

    @defer.inlineCallbacks
    def test_a_deep_queue_holds_page_out_depth_bodies_and_basic_get_gives_every_message_in_order(self):
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(DEEP))
        self.assertEqual(self.queue(broker).message_count, DEEP)
        self.assertEqual(broker.watermark.queued_bytes, PAGE_OUT_DEPTH * SIZE)
        self.assertEqual(self.get_all(channel), [(number, False) for number in range(DEEP)])
        self.assertEqual(broker.watermark.queued_bytes, DEEP * SIZE, "un-acked messages are held in memory")
        channel.basic_ack(0, multiple=True)
        self.assertEqual(broker.watermark.queued_bytes, 0)
        self.assertIsNone(channel.basic_get("jobs"))
        self.assertEqual(self.queue(broker).message_count, 0)
        broker, _, counts = yield self.restarted()
        self.assertEqual((counts["messages"], self.queue(broker).message_count), (0, 0))

    @defer.inlineCallbacks
    def test_paged_messages_are_read_back_from_the_files_and_from_what_is_not_written_yet(self):
        broker, _, channel, _ = yield self.started(**self.no_cache_options)
        self.publish(channel, range(3000))
        self.assertEqual(self.get_all(channel, no_ack=True)[-1000:], [(n, False) for n in range(2000, 3000)])
        self.publish(channel, range(3000, 6000))
        yield self.store.sync()
        yield self.store.sync()  # the commit after the one that wrote them lets go of the written batches
        self.assertEqual(self.get_all(channel, no_ack=True), [(n, False) for n in range(3000, 6000)])
        self.assertGreater(self.store.stats()[self.file_reads_stat], 0, "nothing was read from the files")
        self.assertEqual(broker.watermark.queued_bytes, 0)

    @defer.inlineCallbacks
    def test_a_consumer_gets_a_deep_queue_in_order_within_bounded_memory(self):
        broker, clock, channel, peer = yield self.started()
        self.publish(channel, range(DEEP))
        channel.basic_qos(50)
        channel.basic_consume("jobs", "c")
        clock.advance(0)
        highest = 0
        while len(peer.deliveries) < DEEP:
            before = len(peer.deliveries)
            highest = max(highest, broker.watermark.queued_bytes)
            channel.basic_ack(peer.deliveries[-1][1], multiple=True)
            self.assertGreater(len(peer.deliveries), before, "acking gave the consumer no more messages")
        channel.basic_ack(peer.deliveries[-1][1], multiple=True)
        self.assertLessEqual(highest, PAGE_OUT_DEPTH * SIZE)
        self.assertEqual([(message.body, message.properties.message_id, redelivered)
                          for _, _, redelivered, message in peer.deliveries],
                         [(body(n), f"id-{n}", False) for n in range(DEEP)])
        self.assertEqual((self.queue(broker).message_count, broker.watermark.queued_bytes), (0, 0))

    @defer.inlineCallbacks
    def test_queues_the_store_does_not_keep_never_page(self):
        broker, _, channel, _ = yield self.started()
        channel.queue_declare("scratch", durable=False)
        channel.queue_declare("mine", durable=True, exclusive=True)
        self.publish(channel, range(3000), queue="scratch")
        self.publish(channel, range(3000), queue="mine")
        self.assertEqual(broker.watermark.queued_bytes, 2 * 3000 * SIZE)
        self.assertEqual(self.get_all(channel, "mine", no_ack=True), [(n, False) for n in range(3000)])

    @defer.inlineCallbacks
    def test_transient_messages_among_paged_ones_keep_their_order(self):
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(PAGE_OUT_DEPTH))
        for number in range(PAGE_OUT_DEPTH, PAGE_OUT_DEPTH + 2000):
            self.publish(channel, [number], persistent=number % 3 == 0)
        transient = [n for n in range(PAGE_OUT_DEPTH, PAGE_OUT_DEPTH + 2000) if n % 3]
        self.assertEqual(self.queue(broker).message_count, PAGE_OUT_DEPTH + 2000)
        self.assertEqual(broker.watermark.queued_bytes, (PAGE_OUT_DEPTH + len(transient)) * SIZE,
                         "only the persistent messages past the depth are paged")
        self.assertEqual(self.get_all(channel), [(n, False) for n in range(PAGE_OUT_DEPTH + 2000)])
        broker, _, counts = yield self.restarted()
        self.assertEqual(counts["messages"], PAGE_OUT_DEPTH + 2000 - len(transient))
        self.assertEqual(self.get_all(open_channel(broker)[0]),
                         [(n, True) for n in range(PAGE_OUT_DEPTH + 2000) if n not in set(transient)])

    # -- restarts

    @defer.inlineCallbacks
    def test_a_restart_brings_a_deep_queue_back_as_handles_flagged_redelivered(self):
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(DEEP))
        for _ in range(10):
            channel.basic_ack(channel.basic_get("jobs")[0])
        broker, _, counts = yield self.restarted()
        self.assertEqual(counts["messages"], DEEP - 10)
        self.assertEqual((self.queue(broker).message_count, broker.watermark.queued_bytes), (DEEP - 10, 0))
        channel, _ = open_channel(broker)
        self.publish(channel, range(DEEP, DEEP + 5))
        self.assertEqual(broker.watermark.queued_bytes, 0, "new messages behind a deep backlog are paged too")
        self.assertEqual(self.get_all(channel),
                         [(n, True) for n in range(10, DEEP)] + [(n, False) for n in range(DEEP, DEEP + 5)])
        self.assertEqual(broker.watermark.queued_bytes, (DEEP - 5) * SIZE)
        channel.basic_ack(0, multiple=True)
        self.assertEqual(broker.watermark.queued_bytes, 0)
        broker, _, counts = yield self.restarted()
        self.assertEqual((counts["messages"], self.queue(broker).message_count), (0, 0))

    @defer.inlineCallbacks
    def test_queues_recovered_empty_take_and_give_new_messages(self):
        broker, clock, channel, _ = yield self.started()
        channel.queue_declare("idle", durable=True)  # never holds a message: the store keeps no index for it
        self.publish(channel, range(3))
        self.get_all(channel)
        channel.basic_ack(0, multiple=True)  # "jobs" had messages, all acked
        broker, clock, counts = yield self.restarted()
        self.assertEqual((counts["queues"], counts["messages"]), (2, 0))
        channel, peer = open_channel(broker)
        for name in ("jobs", "idle"):
            self.publish(channel, [7, 8], queue=name)
            self.assertEqual(self.get_all(channel, name, no_ack=True), [(7, False), (8, False)])
            channel.basic_consume(name, name, no_ack=True)
            clock.advance(0)
            self.publish(channel, [9], queue=name)
        self.assertEqual([(tag, message.body) for tag, _, _, message in peer.deliveries],
                         [("jobs", body(9)), ("idle", body(9))])

    # -- requeue

    @defer.inlineCallbacks
    def test_nacked_and_rejected_messages_go_back_before_the_paged_ones_in_their_order(self):
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(DEEP))
        tags = [channel.basic_get("jobs")[0] for _ in range(PAGE_OUT_DEPTH + 100)]  # 100 paged in
        self.assertEqual(self.queue(broker).message_count, DEEP - PAGE_OUT_DEPTH - 100)
        for index in (PAGE_OUT_DEPTH + 50, 3, PAGE_OUT_DEPTH + 99, 0):
            channel.basic_reject(tags[index], requeue=True)
        channel.basic_ack(tags[1])
        channel.basic_nack(tags[PAGE_OUT_DEPTH + 10], multiple=True, requeue=True)  # 2 .. PAGE_OUT_DEPTH + 10
        channel.basic_ack(0, multiple=True)  # the rest of the hundred
        self.assertEqual(self.queue(broker).message_count, DEEP - 88)
        acked = {1} | set(range(PAGE_OUT_DEPTH + 11, PAGE_OUT_DEPTH + 100)) - {PAGE_OUT_DEPTH + 50, PAGE_OUT_DEPTH + 99}
        returned = [n for n in range(PAGE_OUT_DEPTH + 100) if n not in acked]
        expected = [(n, True) for n in returned] + [(n, False) for n in range(PAGE_OUT_DEPTH + 100, DEEP)]
        self.assertEqual(self.get_all(channel), expected)
        self.assertEqual(broker.watermark.queued_bytes, len(expected) * SIZE)
        channel.connection.close_channel(channel.id)  # all of them back again
        self.assertEqual(self.queue(broker).message_count, len(expected))
        self.assertEqual(self.get_all(open_channel(broker)[0], no_ack=True), [(n, True) for n, _ in expected])
        self.assertEqual(broker.watermark.queued_bytes, 0)

    @defer.inlineCallbacks
    def test_closing_a_consumers_channel_puts_recovered_messages_back_ahead_of_their_run(self):
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(DEEP))
        broker, clock, _ = yield self.restarted()
        consuming, peer = open_channel(broker)
        consuming.basic_qos(30)
        consuming.basic_consume("jobs", "c")
        clock.advance(0)
        self.assertEqual(len(peer.deliveries), 30)
        consuming.basic_ack(peer.deliveries[4][1])
        consuming.basic_reject(peer.deliveries[7][1], requeue=True)  # goes to the consumer again at once
        self.assertEqual(self.queue(broker).message_count, DEEP - 31)
        consuming.connection.close_channel(consuming.id)
        self.assertEqual(self.queue(broker).message_count, DEEP - 1)
        self.assertEqual(self.get_all(open_channel(broker)[0]), [(n, True) for n in range(DEEP) if n != 4])

    # -- purge and delete

    @defer.inlineCallbacks
    def test_purging_paged_runs_drops_them_for_good(self):
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(DEEP))
        held = [channel.basic_get("jobs")[0] for _ in range(10)]
        self.assertEqual(channel.queue_purge("jobs"), DEEP - 10)
        self.assertEqual((self.queue(broker).message_count, broker.watermark.queued_bytes), (0, 10 * SIZE))
        self.assertIsNone(channel.basic_get("jobs"))
        channel.basic_ack(held[0])
        broker, _, counts = yield self.restarted()
        self.assertEqual(counts["messages"], 9, "only the un-acked messages outlive the purge")
        channel, _ = open_channel(broker)
        self.assertEqual(channel.basic_get("jobs")[2].body, body(1))  # and again from a recovered run
        self.assertEqual(channel.queue_purge("jobs"), 8)
        self.assertEqual((self.queue(broker).message_count, broker.watermark.queued_bytes), (0, SIZE))
        broker, _, counts = yield self.restarted()
        self.assertEqual(counts["messages"], 1)
        self.assertEqual(self.get_all(open_channel(broker)[0]), [(1, True)])

    @defer.inlineCallbacks
    def test_deleting_a_queue_of_paged_runs_drops_its_messages_for_good(self):
        broker, _, channel, _ = yield self.started()
        channel.queue_declare("other", durable=True)
        self.publish(channel, range(DEEP))
        self.publish(channel, range(3), queue="other")
        channel.basic_get("jobs")
        self.assertEqual(channel.queue_delete("jobs"), DEEP - 1)
        self.assertEqual(broker.watermark.queued_bytes, 4 * SIZE)
        channel.basic_ack(0, multiple=True)  # a late ack of the deleted queue's message is ignored
        self.assertEqual(broker.watermark.queued_bytes, 3 * SIZE)
        broker, _, counts = yield self.restarted()
        self.assertEqual((counts["queues"], counts["messages"]), (1, 3))
        self.assertNotIn("jobs", broker.vhost("/").queues)
        channel, _ = open_channel(broker)
        channel.queue_declare("jobs", durable=True)
        self.assertIsNone(channel.basic_get("jobs"))
        self.assertEqual(self.get_all(channel, "other"), [(n, True) for n in range(3)])
        broker, _, counts = yield self.restarted()  # and after a restart the recovered runs go as well
        self.assertEqual(counts["messages"], 3)
        channel, _ = open_channel(broker)
        self.assertEqual(channel.queue_delete("other"), 3)
        broker, _, counts = yield self.restarted()
        self.assertEqual((counts["queues"], counts["messages"]), (1, 0))

    # -- damage found at page-in

    @defer.inlineCallbacks
    def published(self):
        """Fill "jobs" with 3000 messages and "other" with 3, close the store, and find the handles of
        "jobs" by opening it once more: C{(closed store, handles)}, for the caller to damage before
        it calls C{self.recovered()}."""
        _, _, channel, _ = yield self.started()
        channel.queue_declare("other", durable=True)
        self.publish(channel, range(3000))
        self.publish(channel, range(3), queue="other")
        yield self.store.close()
        probe = yield self.open_store()
        handles = list(probe.recovered_handles(("/", "jobs")))
        self.assertEqual(len(handles), 3000)
        yield probe.close()
        return probe, handles

    def damage_record(self, store, handle, number):
        """Damage the stored record of message C{number} (handle C{handle}) of the closed C{store} so that
        reading it back fails its checksum."""
        raise NotImplementedError

    def assert_unavailable(self, broker, channel):
        """'jobs' refuses clients and takes no messages; 'other' serves on."""
        with self.assertRaises(NotFound) as caught:
            channel.basic_get("jobs")
        self.assertIn("unavailable", str(caught.exception))
        with self.assertRaises(NotFound):
            channel.basic_consume("jobs")
        count = self.queue(broker).message_count
        self.publish(channel, [3000])  # routed nowhere while the queue is down
        self.assertEqual(self.queue(broker).message_count, count)
        self.assertEqual(self.get_all(channel, "other"), [(n, True) for n in range(3)], "other queues serve on")
        self.publish(channel, [3], queue="other")
        self.assertEqual(self.get_all(channel, "other"), [(3, False)])

    @defer.inlineCallbacks
    def test_a_damaged_record_makes_its_queue_unavailable_when_it_is_reached(self):
        store, handles = yield self.published()
        self.damage_record(store, handles[2500], 2500)
        broker, _, counts = yield self.recovered()
        self.assertEqual((counts["messages"], counts["unavailable"]), (3003, 0), "damage is found at page-in")
        channel, _ = open_channel(broker)
        self.assertEqual([channel.basic_get("jobs", no_ack=True)[2].body for _ in range(2500)],
                         [body(n) for n in range(2500)])
        queued = broker.watermark.queued_bytes
        with self.assertRaises(NotFound):
            channel.basic_get("jobs")  # reaches the damaged record
        self.assertIn(self.damage_text, self.queue(broker).unavailable)
        self.assertEqual(self.queue(broker).message_count, 500, "the unreadable message must stay counted")
        self.assertEqual(broker.watermark.queued_bytes, queued)
        self.assert_unavailable(broker, channel)
        self.assertEqual(channel.queue_delete("jobs"), 500)
        channel.queue_declare("jobs", durable=True)
        self.publish(channel, [1])
        self.assertEqual(self.get_all(channel), [(1, False)])

    @defer.inlineCallbacks
    def test_basic_get_reaching_an_unreadable_message_says_the_queue_is_unavailable(self):
        store, handles = yield self.published()
        self.damage_record(store, handles[0], 0)
        broker, _, _ = yield self.recovered()
        channel, _ = open_channel(broker)
        with self.assertRaises(NotFound) as caught:
            channel.basic_get("jobs")  # not get-empty: 3000 messages are ready
        self.assertIn("unavailable", str(caught.exception))
