"""The chunked store's acks: the ack log, the checkpoints that empty it and
delete index chunks below the mark, and the delivery counts carried with them."""

import os
import shutil
import struct
import zlib

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked.ackformat import ACK_LOG_MAGIC, decode_checkpoint
from tests.support.chunked_files import ChunkedStores, big, chunk_numbers, contents, index_chunk_numbers, index_dir
from tests.support.store_contract import AUDIT, JOBS, message


class ChunkedAckLogTests(ChunkedStores, unittest.TestCase):
    def checkpoint_of(self, store, queue=JOBS):
        path = os.path.join(index_dir(store, queue), "checkpoint")
        key, mark, acked, _ = decode_checkpoint(contents(path), path)
        self.assertEqual(key, queue)
        return mark, acked

    def ack_log_of(self, store, queue=JOBS):
        data = contents(os.path.join(index_dir(store, queue), "acks"))
        self.assertTrue(data.startswith(ACK_LOG_MAGIC))
        return data[len(ACK_LOG_MAGIC) :]

    @defer.inlineCallbacks
    def test_acks_go_to_the_ack_log_and_survive_a_crash_without_a_checkpoint(self):
        store, handles = yield self.store_with([message(b"m%02d" % n) for n in range(20)])
        for number in (0, 1, 2, 3, 4, 10):
            store.ack(JOBS, handles[number])
        yield store.sync()
        record = self.ack_log_of(store)
        self.assertEqual(len(record), 4 + 6 * 8 + 4, "one record for the commit: count, entries, CRC")
        self.assertEqual(struct.unpack_from(">I", record)[0], 6)
        self.assertEqual(self.checkpoint_of(store), (0, set()), "no checkpoint yet")
        crashed = yield self.reopen_after_crash(store)
        expected = [b"m%02d" % n for n in range(20) if n not in (0, 1, 2, 3, 4, 10)]
        self.assertEqual(self.bodies(crashed), expected)

    @defer.inlineCallbacks
    def test_close_checkpoints_the_mark_and_the_acks_above_it_and_empties_the_ack_log(self):
        store, handles = yield self.store_with([message(b"m%02d" % n) for n in range(20)])
        for number in (0, 1, 2, 3, 4, 10, 12):
            store.ack(JOBS, handles[number])
        yield store.close()
        self.assertEqual(self.checkpoint_of(store), (5, {10, 12}))
        self.assertEqual(self.ack_log_of(store), b"")
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m%02d" % n for n in range(20) if n not in (0, 1, 2, 3, 4, 10, 12)])

    @defer.inlineCallbacks
    def test_index_chunks_wholly_below_the_mark_are_deleted_when_it_passes_them(self):
        store, handles = yield self.store_with([message(b"m%03d" % n) for n in range(150)])
        self.assertEqual(index_chunk_numbers(store, JOBS), [0, 1, 2])
        for handle in handles[:60]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(index_chunk_numbers(store, JOBS), [0, 1, 2])
        self.assertEqual(self.checkpoint_of(store)[0], 0)
        for handle in handles[60:130]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(index_chunk_numbers(store, JOBS), [2], "the mark (130) passed index chunks 0 and 1")
        self.assertEqual((self.checkpoint_of(store), self.ack_log_of(store)), ((130, set()), b""))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m%03d" % n for n in range(130, 150)])
        for number in range(150, 200):
            store.append(message(b"m%03d" % number), [JOBS])
        store = yield self.reopen(store)
        self.assertEqual(index_chunk_numbers(store, JOBS), [2, 3])
        self.assertEqual(self.bodies(store), [b"m%03d" % n for n in range(130, 200)])


