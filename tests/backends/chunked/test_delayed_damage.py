"""Torn and damaged delayed-message files of the chunked store: what open cuts
off (and logs), what it reports (StoreCorrupted naming the file, the queues
unaffected), and delayed entries whose records a crash cut off the log."""

import os
import shutil

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked.delayedformat import (
    BUCKET_HEADER,
    JOURNAL_ENTRY,
    JOURNAL_HEADER,
    decode_journal_header,
    encode_releases_block,
)
from backends.chunked.format import HEADER_SIZE
from brokerd.interfaces import StoreCorrupted
from tests.support.chunked_files import (
    SECOND,
    ChunkedStores,
    bucket_numbers,
    bucket_path,
    chunk_numbers,
    chunk_path,
    contents,
    delayed_dir,
    flip,
    overwrite,
)
from tests.support.delayed_store_contract import (
    DELAYS,
    FOREVER,
    NOW,
    assert_delayed_damage_leaves_queues_working,
    bodies,
    delayed,
)
from tests.support.logs import LogWatcher
from tests.support.store_contract import JOBS, message, queue_record

TEN = [b"m%d" % n for n in range(10)]


class ChunkedDelayedDamageTests(ChunkedStores, unittest.TestCase):
    options = {**ChunkedStores.options, "delayed_bucket_ms": str(SECOND), "delayed_flush_entries": "1000"}

    @defer.inlineCallbacks
    def journal_of_ten(self):
        """
        The data directory a crash left with ten delayed messages (and one
        queued) in the journal, none flushed; the journal's path.
        """
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"queued"), [JOBS])
        for number, body in enumerate(TEN):
            store.delay(delayed(body.decode().encode()), DELAYS, NOW + number)
        yield store.sync()
        crashed = self.fresh_data_dir()
        shutil.copytree(store.directory, os.path.join(crashed, self.subdirectory))
        yield store.close()
        return crashed, os.path.join(crashed, self.subdirectory, "delayed", "journal")

    @defer.inlineCallbacks
    def buckets_of_ten(self):
        """A closed store whose ten delayed messages sit in one bucket file of two runs; the file's path."""
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"queued"), [JOBS])
        for number, body in enumerate(TEN):
            store.delay(delayed(body), DELAYS, NOW + number)
            if number == 4:
                yield store.close()
                store = yield self.open_store(self.data_dir_of(store))  # the close flushed the first five
        yield store.close()
        self.assertEqual(bucket_numbers(store), [NOW // SECOND])
        return store, bucket_path(store, NOW // SECOND)

    @defer.inlineCallbacks
    def assert_delayed_unavailable(self, data_dir, path):
        """A store opens on C{data_dir}: its queue works, its delayed calls fail naming C{path}."""
        before = contents(path)
        store = yield self.open_store(data_dir)
        yield assert_delayed_damage_leaves_queues_working(self, store, path, before)

    # -- torn tails

    @defer.inlineCallbacks
    def test_a_torn_journal_entry_is_cut_off_and_logged(self):
        crashed, path = yield self.journal_of_ten()
        size = os.path.getsize(path)
        os.truncate(path, size - 10)  # the last entry was half written
        logged = LogWatcher(self)
        store = yield self.open_store(crashed)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 100))), TEN[:9])
        self.assertEqual(len(logged.matching(path, "torn tail of %d bytes" % (JOURNAL_ENTRY.size - 10))), 1)
        self.assertEqual(store.stats()["delayed"], 9)

    @defer.inlineCallbacks
    def test_garbage_after_the_journal_is_cut_off_and_logged(self):
        crashed, path = yield self.journal_of_ten()
        with open(path, "ab") as journal:
            journal.write(b"garbage, no entry" * 3)
        logged = LogWatcher(self)
        store = yield self.open_store(crashed)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 100))), TEN)
        self.assertEqual(len(logged.matching(path, "torn tail")), 1)

    @defer.inlineCallbacks
    def test_a_bucket_block_torn_by_a_crash_in_its_flush_is_cut_off_and_logged(self):
        store, _ = yield self.buckets_of_ten()
        store = yield self.open_store(self.data_dir_of(store))
        handle = store.delay(delayed(b"m10"), DELAYS, NOW + 10)
        yield store.sync()
        crashed = self.fresh_data_dir()
        shutil.copytree(store.directory, os.path.join(crashed, self.subdirectory))
        path = os.path.join(crashed, self.subdirectory, "delayed", "bucket-%020d" % (NOW // SECOND))
        generation = decode_journal_header(contents(os.path.join(os.path.dirname(path), "journal")))
        size = os.path.getsize(path)
        with open(path, "ab") as bucket:  # the flush of this generation was writing m10's run when the crash came
            bucket.write(encode_releases_block((generation, 1), [handle])[:20])
        logged = LogWatcher(self)
        store = yield self.open_store(crashed)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 100))), TEN + [b"m10"])
        self.assertEqual(len(logged.matching(path, "torn tail of 20 bytes")), 1)
        self.assertGreater(os.path.getsize(path), size, "cut, then m10 flushed from the journal")

    @defer.inlineCallbacks
    def test_a_bad_last_block_a_flush_synced_is_reported(self):
        store, path = yield self.buckets_of_ten()
        size = os.path.getsize(path)
        overwrite(path, size - 3, b"rot")  # the CRC of the last run: written and synced long ago
        yield self.assert_delayed_unavailable(self.data_dir_of(store), path)

    # -- damage in the middle

    @defer.inlineCallbacks
    def test_a_damaged_journal_entry_followed_by_sound_ones_is_reported(self):
        crashed, path = yield self.journal_of_ten()
        flip(path, JOURNAL_HEADER.size + 3 * JOURNAL_ENTRY.size + 5)
        logged = LogWatcher(self)
        yield self.assert_delayed_unavailable(crashed, path)
        self.assertGreaterEqual(len(logged.matching(path, "bad (CRC mismatch), yet sound entries follow")), 1)

    @defer.inlineCallbacks
    def test_a_damaged_journal_header_is_reported(self):
        crashed, path = yield self.journal_of_ten()
        flip(path, 20)
        yield self.assert_delayed_unavailable(crashed, path)

    @defer.inlineCallbacks
    def test_a_damaged_bucket_block_followed_by_a_sound_one_is_reported(self):
        store, path = yield self.buckets_of_ten()
        flip(path, BUCKET_HEADER.size + 40)  # in the first run
        yield self.assert_delayed_unavailable(self.data_dir_of(store), path)

    @defer.inlineCallbacks
    def test_a_damaged_meta_file_is_reported(self):
        store, _ = yield self.buckets_of_ten()
        path = os.path.join(delayed_dir(store), "meta")
        flip(path, 5)
        yield self.assert_delayed_unavailable(self.data_dir_of(store), path)

    @defer.inlineCallbacks
    def test_a_missing_meta_file_is_reported(self):
        store, _ = yield self.buckets_of_ten()
        path = os.path.join(delayed_dir(store), "meta")
        os.rename(path, path + ".away")
        with self.assertRaises(FileNotFoundError):
            yield self.assert_delayed_unavailable(self.data_dir_of(store), path)
        store = yield self.open_store(self.data_dir_of(store))
        failure = yield self.assertFailure(store.delayed_after(None, FOREVER, 10), StoreCorrupted)
        self.assertIn("missing", str(failure))

    @defer.inlineCallbacks
    def test_no_message_chunk_goes_while_delayed_messages_cannot_be_read(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.delay(delayed(b"d" * 1000), DELAYS, NOW)
        store.delay(delayed(b"e" * 1000), DELAYS, NOW + 1)
        yield store.close()
        path = bucket_path(store, NOW // SECOND)
        flip(path, BUCKET_HEADER.size + 40)
        store = yield self.open_store(self.data_dir_of(store))
        handles = [store.append(message(b"q" * 1000), [JOBS]) for _ in range(8)]
        for handle in handles:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store)[0], 0, "chunk 0 holds the delayed messages of the damaged bucket")

    # -- entries whose records a crash cut off

    @defer.inlineCallbacks
    def test_entries_past_the_end_of_the_log_are_dropped_and_stay_dropped(self):
        # Possible with --sync none: the index reached the disk, the last records did not.
        store = yield self.open_store()
        kept = [store.delay(delayed(b"kept%d" % n), DELAYS, NOW + 10 * n) for n in range(3)]
        position = store.stats()["append_position"]
        store.delay(delayed(b"lost"), DELAYS, NOW + 5)
        yield store.close()
        os.truncate(chunk_path(store, 0), HEADER_SIZE + position + 8)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual(len(logged.matching("1 entries point past the end of the message log")), 1)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 100))), [b"kept0", b"kept1", b"kept2"])
        self.assertEqual(store.stats()["delayed"], 3)
        store.delay(delayed(b"written where lost was"), DELAYS, NOW + 100)
        self.assertEqual(store.stats()["append_position"] - position > 0, True)
        store = yield self.reopen(store)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 100))),
                         [b"kept0", b"kept1", b"kept2", b"written where lost was"])
        self.assertEqual([item.handle for item in (yield store.delayed_after(None, NOW + 20, 100))], kept)
