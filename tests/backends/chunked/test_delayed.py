"""The delayed-message contract for the chunked backend, plus what is particular
to it: the journal, the bucket files and their flushes, message chunks kept
for delayed messages, memory at reopen, and the benchmark. Torn and damaged
files are tested in L{tests.backends.chunked.test_delayed_damage}."""

import json
import os
import shutil
import subprocess
import sys
import tracemalloc

from twisted.internet import defer, threads
from twisted.trial import unittest

from backends.chunked.delayedbuckets import MAX_BLOCKS
from backends.chunked.delayedformat import (
    BUCKET_HEADER,
    JOURNAL_HEADER,
    RELEASES,
    RUN,
    decode_blocks,
    decode_bucket_header,
    decode_journal_entries,
    decode_journal_header,
    handles_of,
    run_of,
)
from backends.chunked.delayedindex import LOADED_VIEWS
from backends.chunked.format import HEADER_SIZE
from brokerd.interfaces import StoreCorrupted
from tests.support.chunked_files import (
    SECOND,
    ChunkedStores,
    big,
    bucket_numbers,
    bucket_path,
    chunk_numbers,
    chunk_path,
    contents,
    delayed_dir,
    flip,
    sized,
)
from tests.support.delayed_store_contract import DELAYS, FOREVER, NOW, DelayedStoreContract, bodies, delayed, keys
from tests.support.paths import ROOT
from tests.support.store_contract import JOBS, queue_record


class ChunkedDelayedStoreTests(ChunkedStores, DelayedStoreContract, unittest.TestCase):
    pass


class ChunkedSmallBucketsDelayedStoreTests(ChunkedStores, DelayedStoreContract, unittest.TestCase):
    """The contract again with one-second buckets and a flush every five journal entries."""

    options = {**ChunkedStores.options, "delayed_bucket_ms": "1000", "delayed_flush_entries": "5"}


def journal(store):
    """The journal's generation and entries, read from the file."""
    data = contents(os.path.join(delayed_dir(store), "journal"))
    entries, stop, problem = decode_journal_entries(data, JOURNAL_HEADER.size)
    assert (stop, problem) == (len(data), None), (stop, problem)
    return decode_journal_header(data), entries


def bucket_blocks(store, number):
    """The blocks of a bucket file: (kind, generation, keys of a run or released handles)."""
    data = contents(bucket_path(store, number))
    assert decode_bucket_header(data) == (number, SECOND)
    blocks, stop, problem = decode_blocks(data, BUCKET_HEADER.size)
    assert (stop, problem) == (len(data), None), (stop, problem)
    found = []
    for kind, (generation, _), payload in blocks:
        if kind == RUN:
            run = run_of(payload)
            found.append((RUN, generation, list(zip(run.dues, run.handles))))
        else:
            found.append((RELEASES, generation, sorted(handles_of(payload))))
    return found