class ChunkedDeliveryCountTests(ChunkedStores, unittest.TestCase):
    """Delivery counts go to the ack log as records of their own and into the checkpoint."""

    @defer.inlineCallbacks
    def test_counts_survive_a_crash_through_the_ack_log_and_a_checkpoint_that_empties_it(self):
        store, handles = yield self.store_with([message(b"m%03d" % n) for n in range(150)])
        store.returned(JOBS, handles[70], 2)
        store.returned(JOBS, handles[140], 1)
        store.returned(JOBS, handles[3], 5)
        yield store.sync()
        crashed = yield self.reopen_after_crash(store)
        self.assertEqual(crashed.delivery_counts(JOBS), {handles[70]: 2, handles[140]: 1, handles[3]: 5})
        for handle in handles[:130]:
            if handle != handles[70]:
                crashed.ack(JOBS, handle)
        crashed.returned(JOBS, handles[140], 4)
        yield crashed.sync()
        path = os.path.join(index_dir(crashed, JOBS), "checkpoint")
        self.assertEqual(decode_checkpoint(contents(path), path)[1:], (70, set(range(71, 130)), {70: 2, 140: 4}),
                         "the mark passed an index chunk: the checkpoint holds the counts of entries not acked")
        crashed = yield self.reopen_after_crash(crashed)
        self.assertEqual(crashed.delivery_counts(JOBS), {handles[70]: 2, handles[140]: 4})

    @defer.inlineCallbacks
    def test_files_of_version_1_are_read_and_take_counts_afterwards(self):
        store, handles = yield self.store_with([message(b"m%d" % n) for n in range(6)])
        store.ack(JOBS, handles[0])
        yield store.close()
        directory = index_dir(store, JOBS)
        checkpoint = os.path.join(directory, "checkpoint")
        key = b"/\0jobs"
        body = b"brokerd chunked checkpoint 1\n" + struct.pack(">I", len(key)) + key + struct.pack(">QI", 1, 1)
        body += struct.pack("<Q", 3)
        with open(checkpoint, "wb") as old:
            old.write(body + struct.pack(">I", zlib.crc32(body)))
        acks = struct.pack(">I", 1) + struct.pack("<Q", 4)
        with open(os.path.join(directory, "acks"), "wb") as old:
            old.write(b"brokerd chunked acks 1\n" + acks + struct.pack(">I", zlib.crc32(acks)))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m1", b"m2", b"m5"])
        self.assertEqual(store.delivery_counts(JOBS), {})
        store.returned(JOBS, handles[2], 1)
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m1", b"m2", b"m5"])
        self.assertEqual(store.delivery_counts(JOBS), {handles[2]: 1})

    @defer.inlineCallbacks
    def test_a_torn_returns_record_is_cut_off_and_the_records_before_it_kept(self):
        store, handles = yield self.store_with([message(b"m%d" % n) for n in range(4)])
        store.returned(JOBS, handles[1], 1)
        store.ack(JOBS, handles[3])
        yield store.sync()
        store.returned(JOBS, handles[2], 7)
        yield store.sync()
        crashed_dir = self.fresh_data_dir()
        shutil.copytree(store.directory, os.path.join(crashed_dir, self.subdirectory))
        path = os.path.join(crashed_dir, self.subdirectory, os.path.relpath(index_dir(store, JOBS), store.directory),
                            "acks")
        os.truncate(path, os.path.getsize(path) - 3)
        crashed = yield self.open_store(crashed_dir)
        self.assertEqual(crashed.delivery_counts(JOBS), {handles[1]: 1})
        self.assertEqual(self.bodies(crashed), [b"m0", b"m1", b"m2"])


class ChunkedAckRunTests(ChunkedStores, unittest.TestCase):
    """
    A commit's acks that are a queue's oldest entries in order (a multiple
    ack) are taken as one run; they must leave the store as acking them one
    commit at a time does.
    """

    @defer.inlineCallbacks
    def acked_each_way(self, published, acked, queues=(JOBS,)):
        """Two stores of C{published}: one acks C{acked} (indexes) in one commit, one a commit per ack."""
        together, handles = yield self.store_with(published, queues)
        for number in acked:
            together.ack(JOBS, handles[number])
        yield together.sync()
        one_by_one, handles = yield self.store_with(published, queues)
        for number in acked:
            one_by_one.ack(JOBS, handles[number])
            yield one_by_one.sync()
        return together, one_by_one

    @defer.inlineCallbacks
    def assertSameStores(self, together, one_by_one, queue=JOBS):
        """The same held counts and chunks, and after a crash the same messages; the crashed C{together}."""
        held = ("messages", "bytes", "chunks")
        self.assertEqual({key: together.stats()[key] for key in held}, {key: one_by_one.stats()[key] for key in held})
        self.assertEqual(chunk_numbers(together), chunk_numbers(one_by_one))
        together = yield self.reopen_after_crash(together)
        one_by_one = yield self.reopen_after_crash(one_by_one)
        self.assertEqual(self.bodies(together, queue), self.bodies(one_by_one, queue))
        return together

    @defer.inlineCallbacks
    def test_a_run_across_chunks_deletes_the_chunks_it_empties_and_survives_a_crash(self):
        published = [big(number) for number in range(10)]  # three to a 4 KiB chunk
        together, one_by_one = yield self.acked_each_way(published, range(7))
        self.assertEqual(chunk_numbers(together), [2, 3], "chunks 0 and 1 held only acked messages")
        self.assertEqual(together.stats()["messages"], 3)
        crashed = yield self.assertSameStores(together, one_by_one)
        self.assertEqual(self.bodies(crashed), [big(number).body for number in range(7, 10)])

    @defer.inlineCallbacks
    def test_acks_after_an_out_of_order_one_and_acks_of_shared_messages_count_as_one_at_a_time(self):
        published = [big(number) for number in range(10)]
        together, one_by_one = yield self.acked_each_way(published, [5, 0, 1, 2, 3, 4, 6])
        crashed = yield self.assertSameStores(together, one_by_one)
        self.assertEqual(self.bodies(crashed), [big(number).body for number in range(7, 10)])
        together, one_by_one = yield self.acked_each_way(published, range(9), queues=(JOBS, AUDIT))
        self.assertEqual(chunk_numbers(together), [0, 1, 2, 3], "the audit queue still holds every message")
        crashed = yield self.assertSameStores(together, one_by_one, AUDIT)
        self.assertEqual(self.bodies(crashed, AUDIT), [message.body for message in published])
        self.assertEqual(self.bodies(crashed), [big(9).body])

    @defer.inlineCallbacks
    def test_delivery_counts_of_a_run_go_with_it(self):
        store, handles = yield self.store_with([message(b"m%d" % number) for number in range(6)])
        store.returned(JOBS, handles[1], 2)
        store.returned(JOBS, handles[4], 1)
        yield store.sync()
        for handle in handles[:3]:
            store.ack(JOBS, handle)
        yield store.sync()
        crashed = yield self.reopen_after_crash(store)
        self.assertEqual((self.bodies(crashed), crashed.delivery_counts(JOBS)),
                         ([b"m3", b"m4", b"m5"], {handles[4]: 1}))
