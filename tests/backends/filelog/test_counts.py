"""The filelog store's records of delivery counts: written beside the message
records they count, carried through compaction, cut off when torn."""

import os

from twisted.internet import defer
from twisted.trial import unittest

from tests.support.filelog_files import FilelogStores, record_spans
from tests.support.logs import LogWatcher
from tests.support.store_contract import JOBS


class FilelogDeliveryCountTests(FilelogStores, unittest.TestCase):
    options = {"compact_min_records": "10", "compact_valid_ratio": "0.5"}

    def counts_by_body(self, store):
        counts = store.delivery_counts(JOBS)
        return {record.body: counts[handle] for handle, record, _ in store.recover(JOBS) if handle in counts}

    @defer.inlineCallbacks
    def test_one_record_of_counts_per_commit_beside_the_messages(self):
        store, handles = yield self.filled(4)
        path = self.queue_path(store, JOBS)
        store.returned(JOBS, handles[1], 1)
        store.returned(JOBS, handles[2], 1)
        store.returned(JOBS, handles[1], 2)
        yield store.sync()
        self.assertEqual(len(record_spans(path)), 5, "four messages, then one record of counts")
        store = yield self.reopen(store)
        self.assertEqual(self.counts_by_body(store), {b"m01": 2, b"m02": 1})
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m00", b"m01", b"m02", b"m03"])

    @defer.inlineCallbacks
    def test_counts_move_with_their_records_when_the_file_is_compacted(self):
        store, handles = yield self.filled(20)
        store.returned(JOBS, handles[15], 3)
        store.returned(JOBS, handles[2], 1)
        yield store.sync()
        for handle in handles[:12]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(store.stats()["compactions"], 1)
        self.assertEqual(len(record_spans(self.queue_path(store, JOBS))), 9, "8 messages kept, one record of counts")
        store = yield self.reopen(store)
        self.assertEqual(self.counts_by_body(store), {b"m15": 3})
        recovered = {record.body: handle for handle, record, _ in store.recover(JOBS)}
        store.returned(JOBS, recovered[b"m19"], 1)
        store = yield self.reopen(store)
        self.assertEqual(self.counts_by_body(store), {b"m15": 3, b"m19": 1})

    @defer.inlineCallbacks
    def test_a_torn_record_of_counts_is_cut_off_and_the_earlier_counts_kept(self):
        store, handles = yield self.filled(3)
        store.returned(JOBS, handles[0], 1)
        yield store.sync()
        store.returned(JOBS, handles[0], 2)
        store.returned(JOBS, handles[1], 1)
        yield store.close()
        path = self.queue_path(store, JOBS)
        os.truncate(path, os.path.getsize(path) - 5)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual(self.counts_by_body(store), {b"m00": 1})
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m00", b"m01", b"m02"])
        self.assertEqual(len(logged.matching(path, "torn tail")), 1)
