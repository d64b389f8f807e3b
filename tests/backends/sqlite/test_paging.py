"""The paging contract over the sqlite store, and what is particular to its paging: opening reads no message,
the reactor side keeps a few bytes per held message, loads read a queue's rows ahead in runs within the
cache's bound, and messages of a batch being written load as they were appended."""

import gc
import os
import shutil
import sqlite3
import tempfile
import threading
import tracemalloc

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from backends.sqlite import backend
from backends.sqlite.reads import MOST_RUN_ROWS, ROW_OVERHEAD
from brokerd.interfaces import IPagingStore, MessageRecord
from tests.support.paging_contract import PagingContract
from tests.support.store_contract import JOBS, message, queue_record


class SqlitePaging(PagingContract, unittest.TestCase):
    backend = backend
    options = {}
    no_cache_options = {"cache_size": "0"}
    file_reads_stat = "message_reads"
    damage_text = "checksum"

    def damage_record(self, store, handle, number):
        """Invert the last body byte of message C{handle}'s row (its CRC is left as it was)."""
        connection = sqlite3.connect(store.path, isolation_level=None)
        try:
            (body,), = connection.execute("SELECT body FROM messages WHERE id = ?", (handle,)).fetchall()
            damaged = body[:-1] + bytes([body[-1] ^ 0xFF])
            connection.execute("UPDATE messages SET body = ? WHERE id = ?", (damaged, handle))
        finally:
            connection.close()


