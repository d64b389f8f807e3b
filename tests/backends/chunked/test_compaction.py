"""Compaction of sparse chunks in the chunked store: a parked queue holding a
few messages in every chunk lets the chunks go, its messages moved to the
head of the log, read, acked and returned by the handles they had, in order,
before and after a restart; a crash at each step of a compaction brings back
every held message exactly once; each commit moves at most the option's bytes.
And the store contract holds with every finished chunk compacted. Random work
against a model and a real Broker are in
L{tests.backends.chunked.test_compaction_broker}."""

import os
import shutil
import time

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from backends.chunked.chunkfiles import bytes_on_disk
from backends.chunked.format import HEADER_SIZE, RECORD_OVERHEAD, record_size
from backends.chunked.movesfile import MOVES_FILE, MOVES_MAGIC
from tests.support.chunked_compaction import (
    BODY,
    COUNT,
    EVERY,
    PARKED,
    Compacting,
    parked_numbers,
    published,
    settle,
    slice_read,
)
from tests.support.chunked_files import (
    DATA,
    FILE_SIZE,
    ChunkedStores,
    chunk_numbers,
    chunk_path,
    flip,
    record_bytes,
)
from tests.support.store_contract import JOBS, NOW, StoreContract, queue_record
from tests.support.store_contract_durable import DurableStoreContract


