"""The store contract for the chunked backend (EQueue's design), plus what is
particular to it: when message chunks are deleted, retention, lookup by id,
what opening reads, figures and options. Its on-disk formats are tested in
L{tests.backends.chunked.test_format}, damaged and torn files in
L{tests.backends.chunked.test_damage}, the ack log, checkpoints and delivery
counts in L{tests.backends.chunked.test_acks}."""

import gc
import os
import re
import time

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked import MessageTooLarge
from backends.chunked.format import (
    HEADER_SIZE,
    position_of,
)
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from tests.support.chunked_files import (
    DATA,
    ENTRIES,
    FILE_SIZE,
    ChunkedStores,
    big,
    chunk_numbers,
    chunk_path,
    contents,
    filling,
    index_chunk_numbers,
    index_chunk_path,
    index_dir,
    record_bytes,
    sized,
)
from tests.support.logs import LogWatcher
from tests.support.store_contract import AUDIT, JOBS, StoreContract, message
from tests.support.store_contract_durable import DurableStoreContract


def mapped_chunks(store):
    """The numbers of the message chunk files this process has mapped, from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
    return sorted(number for number in range(64) if chunk_path(store, number) in paths
                  or chunk_path(store, number) + " (deleted)" in paths)


class ChunkedStoreContractTests(ChunkedStores, StoreContract, unittest.TestCase):
    pass


class ChunkedDurableStoreContractTests(ChunkedStores, DurableStoreContract, unittest.TestCase):
    pass


class ChunkedWriteTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_one_commit_of_small_and_large_records_across_chunks_reads_back_intact(self):
        # Small records go to the chunk joined into writes of up to 1 MiB, bodies of 64 KiB or more on their own.
        sizes = [100 << 10 if number % 500 == 0 else 1000 + number % 7 for number in range(3000)]
        published = [sized("w%05d" % number, size) for number, size in enumerate(sizes)]
        store, handles = yield self.store_with(published, chunk_size=str(2 << 20))
        self.assertEqual(chunk_numbers(store), [0, 1])
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [each.body for each in published])
        for handle, each in list(zip(handles, published))[::97]:
            record = yield store.read(handle)
            self.assertEqual((record.properties.message_id, record.body), (each.properties.message_id, each.body))


class ChunkedChunkDeletionTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_chunk_is_deleted_only_once_its_last_message_is_acked(self):
        store, handles = yield self.store_with([big(n) for n in range(10)])
        self.assertEqual(chunk_numbers(store), [0, 1, 2, 3])
        self.assertEqual([store.chunk_of(handle) for handle in handles], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3])
        store.ack(JOBS, handles[0])
        store.ack(JOBS, handles[2])
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0, 1, 2, 3], "m01 of chunk 0 is not acked yet")
        store.ack(JOBS, handles[1])
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [1, 2, 3])
        self.assertEqual((sorted(store.chunk_stats()), store.stats()["chunks"]), ([1, 2, 3], 3))
        store = yield self.reopen(store)
        self.assertEqual(chunk_numbers(store), [1, 2, 3])
        self.assertEqual(self.bodies(store), [big(n).body for n in range(3, 10)])
        yield self.assertFailure(store.read(handles[1]), KeyError)

    @defer.inlineCallbacks
    def test_a_deleted_chunk_is_unmapped_and_forgotten_once_the_commit_that_deleted_it_is_back(self):
        store, handles = yield self.store_with([big(n) for n in range(7)])
        store = yield self.reopen(store)  # an empty ring cache: reads map the chunk files
        self.assertEqual(self.bodies(store)[:4], [big(n).body for n in range(4)])
        self.assertEqual(mapped_chunks(store), [0, 1, 2])
        for handle in handles[:3]:
            store.ack(JOBS, handle)
        synced = store.sync()
        self.assertEqual(mapped_chunks(store), [0, 1, 2], "the commit is under way: its chunk is still mapped")
        yield synced
        self.assertEqual(chunk_numbers(store), [1, 2])
        self.assertEqual(mapped_chunks(store), [1, 2])
        self.assertEqual((sorted(store.chunk_stats()), store.stats()["chunks"]), ([1, 2], 2))
        yield self.assertFailure(store.read(handles[0]), KeyError)
        record = yield store.read(handles[3])
        self.assertEqual(record.body, big(3).body)

    @defer.inlineCallbacks
    def test_the_chunk_being_written_is_never_deleted(self):
        store, handles = yield self.store_with([big(n) for n in range(10)])
        end = store.stats()["write_position"]
        for handle in handles:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [3])
        store = yield self.reopen(store)
        self.assertEqual((chunk_numbers(store), self.bodies(store)), ([3], []))
        handle = store.append(message(b"next"), [JOBS])
        self.assertEqual(position_of(handle), end, "writing goes on in chunk 3")
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"next"])

    @defer.inlineCallbacks
    def test_a_chunk_consumed_while_it_was_written_is_deleted_once_the_next_chunk_starts(self):
        store, handles = yield self.store_with([big(n) for n in range(3)])
        for handle in handles:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0], "chunk 0 is still being written")
        rolled = store.append(big(3), [JOBS])
        yield store.sync()
        self.assertEqual(store.chunk_of(rolled), 1)
        self.assertEqual(chunk_numbers(store), [1], "chunk 0 is finished and no queue holds any of it")

    @defer.inlineCallbacks
    def test_a_message_for_two_queues_keeps_its_chunk_until_both_ack_it(self):
        store, handles = yield self.store_with([big(n) for n in range(4)], queues=(JOBS, AUDIT))
        for handle in handles[:3]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0, 1])
        for handle in handles[:3]:
            store.ack(AUDIT, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [1])

    @defer.inlineCallbacks
    def test_deleting_a_queue_releases_its_share_of_the_chunks(self):
        store, handles = yield self.store_with([big(n) for n in range(7)], queues=(JOBS, AUDIT))
        for handle in handles[:3]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0, 1, 2], "audit still holds chunk 0")
        store.delete_queue(AUDIT)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [1, 2])
        self.assertFalse(os.path.exists(index_dir(store, AUDIT)))
        store = yield self.reopen(store)
        self.assertEqual((chunk_numbers(store), self.bodies(store)), ([1, 2], [big(n).body for n in range(3, 7)]))


class ChunkedRetentionTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_retain_chunks_keeps_the_newest_consumed_chunks_and_deletes_older_ones(self):
        store, handles = yield self.store_with([big(n) for n in range(10)], retain_chunks="1")
        for handle in handles[:6]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [1, 2, 3], "chunk 1 is the newest consumed one")
        for handle in handles[6:9]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [2, 3])
        store = yield self.reopen(store, retain_chunks="1")
        self.assertEqual(chunk_numbers(store), [2, 3])
        store = yield self.reopen(store)
        self.assertEqual(chunk_numbers(store), [3], "without the option, consumed chunks go at open")

    @defer.inlineCallbacks
    def test_retain_seconds_keeps_consumed_chunks_until_they_are_that_old(self):
        store, handles = yield self.store_with([big(n) for n in range(10)], retain_seconds="3600")
        for handle in handles[:9]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [0, 1, 2, 3])
        two_hours_ago = time.time() - 7200
        os.utime(chunk_path(store, 0), (two_hours_ago, two_hours_ago))
        store.ack(JOBS, handles[9])  # any commit with acks looks again
        yield store.sync()
        self.assertEqual(chunk_numbers(store), [1, 2, 3])
        store = yield self.reopen(store)
        self.assertEqual(chunk_numbers(store), [3])


class ChunkedLookupTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_message_id_is_16_hex_digits_of_its_position_in_the_log(self):
        store, handles = yield self.store_with([message(b"first"), big(1), big(2), big(3), big(4)])
        ids = [store.message_id(handle) for handle in handles]
        self.assertEqual(len(set(ids)), len(ids))
        for handle, text in zip(handles, ids):
            self.assertRegex(text, re.compile(r"\A[0-9a-f]{16}\Z"))
            self.assertEqual(int(text, 16), position_of(handle))
        self.assertEqual(ids[0], "%016x" % 0)
        self.assertEqual(ids[4], "%016x" % DATA, "big(4) starts chunk 1")

    @defer.inlineCallbacks
    def test_lookup_reads_a_message_by_its_id_without_consuming_it(self):
        store, handles = yield self.store_with([message(b"m0"), message(b"m1", colour="red")])
        fresh = store.append(message(b"unsynced"), [JOBS])
        record = yield store.lookup(store.message_id(fresh))
        self.assertEqual(record.body, b"unsynced")
        text = store.message_id(handles[1])
        record = yield store.lookup(text)
        self.assertEqual((record.exchange, record.routing_key, record.body), ("amq.direct", "jobs", b"m1"))
        self.assertEqual(record.properties.message_id, "m1")
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m0", b"m1", b"unsynced"])
        self.assertEqual(store.stats()["chunk_reads"], 3)
        record = yield store.lookup(text)
        self.assertEqual((record.body, store.stats()["chunk_reads"]), (b"m1", 4))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"m0", b"m1", b"unsynced"])

    @defer.inlineCallbacks
    def test_a_malformed_id_fails_with_value_error(self):
        store, _ = yield self.store_with([message(b"m0")])
        for text in ("", "nonsense", "0" * 15, "0" * 17, "g" * 16, None, 12):
            yield self.assertFailure(store.lookup(text), ValueError)

    @defer.inlineCallbacks
    def test_an_id_with_anything_but_hex_digits_fails_with_value_error(self):
        store, _ = yield self.store_with([message(b"m0")])
        for text in ("0x" + "0" * 14, " " + "0" * 15, "-" + "0" * 15, "0_" + "0" * 14, "0" * 8 + "+0000002"):
            yield self.assertFailure(store.lookup(text), ValueError)

    @defer.inlineCallbacks
    def test_an_id_naming_no_message_fails_with_key_error(self):
        store, handles = yield self.store_with([message(b"m0"), message(b"m1")])
        store = yield self.reopen(store)
        end = store.stats()["write_position"]
        position = position_of(handles[1])
        for handle in (end, end + 100, position + 3, 7 * DATA):
            yield self.assertFailure(store.lookup(store.message_id(handle)), KeyError)
        record = yield store.lookup(store.message_id(handles[1]))
        self.assertEqual(record.body, b"m1")

    @defer.inlineCallbacks
    def test_an_id_pointing_inside_a_record_or_into_unused_chunk_space_fails_with_key_error(self):
        store, handles = yield self.store_with([big(n) for n in range(4)])
        store = yield self.reopen(store)
        gap = position_of(handles[2]) + record_bytes(big(2))  # the end of chunk 0 no record fits in
        for position in (position_of(handles[1]) + 1, position_of(handles[1]) + 40, gap):
            yield self.assertFailure(store.lookup(store.message_id(position)), KeyError)


class ChunkedFiguresTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_opening_reads_no_message_and_later_reads_are_counted_per_chunk(self):
        store, handles = yield self.store_with([big(n) for n in range(10)])
        store = yield self.reopen(store)
        self.assertEqual(store.stats()["chunk_reads"], 0)
        self.assertEqual(list(store.recovered_handles(JOBS)), handles)
        self.assertEqual({number: figures["reads"] for number, figures in store.chunk_stats().items()},
                         {0: 0, 1: 0, 2: 0, 3: 0})
        self.assertEqual([store.load(handle).body for handle in handles], [big(n).body for n in range(10)])
        self.assertEqual({number: figures["reads"] for number, figures in store.chunk_stats().items()},
                         {0: 3, 1: 3, 2: 3, 3: 1})
        self.assertEqual(store.stats()["chunk_reads"], 10)

    @defer.inlineCallbacks
    def test_messages_read_back_with_a_shared_head_keep_their_own_bodies_and_properties(self):
        same = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id="same")
        published = [Message("amq.direct", "jobs", same, b"body %d" % n) for n in range(3)]
        published.insert(1, message(b"different", colour="red"))
        store, handles = yield self.store_with(published)
        store = yield self.reopen(store)
        loaded = [store.load(handle) for handle in handles]
        self.assertEqual([m.body for m in loaded], [m.body for m in published])
        self.assertEqual([m.properties for m in loaded], [m.properties for m in published])
        self.assertEqual({(m.exchange, m.routing_key) for m in loaded}, {("amq.direct", "jobs")})

    @defer.inlineCallbacks
    def test_stats_give_the_write_and_flushed_positions_and_the_bytes_on_disk(self):
        store, handles = yield self.store_with([big(n) for n in range(4)])
        end = DATA + record_bytes(big(3))
        stats = store.stats()
        self.assertEqual((stats["append_position"], stats["write_position"], stats["flushed_position"]),
                         (end, end, end))
        self.assertGreater(stats["bytes_on_disk"], 0)
        self.assertLessEqual(stats["bytes_on_disk"], 2 * FILE_SIZE)
        self.assertEqual(stats["chunk_size"], DATA)
        store.append(message(b"buffered"), [JOBS])
        stats = store.stats()
        self.assertEqual((stats["append_position"] > end, stats["write_position"]), (True, end))
        yield store.sync()
        stats = store.stats()
        self.assertEqual(stats["write_position"], stats["append_position"])
        self.assertEqual(stats["flushed_position"], stats["write_position"])

    @defer.inlineCallbacks
    def test_the_cache_hit_ratio_rises_when_a_recently_appended_message_is_loaded(self):
        store, _ = yield self.store_with([message(b"old")])
        store = yield self.reopen(store)
        (recovered,) = store.recovered_handles(JOBS)
        self.assertEqual(store.load(recovered).body, b"old")
        self.assertEqual(store.stats()["cache_hit_ratio"], 0.0, "a recovered message comes from its chunk")
        handle = store.append(message(b"new"), [JOBS])
        yield store.sync()
        yield store.sync()  # the second commit drops the first's batch, written, from the reads in flight
        self.assertEqual(store.load(handle).body, b"new")
        ratio = store.stats()["cache_hit_ratio"]
        self.assertTrue(0.0 < ratio <= 1.0, ratio)
        self.assertEqual((store.stats()["cache_hits"], store.stats()["cache_misses"]), (1, 1))

    @defer.inlineCallbacks
    def test_the_cache_keeps_records_as_bytes_not_as_messages_the_garbage_collector_walks(self):
        # A full cache of small messages as objects made every full collection stop the broker for 100 ms and more.
        store, handles = yield self.store_with([sized("c%04d" % number, 100) for number in range(2000)],
                                               chunk_size=str(1 << 20))
        yield store.sync()  # the second commit drops the first's batch from the reads in flight
        gc.collect()
        alive = [thing for thing in gc.get_objects()
                 if isinstance(thing, Message) and re.fullmatch("c[0-9]{4}", thing.properties.message_id)]
        self.assertEqual(len(alive), 0)
        hits = store.stats()["cache_hits"]
        loaded = store.load(handles[-1])
        self.assertEqual((loaded.properties.message_id, loaded.body), ("c1999", b"c1999".ljust(100, b".")))
        self.assertEqual(store.stats()["cache_hits"], hits + 1, "it came from the cache")


class ChunkedOptionTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_an_existing_store_keeps_its_chunk_size_whatever_the_option_says(self):
        store, handles = yield self.store_with([big(n) for n in range(4)])
        logged = LogWatcher(self)
        store = yield self.reopen(store, chunk_size="8192")
        self.assertEqual(len(logged.matching(store.directory, "4096 bytes each", "keeping that size")), 1)
        self.assertEqual((store.stats()["chunk_size"], store.chunk_capacity), (DATA, DATA))
        self.assertRaises(MessageTooLarge, store.append, sized("huge", 5000), [JOBS])
        handles += [store.append(big(n), [JOBS]) for n in (4, 5, 6)]
        self.assertEqual(store.chunk_of(handles[-1]), 2)
        store = yield self.reopen(store, chunk_size="8192")
        self.assertEqual(self.bodies(store), [big(n).body for n in range(7)])
        self.assertEqual({os.path.getsize(chunk_path(store, n)) for n in chunk_numbers(store)}, {FILE_SIZE})

    @defer.inlineCallbacks
    def test_an_existing_queue_index_keeps_its_index_chunk_size_whatever_the_option_says(self):
        store, handles = yield self.store_with([big(n) for n in range(150)])
        for handle in handles[:70]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(index_chunk_numbers(store, JOBS), [1, 2])
        logged = LogWatcher(self)
        store = yield self.reopen(store, index_chunk_entries="128")
        self.assertEqual(len(logged.matching("('/', 'jobs')", "64 entries each", "keeping that size")), 1)
        self.assertEqual(self.bodies(store), [big(n).body for n in range(70, 150)])
        self.assertEqual(chunk_numbers(store)[0], store.chunk_of(handles[70]), "no chunk it needs was deleted")
        for number in range(150, 200):
            store.append(big(number), [JOBS])
        store = yield self.reopen(store, index_chunk_entries="128")
        self.assertEqual(index_chunk_numbers(store, JOBS), [1, 2, 3])
        self.assertEqual(len(contents(index_chunk_path(store, JOBS, 3))), HEADER_SIZE + ENTRIES * 16)
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [big(n).body for n in range(70, 200)])

    @defer.inlineCallbacks
    def test_a_message_too_large_for_a_chunk_is_refused_naming_the_sizes_and_the_store_goes_on(self):
        store, _ = yield self.store_with([message(b"before")])
        with self.assertRaises(MessageTooLarge) as raised:
            store.append(sized("huge", 5000), [JOBS])
        self.assertIsInstance(raised.exception, ValueError)
        self.assertIn("a message of 5000 bytes does not fit in a chunk of 4096 bytes", str(raised.exception))
        self.assertIn("chunk_size", str(raised.exception))
        largest = filling("largest", DATA)
        self.assertEqual(record_bytes(largest), DATA)
        self.assertRaises(MessageTooLarge, store.append, sized("largest", len(largest.body) + 1), [JOBS])
        handle = store.append(largest, [JOBS])
        self.assertEqual(position_of(handle), DATA, "the largest record fills a chunk of its own")
        after = store.append(message(b"after"), [JOBS])
        self.assertEqual(position_of(after), 2 * DATA)
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [b"before", largest.body, b"after"])
        self.assertEqual(store.stats()["messages"], 3)