class SqlitePagingParticulars(unittest.TestCase):
    """Through the store alone: what open reads and keeps, and what loads read."""

    timeout = 120

    def setUp(self):
        self.data_dir = tempfile.mkdtemp(prefix="brokerd-sqlite-paging-test-")
        self.addCleanup(shutil.rmtree, self.data_dir, True)

    @defer.inlineCallbacks
    def opened(self, **options):
        store = backend.make_store(self.data_dir, reactor=reactor, **options)
        self.addCleanup(store.close)
        yield store.open()
        return store

    @defer.inlineCallbacks
    def filled(self, count, size, **options):
        """A closed store holding C{count} messages of C{size} bytes on "jobs"; their bodies."""
        store = yield self.opened(**options)
        store.save_queue(queue_record("jobs"))
        bodies = [b"%08d" % number + b"." * (size - 8) for number in range(count)]
        for number, body in enumerate(bodies):
            store.append(message(body), [JOBS])
            if number % 5000 == 4999:
                yield store.sync()
        yield store.close()
        return bodies

    @defer.inlineCallbacks
    def test_opening_reads_no_message_and_keeps_a_few_bytes_per_held_message(self):
        count = 20_000
        yield self.filled(count, 1024)
        gc.collect()
        tracemalloc.start()
        self.addCleanup(tracemalloc.stop)
        before = tracemalloc.take_snapshot()
        store = yield self.opened()
        handles = store.recovered_handles(JOBS)
        gc.collect()
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
        self.assertEqual(len(handles), count)
        self.assertEqual(store.stats()["messages"], count)
        self.assertEqual(store.stats()["bytes"], count * 1024)
        self.assertLess(grown, 40 * count, f"{grown} bytes allocated to open {count} messages of 1 KiB")
        self.assertEqual(store.stats()["message_reads"], 0)
        self.assertEqual(store.stats()["read_queries"], 0)

    @defer.inlineCallbacks
    def test_loads_in_queue_order_read_runs_and_the_cache_stays_within_its_size(self):
        count, size = 3000, 100
        bodies = yield self.filled(count, size)
        store = yield self.opened(cache_size="64K")
        self.assertTrue(IPagingStore.providedBy(store))
        loaded = [store.load(handle) for handle in store.recovered_handles(JOBS)]
        self.assertEqual([record.body for record in loaded], bodies)
        self.assertTrue(all(type(record) is MessageRecord for record in loaded))
        stats = store.stats()
        self.assertEqual(stats["message_reads"], count, "every row is read once")
        self.assertLessEqual(stats["cache_bytes"], 64 << 10)
        runs = stats["read_queries"]
        # A run is at most half what the cache holds: 32 KiB over (body, record and overhead) bytes a row.
        per_run = min(MOST_RUN_ROWS, (32 << 10) // (size + 150 + ROW_OVERHEAD))
        self.assertLessEqual(runs, 2 + count // (per_run // 2), f"{runs} queries for {count} loads in order")
        self.assertGreater(stats["cache_hits"], count - runs)

    @defer.inlineCallbacks
    def test_a_run_reaching_rows_read_before_counts_them_once(self):
        count = 3000
        bodies = yield self.filled(count, 100)
        store = yield self.opened(cache_size="64K")
        handles = store.recovered_handles(JOBS)
        self.assertEqual(store.load(handles[150]).body, bodies[150])  # a run from the middle, then from the start
        self.assertEqual([store.load(handle).body for handle in handles], bodies)
        stats = store.stats()
        self.assertLessEqual(stats["cache_bytes"], 64 << 10)
        self.assertLessEqual(stats["cache_misses"], 3, "runs in order went on hitting the cache")

    @defer.inlineCallbacks
    def test_without_a_cache_every_load_reads_its_row_alone(self):
        bodies = yield self.filled(50, 100)
        store = yield self.opened(cache_size="0")
        handles = store.recovered_handles(JOBS)
        self.assertEqual([store.load(handle).body for handle in reversed(handles)], bodies[::-1])
        self.assertEqual((store.stats()["message_reads"], store.stats()["cache_bytes"]), (50, 0))

    @defer.inlineCallbacks
    def test_messages_of_a_batch_being_written_load_as_appended_then_from_the_file(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        appended = [message(b"m%d" % number) for number in range(3)]
        handles = [store.append(each, [JOBS]) for each in appended]
        self.assertTrue(all(store.load(handle) is each for handle, each in zip(handles, appended)), "buffered")
        gate = threading.Event()
        self.addCleanup(gate.set)
        held_up = store._writer_thread.call(gate.wait, 30)  # the writer thread waits: the next commit cannot end
        committing = store.sync()
        yield task.deferLater(reactor, 0, lambda: None)  # the commit takes the batch, and waits for the writer
        self.assertEqual(store.stats()["commits"], 1)
        self.assertTrue(all(store.load(handle) is each for handle, each in zip(handles, appended)), "handed over")
        gate.set()
        yield held_up
        yield committing
        self.assertEqual([store.load(handle).body for handle in handles], [b"m0", b"m1", b"m2"])
        self.assertEqual(store.stats()["message_reads"], 3)
        self.assertRaises(KeyError, store.load, handles[-1] + 1)
        yield store.close()
        self.assertFalse(os.path.exists(store.path + "-wal"), "the reader's connection kept the log from going")

    @defer.inlineCallbacks
    def test_a_message_acked_by_every_queue_leaves_the_file_and_the_books(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        shared = store.append(message(b"shared"), [JOBS, ("/", "audit")])
        alone = store.append(message(b"alone"), [JOBS])
        yield store.sync()
        self.assertEqual((store.stats()["messages"], store.stats()["bytes"]), (2, 11))
        store.ack(JOBS, shared)
        store.ack(JOBS, alone)
        store.ack(JOBS, alone)  # twice: changes nothing more
        yield store.sync()
        self.assertEqual((store.stats()["messages"], store.stats()["bytes"]), (1, 6))
        self.assertEqual(store.load(shared).body, b"shared")
        self.assertRaises(KeyError, store.load, alone)
        store.ack(("/", "audit"), shared)
        yield store.sync()
        self.assertEqual((store.stats()["messages"], store.stats()["bytes"]), (0, 0))
        self.assertRaises(KeyError, store.load, shared)