class ParkedQueueTests(Compacting, unittest.TestCase):
    @defer.inlineCallbacks
    def test_disk_use_follows_what_a_parked_queue_holds(self):
        store, handles = yield self.parked_store()
        self.assertGreaterEqual(len(chunk_numbers(store)), 10)
        yield self.consume_jobs(store, handles)
        held = sum(record_bytes(published(number)) for number in parked_numbers())
        self.assertLessEqual(len(chunk_numbers(store)), 2, "the parked messages fill one chunk; one is written")
        self.assertLessEqual(bytes_on_disk(store.directory, chunk_numbers(store)), 2 * FILE_SIZE)
        self.assertGreaterEqual(store.stats()["compacted_chunks"], 9)
        self.assertEqual(store.stats()["bytes"], BODY * len(parked_numbers()))
        self.assertLess(held, DATA)
        for number in parked_numbers():
            self.assertEqual(store.load(handles[number]).body, published(number).body)
        store = yield self.reopen(store)
        self.assertLessEqual(len(chunk_numbers(store)), 2)
        self.assertEqual(list(store.recovered_handles(JOBS)), [])
        self.assert_parked(store, parked_numbers(), handles)

    @defer.inlineCallbacks
    def test_without_compaction_every_chunk_stays(self):
        store, handles = yield self.parked_store(compact_below="0")
        chunks = chunk_numbers(store)
        yield self.consume_jobs(store, handles)
        self.assertEqual(chunk_numbers(store), chunks)
        self.assertEqual(store.stats()["compacted_chunks"], 0)

    @defer.inlineCallbacks
    def test_a_chunk_still_well_held_is_not_compacted(self):
        store, handles = yield self.parked_store(compact_below="5")  # one 340-byte record is 8 % of a chunk
        chunks = chunk_numbers(store)
        yield self.consume_jobs(store, handles)
        self.assertEqual(chunk_numbers(store), chunks)

    @defer.inlineCallbacks
    def test_a_chunk_holding_a_delayed_message_is_not_compacted(self):
        store = yield self.open_store()
        for vhost, name in (JOBS, PARKED):
            store.save_queue(queue_record(name, vhost=vhost))
        store.delay(published(COUNT), ("/", "delays"), NOW + 3_600_000)  # its record goes to chunk 0
        handles = [store.append(published(number), [JOBS, PARKED] if number in parked_numbers() else [JOBS])
                   for number in range(COUNT)]
        yield store.sync()
        yield self.consume_jobs(store, handles)
        self.assertEqual(store.chunk_of(handles[0]), 0, "the parked message beside it stays too")
        self.assertIn(0, chunk_numbers(store))
        self.assertLessEqual(len(chunk_numbers(store)), 3)
        store = yield self.reopen(store)
        self.assert_parked(store, parked_numbers(), handles)

    @defer.inlineCallbacks
    def test_a_chunk_with_a_damaged_held_record_is_left_alone(self):
        store, handles = yield self.parked_store()
        damaged = handles[parked_numbers()[3]]
        flip(chunk_path(store, damaged // DATA), HEADER_SIZE + damaged % DATA + 30)
        yield self.consume_jobs(store, handles)
        self.assertIn(damaged // DATA, chunk_numbers(store))
        self.assertEqual(store.chunk_of(damaged), damaged // DATA)
        self.assertLessEqual(len(chunk_numbers(store)), 3)
        for number in parked_numbers():
            if handles[number] != damaged:
                self.assertEqual(store.load(handles[number]).body, published(number).body)

    @defer.inlineCallbacks
    def test_a_chunk_whose_held_bytes_changed_lately_is_not_compacted_yet(self):
        store, handles = yield self.parked_store(compact_after_seconds="3600")
        chunks = chunk_numbers(store)
        yield self.consume_jobs(store, handles)
        self.assertEqual(chunk_numbers(store), chunks)

    @defer.inlineCallbacks
    def test_an_idle_store_compacts_once_its_sparse_chunks_have_been_quiet_long_enough(self):
        store, handles = yield self.parked_store(compact_after_seconds="1")
        chunks = chunk_numbers(store)
        for handle in handles:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), chunks, "not quiet for a second yet")
        # Nothing is published or acked from now on: the store commits by itself when the chunks are due.
        deadline = time.monotonic() + 30
        while len(chunk_numbers(store)) > 2:
            self.assertLess(time.monotonic(), deadline, "the chunks were not compacted")
            yield task.deferLater(reactor, 0.05, lambda: None)
        self.assertEqual([store.load(handles[number]).body for number in parked_numbers()],
                         [published(number).body for number in parked_numbers()])

    @defer.inlineCallbacks
    def test_moved_messages_are_read_acked_and_returned_by_the_handles_they_had(self):
        store, handles = yield self.parked_store()
        parked = parked_numbers()
        store.returned(PARKED, handles[parked[1]], 2)
        yield self.consume_jobs(store, handles)
        moved = [handles[number] for number in parked]
        self.assertTrue(all(store.chunk_of(handle) != handle // DATA for handle in moved[:-1]), "they were moved")
        record = yield store.read(moved[2])
        self.assertEqual(record.body, published(parked[2]).body)
        record = yield store.lookup(store.message_id(moved[3]))
        self.assertEqual(record.properties.message_id, "p%03d" % parked[3])
        store.returned(PARKED, moved[4], 5)
        store.ack(PARKED, moved[0])
        store.purge(PARKED, [moved[5], moved[6]])
        yield settle(store)
        kept = [number for index, number in enumerate(parked) if index not in (0, 5, 6)]
        store = yield self.reopen(store)
        self.assert_parked(store, kept, handles)
        self.assertEqual(store.delivery_counts(PARKED), {handles[parked[1]]: 2, moved[4]: 5})
        self.assertEqual(store.stats()["moved_messages"], len(kept))
        for number in kept:
            store.ack(PARKED, handles[number])
        yield settle(store)
        self.assertEqual((store.stats()["messages"], store.stats()["moved_messages"]), (0, 0))
        self.assertEqual(len(chunk_numbers(store)), 1, "only the chunk being written is left")
        store = yield self.reopen(store)
        self.assertEqual((list(store.recovered_handles(PARKED)), store.stats()["moved_messages"]), ([], 0))

    @defer.inlineCallbacks
    def test_the_moves_file_is_rewritten_with_the_pairs_of_held_messages_only(self):
        store, handles = yield self.parked_store()
        store._writer.moves_file.rewrite_at_least = 4
        yield self.consume_jobs(store, handles)
        path = os.path.join(store.directory, MOVES_FILE)
        grown = os.path.getsize(path)
        kept = parked_numbers()[-2:]
        for number in parked_numbers()[:-2]:
            store.ack(PARKED, handles[number])
        yield settle(store)
        self.assertLess(os.path.getsize(path), grown)
        self.assertEqual(store.stats()["moved_messages"], 2)
        store = yield self.reopen(store)
        self.assert_parked(store, kept, handles)
        self.assertEqual(store.stats()["moved_messages"], 2)
        store._writer.moves_file.rewrite_at_least = 1
        for number in kept:
            store.ack(PARKED, handles[number])
        yield settle(store)
        self.assertEqual(os.path.getsize(path), len(MOVES_MAGIC), "no pair is left")

    @defer.inlineCallbacks
    def test_a_message_held_by_two_queues_moves_once_and_stays_until_both_ack_it(self):
        store = yield self.open_store()
        other = ("/", "other")
        for vhost, name in (JOBS, PARKED, other):
            store.save_queue(queue_record(name, vhost=vhost))
        handles = [store.append(published(number), [JOBS, PARKED, other] if number % EVERY == 0 else [JOBS])
                   for number in range(COUNT)]
        yield store.sync()
        yield self.consume_jobs(store, handles)
        self.assertLessEqual(len(chunk_numbers(store)), 2)
        self.assertEqual(store.stats()["messages"], len(parked_numbers()))
        for number in parked_numbers():
            store.ack(other, handles[number])
        yield settle(store)
        store = yield self.reopen(store)
        self.assert_parked(store, parked_numbers(), handles)
        self.assertEqual(list(store.recovered_handles(other)), [])

    @defer.inlineCallbacks
    def test_a_message_moved_twice_is_read_from_its_last_copy(self):
        store, handles = yield self.parked_store()
        yield self.consume_jobs(store, handles)
        kept = parked_numbers()[3:4]
        for number in parked_numbers():
            if number not in kept:
                store.ack(PARKED, handles[number])  # the copies' chunk is left sparse, and the sparsest
        first = {number: store.chunk_of(handles[number]) for number in kept}
        # Consumed messages to the end of the copies' chunk, then more chunks with a parked message each:
        # the copies' chunk is one sparse chunk of many, as sparse as any and the oldest.
        current, more = store.stats()["append_position"] // DATA, []
        while store.stats()["append_position"] // DATA == current:
            more.append(store.append(published(COUNT), [JOBS]))
        filler = len(more)
        more += [store.append(published(COUNT + number), [JOBS, PARKED] if number % EVERY == 1 else [JOBS])
                 for number in range(1, 3 * EVERY)]
        yield store.sync()
        yield self.consume_jobs(store, more)
        again = {number: store.chunk_of(handles[number]) for number in kept}
        self.assertTrue(all(again[number] > first[number] for number in kept), (first, again))
        self.assertNotIn(first[kept[0]], chunk_numbers(store))
        store = yield self.reopen(store)
        recovered = list(store.recovered_handles(PARKED))
        parked = range(1, 3 * EVERY, EVERY)
        self.assertEqual(recovered, [handles[number] for number in kept] + [more[filler + n - 1] for n in parked])
        self.assertEqual([store.load(handle).body for handle in recovered],
                         [published(number).body for number in kept + [COUNT + n for n in parked]])

    @defer.inlineCallbacks
    def test_the_last_sparse_chunk_is_left_as_it_is(self):
        store, handles = yield self.parked_store()
        yield self.consume_jobs(store, handles)
        for number in parked_numbers()[1:]:
            store.ack(PARKED, handles[number])
        yield settle(store)
        where = store.chunk_of(handles[0])
        for _ in range(3):  # chunks filled and consumed in one commit each, so none is ever sparse for a while
            more = [store.append(published(COUNT + number), [JOBS]) for number in range(EVERY)]
            yield self.consume_jobs(store, more)
        self.assertEqual(store.chunk_of(handles[0]), where, "one message is not copied again with every chunk")
        self.assertEqual(len(chunk_numbers(store)), 2)


class CrashTests(Compacting, unittest.TestCase):
    """The directory copied at each step of a compaction is what a restart after a crash there finds."""

    def snapshot(self, store, name, snapshots):
        copy = os.path.join(self.fresh_data_dir(), "chunked")
        shutil.copytree(store.directory, copy)
        snapshots.setdefault(name, os.path.dirname(copy))

    def watch_steps(self, store, snapshots):
        writer = store._writer
        apply_moves, append, delete = writer.compactor.apply_moves, writer.moves_file.append, writer.log.delete

        def watched_apply_moves(moves, dropped):
            if moves:
                self.snapshot(store, "copies written", snapshots)
            return apply_moves(moves, dropped)

        def watched_append(pairs):
            append(pairs)
            self.snapshot(store, "moves written", snapshots)

        def watched_delete(number):
            if writer.moves_file.unsynced:
                raise AssertionError("a chunk deleted before the moves were fsynced")
            delete(number)
            if writer.moves_file.pairs:  # a chunk emptied by moves, not by acks alone
                self.snapshot(store, "chunk deleted", snapshots)

        writer.compactor.apply_moves = watched_apply_moves
        writer.moves_file.append, writer.log.delete = watched_append, watched_delete

    @defer.inlineCallbacks
    def test_a_restart_at_each_step_brings_back_every_held_message_once(self):
        store, handles = yield self.parked_store()
        store.returned(PARKED, handles[parked_numbers()[0]], 3)
        snapshots = {}
        self.watch_steps(store, snapshots)
        yield self.consume_jobs(store, handles)
        self.assertEqual(sorted(snapshots), ["chunk deleted", "copies written", "moves written"])
        torn = self.fresh_data_dir()
        shutil.copytree(os.path.join(snapshots["moves written"], "chunked"), os.path.join(torn, "chunked"))
        moves_path = os.path.join(torn, "chunked", MOVES_FILE)
        os.truncate(moves_path, os.path.getsize(moves_path) - 5)
        snapshots["moves record torn"] = torn
        for name, data_dir in sorted(snapshots.items()):
            restarted = yield self.open_store(data_dir)
            self.assertEqual(list(restarted.recovered_handles(JOBS)), [], name)
            self.assert_parked(restarted, parked_numbers(), handles)
            self.assertEqual(restarted.delivery_counts(PARKED), {handles[parked_numbers()[0]]: 3}, name)
            yield settle(restarted)  # compaction goes on from where the crash left it
            self.assertLessEqual(len(chunk_numbers(restarted)), 2, name)
            restarted = yield self.reopen(restarted)
            self.assert_parked(restarted, parked_numbers(), handles)
            yield restarted.close()

    @defer.inlineCallbacks
    def test_copies_of_messages_acked_meanwhile_are_left_unreferenced(self):
        store, handles = yield self.parked_store()
        for handle in handles:
            store.ack(JOBS, handle)
        yield store.sync()  # the first slice is named now, to go with the next commit once read
        yield slice_read(store)
        copies = list(store._pending.batch.moves)
        self.assertTrue(copies)
        for handle, _ in copies:
            store.ack(PARKED, handle)  # acked in the very commit that writes the copies
        yield settle(store)
        gone = {handle for handle, _ in copies}
        kept = [number for number in parked_numbers() if handles[number] not in gone]
        store = yield self.reopen(store)
        self.assert_parked(store, kept, handles)


class ThrottleTests(Compacting, unittest.TestCase):
    @defer.inlineCallbacks
    def test_each_commit_copies_at_most_the_option_bytes_and_one_record(self):
        store = self.make_store(compact_bytes="700")
        copied = []
        writer = store._writer
        write_batch = writer.write_batch

        def measured(batch, fsync):
            if batch is not None and batch.moves:
                positions = {position for _, position in batch.moves}
                copied.append(sum(record_size(head, len(body)) for position, head, body in batch.records
                                  if position in positions))
            return write_batch(batch, fsync)

        writer.write_batch = measured  # before the store opens: the writer thread is given this one
        self.addCleanup(store.close)
        yield store.open()
        handles = yield self.park(store)
        yield self.consume_jobs(store, handles)
        one = record_bytes(published(0))
        self.assertGreaterEqual(len(copied), 5, "ten chunks' records went in several commits")
        self.assertLessEqual(max(copied), 700 + one)
        self.assertGreaterEqual(sum(copied), one * len(parked_numbers()))
        self.assertLessEqual(len(chunk_numbers(store)), 2)

    def test_the_options_are_checked(self):
        for options in ({"compact_below": "51"}, {"compact_below": "-1"}, {"compact_bytes": "0"}):
            self.assertRaises(ValueError, self.make_store, **options)
        self.assertEqual(self.backend.options["compact_below"][0], "25")
        self.assertEqual(self.backend.options["compact_bytes"][0], "256K")
        self.assertEqual(self.backend.options["compact_after_seconds"][0], "5")
        self.assertEqual(RECORD_OVERHEAD, 17)


class EveryChunkCompactedContractTests(ChunkedStores, StoreContract, unittest.TestCase):
    """The store contract with every finished chunk up to half held compacted, a record per commit."""

    options = {**ChunkedStores.options, "compact_below": "50", "compact_bytes": "1", "compact_after_seconds": "0"}


class EveryChunkCompactedDurableContractTests(ChunkedStores, DurableStoreContract, unittest.TestCase):
    """The durable store contract (restarts, crashes) with compaction as eager."""

    options = EveryChunkCompactedContractTests.options
