"""Torn and damaged files of the chunked store: what recovery cuts off (and
logs), what it refuses (StoreCorrupted naming the file), and what is left."""

import os
import shutil
import struct

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked.format import HEADER_SIZE, position_of
from brokerd.interfaces import StoreCorrupted
from tests.support.chunked_files import (
    ENTRIES,
    FILE_SIZE,
    ChunkedStores,
    big,
    chunk_numbers,
    chunk_path,
    contents,
    flip,
    index_chunk_path,
    index_dir,
    overwrite,
    record_bytes,
    sized,
)
from tests.support.logs import LogWatcher
from tests.support.store_contract import AUDIT, JOBS, message, queue_record

THREE = [sized("m%d" % n, 100) for n in range(3)]
SIZE = record_bytes(THREE[0])  # of each of their records


class ChunkedTornTailTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def closed_with_three(self, acked=()):
        store, handles = yield self.store_with(THREE)
        for number in acked:
            store.ack(JOBS, handles[number])
        yield store.close()
        return store, handles

    @defer.inlineCallbacks
    def assert_last_record_cut(self, damage, problem):
        """
        Damage m2's record with C{damage(path, offset)} in the files a crash
        left (no fsync covers the records in the chunk's progress block, so
        they are unproven: a clean stop records its last fsync there, and
        damage found after one is found when the record is read): open cuts
        it off, and its index entry, and says so.
        """
        store, handles = yield self.store_with(THREE)
        crashed = self.fresh_data_dir()
        shutil.copytree(store.directory, os.path.join(crashed, self.subdirectory))
        path = os.path.join(crashed, self.subdirectory, os.path.basename(chunk_path(store, 0)))
        torn = position_of(handles[2])
        damage(path, HEADER_SIZE + torn)
        logged = LogWatcher(self)
        store = yield self.open_store(crashed)
        self.assertEqual(self.bodies(store), [b"m0".ljust(100, b"."), b"m1".ljust(100, b".")])
        self.assertEqual(len(logged.matching(path, "data offset %d is torn (%s)" % (torn, problem))), 1)
        self.assertEqual(len(logged.matching("('/', 'jobs')", "1 index entries from entry 2", "dropped")), 1)
        self.assertEqual(os.path.getsize(path), FILE_SIZE)
        self.assertFalse(any(contents(path)[HEADER_SIZE + torn :]), "the cut-off bytes read as zeros")
        self.assertFalse(any(contents(index_chunk_path(store, JOBS, 0))[HEADER_SIZE + 2 * 16 :]))
        self.assertEqual(store.stats()["write_position"], torn)
        handle = store.append(message(b"m3"), [JOBS])
        self.assertEqual(position_of(handle), torn, "the next record goes where the torn one was")
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store)[2:], [b"m3"])
        self.assertEqual(len(logged.matching("torn")), 1, "the second open found nothing torn")

    def test_a_last_record_cut_short_is_cut_off_and_logged(self):
        return self.assert_last_record_cut(lambda path, offset: os.truncate(path, offset + SIZE // 2),
                                           "a length of %d that does not fit" % (SIZE - 12))

    def test_a_last_record_with_a_wrong_crc_is_cut_off_and_logged(self):
        return self.assert_last_record_cut(lambda path, offset: flip(path, offset + SIZE - 8), "CRC mismatch")

    def test_a_last_record_with_a_damaged_body_is_cut_off_and_logged(self):
        return self.assert_last_record_cut(lambda path, offset: flip(path, offset + 60), "CRC mismatch")

    def test_a_last_record_whose_trailing_length_is_missing_is_cut_off_and_logged(self):
        return self.assert_last_record_cut(lambda path, offset: overwrite(path, offset + SIZE - 4, bytes(4)),
                                           "lengths before and after it differ")

    def test_a_last_record_whose_leading_length_is_missing_is_cut_off_and_logged(self):
        return self.assert_last_record_cut(lambda path, offset: overwrite(path, offset, bytes(4)), "zero-filled")

    @defer.inlineCallbacks
    def test_garbage_after_the_last_record_is_cut_off_and_logged(self):
        crafted = struct.pack(">IBI", 9, 1, 2) + b"hhbo" + struct.pack(">II", 0, 9)  # well framed, wrong CRC
        for garbage in (b"garbage that is no record", crafted, bytes(10) + b"late garbage", b"\xff"):
            store, handles = yield self.closed_with_three()
            path, end = chunk_path(store, 0), 3 * SIZE
            overwrite(path, HEADER_SIZE + end, garbage)
            logged = LogWatcher(self)
            store = yield self.reopen(store)
            self.assertEqual(self.bodies(store), [m.body for m in THREE])
            self.assertEqual(len(logged.matching(path, "data offset %d is torn" % end)), 1)
            self.assertEqual(logged.matching("index entries"), [])
            self.assertFalse(any(contents(path)[HEADER_SIZE + end :]))
            handle = store.append(message(b"m3"), [JOBS])
            self.assertEqual(position_of(handle), end)
            store = yield self.reopen(store)
            self.assertEqual(self.bodies(store)[3:], [b"m3"])

    @defer.inlineCallbacks
    def test_an_ack_of_a_cut_off_record_does_not_ack_the_message_written_in_its_place(self):
        # The ack log reached the disk, the record it acks did not (possible with --sync none).
        store, handles = yield self.closed_with_three(acked=(2,))
        os.truncate(chunk_path(store, 0), HEADER_SIZE + position_of(handles[2]) + 10)
        store = yield self.reopen(store)
        self.assertEqual(len(self.bodies(store)), 2)
        store.append(message(b"m3"), [JOBS])
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store)[2:], [b"m3"])
        self.assertEqual(store.stats()["messages"], 3)


    @defer.inlineCallbacks
    def test_a_last_message_chunk_a_crash_left_all_zeros_holds_nothing(self):
        # Created (full size, sparse) by a roll whose header and records never reached the disk:
        # nothing in it was ever synced, so there is nothing to lose, and nothing damaged.
        store, handles = yield self.store_with([big(n) for n in range(4)])
        yield store.close()
        overwrite(chunk_path(store, 1), 0, bytes(FILE_SIZE))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [big(n).body for n in range(3)])
        handle = store.append(message(b"next"), [JOBS])
        self.assertEqual(position_of(handle), position_of(handles[3]))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store)[3:], [b"next"])

    @defer.inlineCallbacks
    def test_a_last_index_chunk_a_crash_left_all_zeros_holds_no_entry(self):
        store, handles = yield self.store_with([message(b"m%02d" % n) for n in range(ENTRIES + 3)])
        yield store.close()
        path = index_chunk_path(store, JOBS, 1)
        overwrite(path, 0, bytes(os.path.getsize(path)))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m%02d" % n for n in range(ENTRIES)])
        store.append(message(b"next"), [JOBS])
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store)[ENTRIES:], [b"next"])


class ChunkedDamageTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_damaged_entry_in_the_middle_of_an_index_makes_only_its_queue_unavailable(self):
        store, _ = yield self.store_with([message(b"m%d" % n) for n in range(3)], queues=(JOBS, AUDIT))
        yield store.close()
        path, offset = index_chunk_path(store, JOBS, 0), HEADER_SIZE + 16
        flip(path, offset + 3)
        damaged = contents(path)
        store = yield self.reopen(store)
        with self.assertRaises(StoreCorrupted) as raised:
            store.recover(JOBS)
        self.assertEqual((raised.exception.path, raised.exception.offset), (path, offset))
        self.assertIn(path, str(raised.exception))
        self.assertIn("offset %d" % offset, str(raised.exception))
        self.assertEqual(self.bodies(store, AUDIT), [b"m0", b"m1", b"m2"])
        self.assertRaises(StoreCorrupted, store.append, message(b"refused"), [AUDIT, JOBS])
        store.append(message(b"m3"), [AUDIT])
        store = yield self.reopen(store)
        self.assertEqual(contents(path), damaged, "a damaged index is left as it was")
        self.assertRaises(StoreCorrupted, store.recover, JOBS)
        self.assertEqual(self.bodies(store, AUDIT), [b"m0", b"m1", b"m2", b"m3"])

    @defer.inlineCallbacks
    def test_the_message_chunks_a_damaged_queue_points_into_are_kept(self):
        store, _ = yield self.store_with([big(n) for n in range(7)])
        yield store.close()
        flip(index_chunk_path(store, JOBS, 0), HEADER_SIZE + 16 + 3)
        store = yield self.reopen(store)
        self.assertRaises(StoreCorrupted, store.recover, JOBS)
        self.assertEqual(chunk_numbers(store), [0, 1, 2], "the messages of a damaged queue are kept for repair")

    @defer.inlineCallbacks
    def test_a_torn_entry_at_the_end_of_an_index_is_cut_off_and_logged(self):
        store, _ = yield self.store_with([message(b"m%d" % n) for n in range(3)])
        yield store.close()
        path, offset = index_chunk_path(store, JOBS, 0), HEADER_SIZE + 2 * 16
        flip(path, offset + 12)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m0", b"m1"])
        self.assertEqual(len(logged.matching(path, "torn entry at offset %d" % offset)), 1)
        store.append(message(b"m3"), [JOBS])
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m0", b"m1", b"m3"])

    @defer.inlineCallbacks
    def test_a_damaged_chunk_header_stops_the_store_from_opening(self):
        def another_chunks_header(path):
            overwrite(path, 0, contents(chunk_path(store, 0))[:HEADER_SIZE])

        for number, damage, says in [
            (0, lambda path: flip(path, 0), "does not start with the chunk magic"),
            (0, lambda path: flip(path, 30), "damaged header (CRC mismatch)"),
            (1, lambda path: flip(path, 20), "damaged header (CRC mismatch)"),
            (1, another_chunks_header, "has the header of another chunk"),
        ]:
            store, _ = yield self.store_with([big(n) for n in range(4)])
            yield store.close()
            path = chunk_path(store, number)
            damage(path)
            again = self.make_store(self.data_dir_of(store))
            failure = yield self.assertFailure(again.open(), StoreCorrupted)
            self.assertEqual(failure.path, path)
            self.assertIn(path, str(failure))
            self.assertIn(says, str(failure))
            yield again.close()
            self.assertEqual(chunk_numbers(store), [0, 1], "nothing is deleted")

    @defer.inlineCallbacks
    def test_a_damaged_record_in_a_finished_chunk_fails_its_reads_naming_the_chunk(self):
        store, handles = yield self.store_with([big(n) for n in range(4)])
        yield store.close()
        path, offset = chunk_path(store, 0), HEADER_SIZE + position_of(handles[1])
        flip(path, offset + 500)
        store = yield self.reopen(store)
        self.assertEqual(list(store.recovered_handles(JOBS)), handles, "open reads no record of a finished chunk")
        with self.assertRaises(StoreCorrupted) as raised:
            store.load(handles[1])
        self.assertEqual((raised.exception.path, raised.exception.offset), (path, offset))
        self.assertIn(path, str(raised.exception))
        yield self.assertFailure(store.read(handles[1]), StoreCorrupted)
        self.assertEqual([store.load(handles[n]).body for n in (0, 2, 3)], [big(n).body for n in (0, 2, 3)])

    @defer.inlineCallbacks
    def test_a_queue_index_without_its_checkpoint_makes_the_queue_unavailable(self):
        store, _ = yield self.store_with([message(b"m0")], queues=(JOBS, AUDIT))
        yield store.close()
        checkpoint = os.path.join(index_dir(store, JOBS), "checkpoint")
        os.unlink(checkpoint)
        store = yield self.reopen(store)
        with self.assertRaises(StoreCorrupted) as raised:
            store.recover(JOBS)
        self.assertEqual(raised.exception.path, checkpoint)
        self.assertIn("no checkpoint", str(raised.exception))
        self.assertEqual(self.bodies(store, AUDIT), [b"m0"])

    @defer.inlineCallbacks
    def test_a_queue_index_whose_creation_a_crash_cut_short_is_an_empty_queue(self):
        store, _ = yield self.store_with([message(b"m0")], queues=(JOBS,))
        store.save_queue(queue_record("audit"))
        yield store.close()
        directory = index_dir(store, AUDIT)
        for leftovers in ({}, {"checkpoint.tmp": b"a checkpoint not yet renamed into place"}):
            os.makedirs(directory)
            for name, data in leftovers.items():
                with open(os.path.join(directory, name), "wb") as leftover:
                    leftover.write(data)
            logged = LogWatcher(self)
            store = yield self.reopen(store)
            self.assertEqual(self.bodies(store, AUDIT), [])
            self.assertEqual(len(logged.matching(directory, "cut short")), 1)
            store.append(message(b"a0"), [AUDIT])
            store = yield self.reopen(store)
            self.assertEqual((self.bodies(store, AUDIT), self.bodies(store, JOBS)), ([b"a0"], [b"m0"]))
            store.delete_queue(AUDIT)
            store.save_queue(queue_record("audit"))
            yield store.close()

    @defer.inlineCallbacks
    def test_a_queue_index_the_topology_does_not_hold_is_removed_at_open_and_never_revived(self):
        store, _ = yield self.store_with([message(b"old")], queues=(JOBS, AUDIT))
        yield store.close()
        orphan = os.path.join(self.fresh_data_dir(), "audit index")
        shutil.copytree(index_dir(store, AUDIT), orphan)
        store = yield self.reopen(store)
        store.delete_queue(AUDIT)
        yield store.close()
        shutil.copytree(orphan, index_dir(store, AUDIT))  # as if a crash came between topology and removal
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertFalse(os.path.exists(index_dir(store, AUDIT)))
        self.assertEqual(len(logged.matching(index_dir(store, AUDIT), "belongs to no queue of the topology")), 1)
        self.assertEqual(store.stats()["messages"], 1)
        store.save_queue(queue_record("audit"))
        store = yield self.reopen(store)
        self.assertEqual((self.bodies(store), self.bodies(store, AUDIT)), ([b"old"], []))
