"""The paging contract over the filelog store, and what is particular to its files: opening reads no message,
the store keeps a few bytes a message, loads read runs of records ahead within the cache, compactions and
messages kept for several queues read back right; and a real broker killed with a backlog serves it paged."""

import math
import os
import tracemalloc

import pika
from twisted.internet import defer, reactor, task
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from backends.filelog import backend
from backends.filelog.queuefile import queue_file_name
from backends.filelog.reads import READ_AHEAD_BYTES
from brokerd.interfaces import IDelayedMessageStore, IPagingStore, MessageRecord, StoreCorrupted
from brokerd.testing import BrokerProcess
from tests.support.filelog_files import record_spans
from tests.support.paging_contract import PagingContract
from tests.support.store_contract import AUDIT, JOBS, message, queue_record


class FilelogPaging(PagingContract, unittest.TestCase):
    backend = backend
    no_cache_options = {"cache_size": "0"}
    file_reads_stat = "file_reads"
    damage_text = "CRC does not match"

    def damage_record(self, store, handle, number):
        """Invert the last body byte of message C{number}'s record (the C{number}th of the file of "jobs")."""
        path = os.path.join(store.directory, queue_file_name(("/", "jobs")))
        offset, size = record_spans(path)[number]
        with open(path, "r+b") as opened:
            opened.seek(offset + size - 5)
            byte = opened.read(1)
            opened.seek(offset + size - 5)
            opened.write(bytes([byte[0] ^ 0xFF]))

    @defer.inlineCallbacks
    def filled(self, count, size=100, queues=(JOBS,), **options):
        """A store whose queues (declared) hold C{count} committed messages of C{size} bytes: (store, handles)."""
        store = yield self.open_store(**options)
        for queue in queues:
            store.save_queue(queue_record(queue[1]))
        handles = [store.append(message(b"%06d" % number + b"." * (size - 6)), list(queues))
                   for number in range(count)]
        yield store.sync()
        return store, handles

    @defer.inlineCallbacks
    def reopened(self, store, **options):
        yield store.close()
        reopened = yield self.open_store(**options)
        return reopened

    def assert_bodies(self, store, handles, numbers):
        self.assertEqual([store.load(handle).body[:6] for handle in handles], [b"%06d" % n for n in numbers])

    @defer.inlineCallbacks
    def test_opening_reads_no_message_body(self):
        store, _ = yield self.filled(20_000, size=1024)
        yield store.close()
        tracemalloc.start()
        self.addCleanup(tracemalloc.stop)
        store = yield self.open_store()
        _, peak = tracemalloc.get_traced_memory()
        self.assertLess(peak, 2 << 20, "20 MB of bodies: opening must not read them")
        self.assertEqual((store.stats()["messages"], store.stats()["file_reads"]), (20_000, 0))
        self.assertEqual(len(store.recovered_handles(JOBS)), 20_000)

    @defer.inlineCallbacks
    def test_the_store_keeps_a_few_bytes_a_held_message(self):
        count = 25_000
        store, _ = yield self.filled(count, size=10)
        yield store.close()
        tracemalloc.start()
        self.addCleanup(tracemalloc.stop)
        before, _ = tracemalloc.get_traced_memory()
        store = yield self.open_store()
        handles = store.recovered_handles(JOBS)
        held, _ = tracemalloc.get_traced_memory()
        self.assertEqual(len(handles), count)
        self.assertLess((held - before) / count, 40, "bytes a held message costs, both threads together")

    @defer.inlineCallbacks
    def test_loads_in_queue_order_read_runs_of_records_ahead(self):
        store, handles = yield self.filled(3000)
        store = yield self.reopened(store)
        handles = store.recovered_handles(JOBS)
        self.assert_bodies(store, handles, range(3000))
        record_size = os.path.getsize(self.queue_path(store)) // 3000
        runs = math.ceil(3000 * record_size / READ_AHEAD_BYTES)
        self.assertEqual(store.stats()["file_reads"], 3000)
        self.assertLessEqual(store.stats()["file_read_calls"], runs + 1)
        store = yield self.reopened(store, cache_size="0")
        self.assert_bodies(store, store.recovered_handles(JOBS)[:100], range(100))
        self.assertEqual((store.stats()["file_read_calls"], store.stats()["cache_bytes"]), (100, 0),
                         "without a cache each load reads its own record")

    @defer.inlineCallbacks
    def test_what_is_read_ahead_stays_within_the_cache_size(self):
        queues = [("/", f"q{number}") for number in range(4)]
        store, _ = yield self.filled(2000, queues=queues)
        store = yield self.reopened(store, cache_size="40K")
        recovered = [store.recovered_handles(queue) for queue in queues]
        highest = 0
        for row in range(2000):
            for handles in recovered:
                self.assertEqual(store.load(handles[row]).body[:6], b"%06d" % row)
                highest = max(highest, store.stats()["cache_bytes"])
        self.assertLessEqual(highest, 40 << 10)
        record_size = os.path.getsize(self.queue_path(store, queues[0])) / 2000
        runs = 8000 * record_size / (5 << 10)  # each an eighth of the cache
        self.assertLess(store.stats()["file_read_calls"], runs * 1.1, "every queue's run is kept as it is read")

    @defer.inlineCallbacks
    def test_a_message_loads_as_appended_until_its_commit_is_taken_in(self):
        store = yield self.open_store(cache_size="0")
        store.save_queue(queue_record("jobs"))
        appended = message(b"in a batch")
        handle = store.append(appended, [JOBS])
        self.assertIs(store.load(handle), appended, "buffered")
        commits = store.stats()["commits"]
        synced = store.sync()
        yield task.deferLater(reactor, 0, lambda: None)  # runs after the commit took the batch
        self.assertEqual((store.stats()["commits"], synced.called), (commits + 1, False))
        self.assertIs(store.load(handle), appended, "handed to the writer, not written yet")
        yield synced
        loaded = store.load(handle)
        self.assertIsInstance(loaded, MessageRecord)
        self.assertEqual((loaded.body, loaded.properties.message_id), (b"in a batch", "in a batch"))
        self.assertEqual(store.stats()["file_reads"], 1)

    @defer.inlineCallbacks
    def test_loads_after_a_compaction_read_the_new_file(self):
        store, handles = yield self.filled(3000, compact_min_records="100")
        self.assert_bodies(store, handles[:10], range(10))  # a run of the old file is kept
        for handle in handles[:2000]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(store.stats()["compactions"], 1)
        self.assertEqual(len(record_spans(self.queue_path(store))), 1000)
        self.assert_bodies(store, handles[2000:], range(2000, 3000))
        store = yield self.reopened(store)
        self.assert_bodies(store, store.recovered_handles(JOBS), range(2000, 3000))

    @defer.inlineCallbacks
    def test_a_message_of_two_queues_loads_from_the_other_once_one_has_compacted_it_away(self):
        store, handles = yield self.filled(300, queues=(JOBS, AUDIT), compact_min_records="100")
        for handle in handles[:200]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(store.stats()["compactions"], 1)
        self.assertEqual(len(record_spans(self.queue_path(store))), 100)
        self.assert_bodies(store, handles, range(300))
        self.assertEqual(store.stats()["messages"], 400, "a copy in each file")

    @defer.inlineCallbacks
    def test_a_message_found_damaged_at_load_leaves_its_queue_unavailable_and_its_file_as_it_is(self):
        store, _ = yield self.filled(1000, queues=(JOBS, AUDIT))
        yield store.close()
        path = self.queue_path(store)
        offset, size = record_spans(path)[10]
        with open(path, "r+b") as opened:
            opened.seek(offset + size - 5)
            opened.write(b"!")
        contents = open(path, "rb").read()
        store = yield self.open_store()
        handles = store.recovered_handles(JOBS)
        self.assert_bodies(store, handles[:10], range(10))
        with self.assertRaises(StoreCorrupted) as raised:
            store.load(handles[10])
        self.assertEqual((raised.exception.path, raised.exception.offset), (path, offset))
        self.assertRaises(StoreCorrupted, store.recovered_handles, JOBS)
        self.assertRaises(StoreCorrupted, store.append, message(b"refused"), [JOBS])
        for handle in handles[:10]:
            store.ack(JOBS, handle)
        store.append(message(b"audited"), [AUDIT])
        yield store.sync()
        self.assertEqual(open(path, "rb").read(), contents)

    def queue_path(self, store, queue=JOBS):
        return os.path.join(store.directory, queue_file_name(queue))

    @defer.inlineCallbacks
    def test_the_store_provides_the_paging_and_delayed_interfaces(self):
        store = yield self.open_store()
        self.assertTrue(verifyObject(IPagingStore, store))
        self.assertTrue(verifyObject(IDelayedMessageStore, store))