class ChunkedDelayedFilesTests(ChunkedStores, unittest.TestCase):
    options = {**ChunkedStores.options, "delayed_bucket_ms": str(SECOND), "delayed_flush_entries": "10"}

    @defer.inlineCallbacks
    def test_a_commit_writes_the_journal_and_no_bucket(self):
        store = yield self.open_store()
        self.assertFalse(os.path.exists(delayed_dir(store)), "nothing delayed, no files")
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n * SECOND // 2) for n in range(9)]
        yield store.sync()
        self.assertEqual(sorted(os.listdir(delayed_dir(store))), ["journal", "meta"])
        generation, entries = journal(store)
        self.assertEqual(generation, 1)
        self.assertEqual([(due, handle) for due, handle, _, _ in entries],
                         [(NOW + n * SECOND // 2, handles[n]) for n in range(9)])
        self.assertEqual({exchange for _, _, _, exchange in entries}, {0})
        self.assertEqual(store.stats()["delayed_flushes"], 0)

    @defer.inlineCallbacks
    def test_a_full_journal_is_flushed_into_one_sorted_run_per_bucket(self):
        store = yield self.open_store()
        dues = [NOW + SECOND * (n % 3) + (10 - n) for n in range(10)]
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, due) for n, due in enumerate(dues)]
        yield store.sync()
        first = NOW // SECOND
        self.assertEqual(bucket_numbers(store), [first, first + 1, first + 2])
        for offset in range(3):
            expected = sorted((due, handle) for due, handle in zip(dues, handles) if due // SECOND == first + offset)
            self.assertEqual(bucket_blocks(store, first + offset), [(RUN, 1, expected)])
        self.assertEqual(journal(store), (2, []))
        self.assertEqual(store.stats()["delayed_flushes"], 1)
        store = yield self.reopen(store)
        self.assertEqual(keys((yield store.delayed_after(None, FOREVER, 100))), sorted(zip(dues, handles)))

    @defer.inlineCallbacks
    def test_releases_go_to_the_buckets_and_a_bucket_with_nothing_kept_goes(self):
        store = yield self.open_store()
        early = [store.delay(delayed(b"e%d" % n), DELAYS, NOW + n) for n in range(5)]
        late = [store.delay(delayed(b"l%d" % n), DELAYS, NOW + SECOND + n) for n in range(5)]
        yield store.sync()  # ten entries: flushed
        first = NOW // SECOND
        self.assertEqual(bucket_numbers(store), [first, first + 1])
        for handle in [*early, late[1]]:
            store.release(handle)
        for n in range(4):
            store.delay(delayed(b"x%d" % n), DELAYS, NOW + 5 * SECOND)
        yield store.sync()  # ten more: flushed again
        self.assertEqual(bucket_numbers(store), [first + 1, first + 5])
        self.assertEqual([block[:2] for block in bucket_blocks(store, first + 1)], [(RUN, 1), (RELEASES, 2)])
        self.assertEqual(bucket_blocks(store, first + 1)[1][2], [late[1]])
        store = yield self.reopen(store)
        found = yield store.delayed_after(None, FOREVER, 100)
        self.assertEqual(bodies(found), [b"l0", b"l2", b"l3", b"l4", b"x0", b"x1", b"x2", b"x3"])

    @defer.inlineCallbacks
    def test_a_bucket_of_many_blocks_is_rewritten_as_one_run(self):
        store = yield self.open_store(delayed_flush_entries="1")  # every commit flushes
        bucket = NOW // SECOND
        handles = []
        for n in range(3 * MAX_BLOCKS):
            handles.append(store.delay(delayed(b"m%d" % n), DELAYS, NOW + 100 - n))
            if n % 3 == 0:
                store.release(handles[n])
            yield store.sync()
            if n:  # m0, released in its own commit, never made the file
                self.assertLessEqual(len(bucket_blocks(store, bucket)), MAX_BLOCKS)
        blocks = bucket_blocks(store, bucket)
        self.assertLess(len(blocks), 3 * MAX_BLOCKS // 2, "rewritten at least once")
        expected = sorted((NOW + 100 - n, handle) for n, handle in enumerate(handles) if n % 3)
        self.assertEqual(keys((yield store.delayed_after(None, FOREVER, 1000))), expected)
        store = yield self.reopen(store)
        self.assertEqual(keys((yield store.delayed_after(None, FOREVER, 1000))), expected)

    @defer.inlineCallbacks
    def test_only_a_few_buckets_stay_loaded(self):
        store = yield self.open_store(delayed_flush_entries="1")
        buckets = 2 * LOADED_VIEWS
        for _ in range(MAX_BLOCKS + 1):  # enough flushes for every bucket file to be rewritten once
            for bucket in range(buckets):
                store.delay(delayed(b"m"), DELAYS, NOW + bucket * SECOND)
            yield store.sync()
        index = store._writer.delayed

        def loaded():
            return sum(state.view is not None for state in index.buckets.values())

        self.assertEqual(len(index.buckets), buckets)
        self.assertEqual(loaded(), 0, "a bucket loaded for its rewrite is let go after it")
        self.assertEqual(len((yield store.delayed_after(None, FOREVER, 10_000))), buckets * (MAX_BLOCKS + 1))
        self.assertEqual(loaded(), LOADED_VIEWS)

    @defer.inlineCallbacks
    def test_exchanges_are_numbered_in_the_meta_file(self):
        store = yield self.open_store()
        store.delay(delayed(b"a"), DELAYS, NOW)
        store.delay(delayed(b"b"), ("staging", "other"), NOW)
        store.delay(delayed(b"c"), DELAYS, NOW)
        yield store.sync()
        self.assertEqual([exchange for _, _, _, exchange in journal(store)[1]], [0, 1, 0])
        self.assertIn(b"staging\0other", contents(os.path.join(delayed_dir(store), "meta")))
        store = yield self.reopen(store)
        store.delay(delayed(b"d"), ("staging", "other"), NOW)
        found = yield store.delayed_after(None, FOREVER, 10)
        self.assertEqual([item.exchange for item in found], [DELAYS, ("staging", "other"), DELAYS,
                                                              ("staging", "other")])

    @defer.inlineCallbacks
    def test_a_flush_cut_short_by_a_crash_is_applied_once(self):
        # The journal of generation 1 is back beside buckets its flush already wrote: the buckets
        # holding blocks of generation 1 must not take its entries again; the others must.
        store = yield self.open_store(delayed_flush_entries="1000")
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + (n % 4) * SECOND + n) for n in range(12)]
        store.release(handles[0])
        yield store.sync()
        store.release(handles[5])
        yield store.sync()
        journal_bytes = contents(os.path.join(delayed_dir(store), "journal"))
        yield store.close()  # flushes: every bucket written with generation 1
        first = NOW // SECOND
        os.unlink(bucket_path(store, first + 2))  # as if the crash came before the flush reached it
        with open(os.path.join(delayed_dir(store), "journal"), "wb") as restored:
            restored.write(journal_bytes)
        store = yield self.reopen(store)
        expected = [b"m%d" % n for n in sorted(range(12), key=lambda n: ((n % 4) * SECOND + n)) if n not in (0, 5)]
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 100))), expected)
        self.assertEqual(store.stats()["delayed"], 10)
        self.assertEqual([block[0] for block in bucket_blocks(store, first + 2)], [RUN])
        store = yield self.reopen(store)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 100))), expected)

    @defer.inlineCallbacks
    def test_entries_a_bucket_got_after_its_flush_are_replayed(self):
        # A flush wrote bucket A from the journal's first six entries, then stopped short (an error,
        # a crash) before bucket C and before starting the journal over; two more delays for A came
        # in the journal after it. A store opened on that takes A's last two and C's three again.
        store = yield self.open_store(delayed_flush_entries="1000")
        first = [store.delay(delayed(b"a%d" % n), DELAYS, NOW + n) for n in range(3)]
        first += [store.delay(delayed(b"c%d" % n), DELAYS, NOW + 2 * SECOND + n) for n in range(3)]
        yield store.sync()
        six = self.crash_copy(store)
        store.delay(delayed(b"a3"), DELAYS, NOW + 3)
        store.delay(delayed(b"a4"), DELAYS, NOW + 4)
        yield store.sync()
        eight = self.crash_copy(store)
        flushed = yield self.open_store(six)  # replays the six entries and flushes them
        bucket_a = os.path.basename(bucket_path(flushed, NOW // SECOND))
        yield flushed.close()
        crashed = os.path.join(eight, self.subdirectory, "delayed")
        with open(os.path.join(crashed, bucket_a), "wb") as written:
            written.write(contents(os.path.join(six, self.subdirectory, "delayed", bucket_a)))
        store = yield self.open_store(eight)
        found = yield store.delayed_after(None, FOREVER, 100)
        self.assertEqual(bodies(found), [b"a0", b"a1", b"a2", b"a3", b"a4", b"c0", b"c1", b"c2"])

    def crash_copy(self, store):
        """A data directory holding the files of C{store}, which stays open, as they are now."""
        crashed = self.fresh_data_dir()
        shutil.copytree(store.directory, os.path.join(crashed, self.subdirectory))
        return crashed


class ChunkedDelayedChunkTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def queued_and_delayed(self):
        """A store with three big delayed messages in chunk 0 and seven big queued ones after them."""
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        held = [store.delay(big(n), DELAYS, NOW + n) for n in range(3)]
        queued = [store.append(big(n), [JOBS]) for n in range(3, 10)]
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0, 1, 2, 3])
        return store, held, queued

    @defer.inlineCallbacks
    def test_a_chunk_stays_while_a_delayed_message_points_into_it(self):
        store, held, queued = yield self.queued_and_delayed()
        for handle in queued:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0, 3], "chunk 0 holds delayed messages; 3 is being written")
        store.release(held[0])
        store.release(held[1])
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0, 3])
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 10))), [big(2).body])
        store.release(held[2])
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [3])

    @defer.inlineCallbacks
    def test_a_reopened_store_counts_what_delayed_messages_point_into(self):
        store, held, queued = yield self.queued_and_delayed()
        store = yield self.reopen(store)
        for handle, _, _ in list(store.recover(JOBS)):
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store)[0], 0)
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 10))), [big(n).body for n in range(3)])
        for handle in held:
            store.release(handle)
        store = yield self.reopen(store)
        self.assertNotIn(0, chunk_numbers(store))
        self.assertEqual((yield store.delayed_after(None, FOREVER, 10)), [])


class ChunkedDelayedWindowReadTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_window_s_records_are_read_by_the_writer_thread_whatever_their_size(self):
        # The reactor thread would wait for the disk on each record it read (100 ms stalls with a million delays).
        sizes = [10, 5000, 30000, 700]  # 5000 and 30000 take more than the first read of a record
        store = yield self.open_store(chunk_size=str(1 << 16))
        for number, size in enumerate(sizes):
            store.delay(sized("d%d" % number, size), DELAYS, NOW + number)
        store = yield self.reopen(store, chunk_size=str(1 << 16))
        found = yield store.delayed_after(None, FOREVER, 10)
        self.assertEqual([(item.record.properties.message_id, item.record.body) for item in found],
                         [("d%d" % number, sized("d%d" % number, size).body) for number, size in enumerate(sizes)])
        self.assertEqual(store.stats()["chunk_reads"], 0, "the reactor thread read no chunk")

    @defer.inlineCallbacks
    def test_a_damaged_record_fails_the_window_naming_its_chunk(self):
        store = yield self.open_store()
        for number in range(4):  # three fill chunk 0 (a damaged last chunk would be a crash's torn tail)
            store.delay(big(number), DELAYS, NOW + number)
        store = yield self.reopen(store)
        yield store.close()
        flip(chunk_path(store, 0), HEADER_SIZE + 100)
        store = yield self.open_store(self.data_dir_of(store))
        failure = yield self.assertFailure(store.delayed_after(None, FOREVER, 10), StoreCorrupted)
        self.assertIn(chunk_path(store, 0), str(failure))
        self.assertIn("the record at data offset 0 is damaged (CRC mismatch)", str(failure))


