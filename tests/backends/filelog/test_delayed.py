"""The delayed-message contract for the filelog backend, plus what is particular
to it: the delayed log's format and valid flags, compaction, torn and damaged
files."""

import os
import struct

from twisted.internet import defer
from twisted.trial import unittest

from backends.filelog.delayedlog import DELAYED_MAGIC, decode_delayed
from backends.filelog.records import FLAG_OFFSET, record_problem
from tests.support.chunked_files import contents, flip
from tests.support.delayed_store_contract import (
    DELAYS,
    FOREVER,
    NOW,
    STAGING,
    DelayedStoreContract,
    assert_delayed_damage_leaves_queues_working,
    bodies,
    delayed,
)
from tests.support.filelog_files import FilelogStores
from tests.support.logs import LogWatcher
from tests.support.store_contract import JOBS, message, queue_record

LENGTH = struct.Struct(">I")


class FilelogDelayedStoreTests(FilelogStores, DelayedStoreContract, unittest.TestCase):
    pass


class FilelogSmallBucketsDelayedStoreTests(FilelogStores, DelayedStoreContract, unittest.TestCase):
    """The contract again with one-second index buckets and compaction from ten records on."""

    options = {"delayed_bucket_ms": "1000", "compact_min_records": "10"}


def log_path(store):
    return os.path.join(store.directory, "delayed.dlog")


def delayed_records(store):
    """(offset, valid, (due, handle, exchange, MessageRecord)) of every record of the delayed log."""
    data = contents(log_path(store))
    assert data.startswith(DELAYED_MAGIC)
    found, offset = [], len(DELAYED_MAGIC)
    while offset < len(data):
        assert record_problem(data, offset) is None, (offset, record_problem(data, offset))
        (length,) = LENGTH.unpack_from(data, offset)
        payload = data[offset + 4 : offset + 4 + length]
        found.append((offset, data[offset + FLAG_OFFSET], decode_delayed(payload)))
        offset += length + 8
    return found


class FilelogDelayedLogTests(FilelogStores, unittest.TestCase):
    options = {"compact_min_records": "10"}

    @defer.inlineCallbacks
    def store_of_ten(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"queued"), [JOBS])
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + 9 - n) for n in range(10)]
        yield store.sync()
        return store, handles

    @defer.inlineCallbacks
    def test_the_log_keeps_records_in_handle_order_and_a_release_flips_a_flag_in_place(self):
        store, handles = yield self.store_of_ten()
        store.delay(delayed(b"other"), STAGING, NOW)
        yield store.sync()
        records = delayed_records(store)
        self.assertEqual([(valid, due, handle) for _, valid, (due, handle, _, _) in records],
                         [(1, NOW + 9 - n, handles[n]) for n in range(10)] + [(1, NOW, handles[-1] + 1)])
        self.assertEqual(records[-1][2][2], STAGING)
        self.assertEqual(records[0][2][3].body, b"m0")
        size = os.path.getsize(log_path(store))
        store.release(handles[3])
        yield store.sync()
        self.assertEqual(os.path.getsize(log_path(store)), size)
        self.assertEqual([valid for _, valid, _ in delayed_records(store)], [1, 1, 1, 0] + [1] * 7)

    @defer.inlineCallbacks
    def test_a_mostly_released_log_is_compacted(self):
        store, handles = yield self.store_of_ten()
        size = os.path.getsize(log_path(store))
        for handle in handles[:6]:
            store.release(handle)
        yield store.sync()
        self.assertEqual(store.stats()["compactions"], 1)
        self.assertLess(os.path.getsize(log_path(store)), size // 2)
        self.assertEqual([record[2][1] for record in delayed_records(store)], handles[6:])
        store.release(handles[7])  # found at its new offset
        yield store.sync()
        self.assertEqual([valid for _, valid, _ in delayed_records(store)], [1, 0, 1, 1])
        expected = [b"m9", b"m8", b"m6"]
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 10))), expected)
        store = yield self.reopen(store)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 10))), expected)
        self.assertGreater(store.delay(delayed(b"new"), DELAYS, NOW), handles[-1])

    @defer.inlineCallbacks
    def test_a_torn_last_record_is_cut_off_and_logged(self):
        store, handles = yield self.store_of_ten()
        yield store.close()
        path = log_path(store)
        last = delayed_records(store)[-1][0]
        os.truncate(path, os.path.getsize(path) - 7)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual(len(logged.matching(path, "torn tail", "offset %d" % last)), 1)
        self.assertEqual(os.path.getsize(path), last)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 10))), [b"m%d" % n for n in range(8, -1, -1)])
        store.delay(delayed(b"after"), DELAYS, NOW + 100)
        store = yield self.reopen(store)
        self.assertEqual(len(delayed_records(store)), 10)
        self.assertEqual(store.stats()["delayed"], 10)

    @defer.inlineCallbacks
    def assert_delayed_unavailable(self, store, path):
        before = contents(path)
        store = yield self.reopen(store)
        yield assert_delayed_damage_leaves_queues_working(self, store, path, before)

    @defer.inlineCallbacks
    def test_a_damaged_record_followed_by_sound_ones_is_reported(self):
        store, _ = yield self.store_of_ten()
        yield store.close()
        flip(log_path(store), delayed_records(store)[4][0] + 30)
        yield self.assert_delayed_unavailable(store, log_path(store))

    @defer.inlineCallbacks
    def test_a_damaged_meta_file_is_reported(self):
        store, _ = yield self.store_of_ten()
        yield store.close()
        path = os.path.join(store.directory, "delayed.meta")
        flip(path, 3)
        yield self.assert_delayed_unavailable(store, path)
