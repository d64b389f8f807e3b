"""chunked: the chunk being written records, in its footer block, how far an fsync made it durable, so that opening
walks only the records written after that (a million small messages no longer cost a walk of every record at each
start), and a damaged record in the durable part is found when it is read, not taken for a torn tail that cuts off
every record after it."""

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked.format import FOOTER_SIZE, HEADER_SIZE, RECORD_TAIL, decode_progress, record_size
from backends.common.message_heads import encode_head
from brokerd.interfaces import StoreCorrupted
from tests.support.chunked_files import ChunkedStores, chunk_path, contents, flip, overwrite
from tests.support.store_contract import JOBS, message, queue_record

DATA = 1 << 20  # bytes of records per chunk here: every message of a test goes to chunk 0


def numbered(number):
    return message(b"m%04d" % number + b"." * 95)


class ChunkProgressTests(ChunkedStores, unittest.TestCase):
    options = {"chunk_size": str(DATA), "index_chunk_entries": "4096"}

    @defer.inlineCallbacks
    def written_in_three_commits(self):
        """A store (left open: what a crash leaves) with 300 messages synced, then 100, then 50; their handles."""
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        handles = []
        for count in (300, 100, 50):
            handles += [store.append(numbered(len(handles) + n), [JOBS]) for n in range(count)]
            yield store.sync()
        return store, handles

    def progress(self, store):
        return decode_progress(contents(chunk_path(store, 0))[HEADER_SIZE + DATA : HEADER_SIZE + DATA + FOOTER_SIZE])

    @staticmethod
    def record_end(handle):
        return HEADER_SIZE + handle + record_size(encode_head(numbered(0)), 100)

    @defer.inlineCallbacks
    def test_the_footer_block_says_what_the_fsync_before_the_last_made_durable(self):
        store, handles = yield self.written_in_three_commits()
        self.assertEqual(self.progress(store), (handles[400] - handles[0], 400),
                         "the third commit wrote what the second had made durable")
        reopened = yield self.reopen_after_crash(store)
        self.assertEqual([record.body for _, record, _ in reopened.recover(JOBS)],
                         [numbered(number).body for number in range(450)])
        more = reopened.append(numbered(450), [JOBS])
        self.assertEqual(more, self.record_end(handles[-1]) - HEADER_SIZE, "writing resumes after the last record")

    @defer.inlineCallbacks
    def test_a_damaged_record_before_the_progress_is_found_when_read_and_costs_no_other_message(self):
        store, handles = yield self.written_in_three_commits()
        flip(chunk_path(store, 0), self.record_end(handles[10]) - RECORD_TAIL.size - 1)  # the last body byte
        reopened = yield self.reopen_after_crash(store)
        self.assertEqual(len(list(reopened.recovered_handles(JOBS))), 450, "no record was cut off at open")
        with self.assertRaises(StoreCorrupted):
            reopened.load(handles[10])
        self.assertEqual([reopened.load(handle).body for handle in handles[11:]],
                         [numbered(number).body for number in range(11, 450)])

    @defer.inlineCallbacks
    def test_a_torn_record_after_the_progress_is_cut_off_as_before(self):
        store, handles = yield self.written_in_three_commits()
        path = chunk_path(store, 0)
        torn = self.record_end(handles[440]) - HEADER_SIZE  # records 441 on are replaced by a torn one
        overwrite(path, HEADER_SIZE + torn, contents(path)[HEADER_SIZE + torn : HEADER_SIZE + torn + 30] + b"\xff" * 5)
        overwrite(path, HEADER_SIZE + torn + 35, bytes(self.record_end(handles[-1]) - HEADER_SIZE - torn - 35))
        reopened = yield self.reopen_after_crash(store)
        self.assertEqual([reopened.load(handle).body for handle in handles[:441]],
                         [numbered(number).body for number in range(441)])
        self.assertEqual(reopened.append(numbered(999), [JOBS]), torn, "the torn tail was cut: writing goes on there")

    @defer.inlineCallbacks
    def test_a_damaged_progress_block_means_a_walk_of_the_whole_chunk(self):
        store, handles = yield self.written_in_three_commits()
        flip(chunk_path(store, 0), HEADER_SIZE + DATA + 20)
        self.assertIsNone(self.progress(store))
        flip(chunk_path(store, 0), self.record_end(handles[10]) - RECORD_TAIL.size - 1)
        reopened = yield self.reopen_after_crash(store)
        self.assertEqual(reopened.append(numbered(999), [JOBS]), handles[10],
                         "walked from the start, as without a progress block: the damaged record ends the chunk")

    @defer.inlineCallbacks
    def test_a_clean_stop_records_the_last_fsync_so_a_damaged_record_cuts_off_nothing(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(numbered(number), [JOBS]) for number in range(300)]
        yield store.sync()  # one fsync only: without the stop's block, all 300 are walked at the next open
        reopened = yield self.reopen(store)
        self.assertEqual(self.progress(reopened), (self.record_end(handles[-1]) - HEADER_SIZE - handles[0], 300))
        yield reopened.close()
        flip(chunk_path(store, 0), self.record_end(handles[10]) - RECORD_TAIL.size - 1)  # the last body byte
        damaged = yield self.reopen(reopened)
        self.assertEqual(len(list(damaged.recovered_handles(JOBS))), 300, "no record was cut off at open")
        with self.assertRaises(StoreCorrupted):
            damaged.load(handles[10])
        self.assertEqual([damaged.load(handle).body for handle in handles[11:]],
                         [numbered(number).body for number in range(11, 300)])