def test_a_broker_killed_with_a_backlog_serves_it_paged_in_order_after_its_restart(tmp_path):
    count = 2500
    broker = BrokerProcess(["--backend=filelog:cache_size=256K", "--sync=none", "--data-dir", str(tmp_path / "data")],
                           cwd=tmp_path)
    try:
        with amqp(broker) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("backlog", durable=True)
            for number in range(count):
                channel.basic_publish("", "backlog", b"%06d" % number + b"." * 94,
                                      pika.BasicProperties(delivery_mode=2, message_id=str(number)))
        broker.restart(crash=True)
        with amqp(broker) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=500)
            got = []
            for method, properties, body in channel.consume("backlog", inactivity_timeout=10):
                assert method is not None, f"the consumer got {len(got)} of {count} messages"
                got.append((body[:6], properties.message_id, method.redelivered))
                if len(got) % 100 == 0:
                    channel.basic_ack(method.delivery_tag, multiple=True)
                if len(got) == count:
                    break
        assert got == [(b"%06d" % number, str(number), True) for number in range(count)]
        broker.restart()
        with amqp(broker) as connection:
            assert connection.channel().queue_declare("backlog", passive=True).method.message_count == 0
    finally:
        assert broker.stop() == 0, broker.tail()


def amqp(broker):
    host, port = broker.wait_address("AMQP")
    return pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=1, socket_timeout=10))