class ChunkedDelayedMemoryTests(ChunkedStores, unittest.TestCase):
    timeout = 240

    # Chunks of 1 MiB: the open of either store below reads its last chunk whole, in one read of
    # the same size, which is less than the delayed messages of the larger store cost.

    @defer.inlineCallbacks
    def filled(self, count):
        """A closed store of C{count} delayed messages due over an hour, and its data directory."""
        store = yield self.open_store(chunk_size="1M")
        message = sized("m", 20)
        for number in range(count):
            store.delay(message, DELAYS, NOW + (number * 7919) % 3_600_000)
            if number % 20_000 == 19_999:
                yield store.sync()
        yield store.close()
        return self.data_dir_of(store)

    @defer.inlineCallbacks
    def peak_of_reopen_and_first_window(self, data_dir):
        """The peak of memory allocated by Python while a store reopens and reads its first window."""
        tracemalloc.start()
        try:
            store = yield self.open_store(data_dir, chunk_size="1M")
            window = yield store.delayed_after(None, FOREVER, 1000)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        self.assertEqual(len(window), 1000)
        return store, peak

    @defer.inlineCallbacks
    def test_reopening_200000_delayed_messages_makes_no_object_per_message(self):
        small = yield self.filled(2_000)
        large = yield self.filled(200_000)
        _, small_peak = yield self.peak_of_reopen_and_first_window(small)
        store, large_peak = yield self.peak_of_reopen_and_first_window(large)
        self.assertEqual(store.stats()["delayed"], 200_000)
        self.assertEqual(len(store._writer.delayed._loaded), 1, "the first window loaded one bucket of 60")
        # One Python object per message (an int is 28 bytes, a tuple 56 and more) would take
        # well over 32 bytes each; the arrays of the handle map take about 17.
        self.assertLess(large_peak - small_peak, 200_000 * 32, (small_peak, large_peak))


class DelayedBenchmarkTests(unittest.TestCase):
    timeout = 120

    @defer.inlineCallbacks
    def test_the_benchmark_pages_through_everything_it_delayed(self):
        command = [sys.executable, "-m", "benchmarks.delayed_store", "--backend", "chunked", "--messages", "2000",
                   "--batch", "500", "--window", "300", "--json"]
        root = ROOT
        done = yield threads.deferToThread(subprocess.run, command, cwd=root, capture_output=True, timeout=100)
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        results = json.loads(done.stdout)
        self.assertEqual((results["paged"], results["delayed_after_reopen"], results["delayed_at_end"]),
                         (2000, 2000, 0))
        for figure in ("delay_per_s", "reopen_s", "page_per_s", "peak_rss_mib"):
            self.assertGreater(results[figure], 0)
