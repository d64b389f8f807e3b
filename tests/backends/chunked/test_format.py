"""The chunked store's files as bytes: chunk headers and footers, records,
queue index entries, records rolling to the next chunk, and how the last
chunk is taken up again at open."""

import os
import struct
import zlib

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked.format import FOOTER_SIZE, HEADER_SIZE, decode_footer, position_of
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
    index_chunk_path,
    record_bytes,
    sized,
)
from tests.support.logs import LogWatcher
from tests.support.store_contract import AUDIT, JOBS, message, queue_record

# Written out here rather than taken from backends.chunked.format, so that the tests say what the format is.
CHUNK_HEADER = struct.Struct(">16sIIQQQI")  # magic, version, kind, number, global start, data size, CRC
CHUNK_FOOTER = struct.Struct(">16sQQI")  # magic, bytes of records, number of records, CRC
RECORD_HEAD = struct.Struct(">IBI")  # length, kind, head length
RECORD_TAIL = struct.Struct(">II")  # CRC, length
INDEX_ENTRY = struct.Struct("<QII")  # position + 1, body length, CRC of the 12 bytes before


def data_area(store, number):
    return contents(chunk_path(store, number))[HEADER_SIZE : HEADER_SIZE + DATA]


def walk_forwards(area):
    """The (offset, head, body) of each record of a data area, found by the length before each."""
    records, offset = [], 0
    while offset + 4 <= len(area):
        length, kind, head_length = RECORD_HEAD.unpack_from(area, offset)
        if length == 0:
            break
        head = messages_pb2.StoredMessage.FromString(area[offset + 9 : offset + 9 + head_length])
        records.append((offset, head, area[offset + 9 + head_length : offset + 4 + length]))
        offset += 4 + length + RECORD_TAIL.size
    return records


def walk_backwards(area, end):
    """The offsets of the records ending at C{end}, last first, found by the length after each."""
    offsets = []
    while end > 0:
        (length,) = struct.unpack_from(">I", area, end - 4)
        end -= 4 + length + RECORD_TAIL.size
        offsets.append(end)
    return offsets


def index_entry(handle, body_length):
    key = struct.pack("<QI", position_of(handle) + 1, body_length)
    return key + struct.pack("<I", zlib.crc32(key))


class ChunkedFormatTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_chunk_file_starts_with_a_header_naming_its_kind_number_start_and_data_size(self):
        store, _ = yield self.store_with([big(n) for n in range(4)])
        self.assertEqual(chunk_numbers(store), [0, 1])
        for number in (0, 1):
            data = contents(chunk_path(store, number))
            self.assertEqual(len(data), FILE_SIZE)
            magic, version, kind, found, start, data_size, crc = CHUNK_HEADER.unpack_from(data)
            self.assertEqual((magic, version, kind, found, start, data_size),
                             (b"brokerd chunk\0\0\0", 1, 1, number, number * DATA, DATA))
            self.assertEqual(crc, zlib.crc32(data[: CHUNK_HEADER.size - 4]))
            self.assertFalse(any(data[CHUNK_HEADER.size : HEADER_SIZE]), "the rest of the header is zeros")

    @defer.inlineCallbacks
    def test_a_record_is_framed_by_its_length_on_both_sides_and_walks_both_ways(self):
        published = [sized("m%d" % n, n * 37) for n in range(6)] + [message(b"last", colour="red")]
        store, handles = yield self.store_with(published)
        area = data_area(store, 0)
        end = store.stats()["write_position"]
        records = walk_forwards(area)
        self.assertEqual([offset for offset, _, _ in records], [position_of(handle) for handle in handles])
        self.assertEqual(walk_backwards(area, end), [position_of(handle) for handle in reversed(handles)])
        self.assertFalse(any(area[end:]), "unwritten space reads as zeros")
        for (offset, head, body), sent in zip(records, published):
            length, kind, head_length = RECORD_HEAD.unpack_from(area, offset)
            self.assertEqual((kind, length), (1, 5 + head_length + len(sent.body)))
            self.assertEqual((head.exchange, head.routing_key, head.body), ("amq.direct", "jobs", b""))
            self.assertEqual(head.properties, sent.properties)
            self.assertEqual(body, sent.body)
            crc, trailing = RECORD_TAIL.unpack_from(area, offset + 4 + length)
            self.assertEqual((crc, trailing), (zlib.crc32(area[offset + 4 : offset + 4 + length]), length))
            self.assertEqual(4 + length + 8, record_bytes(sent))

    @defer.inlineCallbacks
    def test_a_message_for_two_queues_is_one_record_with_an_entry_in_each_index(self):
        store, (handle,) = yield self.store_with([message(b"shared")], queues=(JOBS, AUDIT))
        self.assertEqual([body for _, _, body in walk_forwards(data_area(store, 0))], [b"shared"])
        for queue in (JOBS, AUDIT):
            entries = contents(index_chunk_path(store, queue, 0))[HEADER_SIZE:]
            self.assertEqual(entries[:16], index_entry(handle, len(b"shared")))
            self.assertFalse(any(entries[16:]))
        self.assertEqual(store.stats()["messages"], 1)

    @defer.inlineCallbacks
    def test_entry_n_of_a_queue_index_is_at_header_plus_16_n_of_its_chunk_with_position_plus_one(self):
        store, handles = yield self.store_with([message(b"m%02d" % n) for n in range(ENTRIES + 6)])
        for number in (0, 1):
            data = contents(index_chunk_path(store, JOBS, number))
            self.assertEqual(len(data), HEADER_SIZE + ENTRIES * 16)
            magic, version, kind, found, start, data_size, crc = CHUNK_HEADER.unpack_from(data)
            self.assertEqual((magic, version, kind, found, start, data_size),
                             (b"brokerd chunk\0\0\0", 1, 2, number, number * ENTRIES, ENTRIES * 16))
            self.assertEqual(crc, zlib.crc32(data[: CHUNK_HEADER.size - 4]))
        self.assertEqual(position_of(handles[0]), 0, "so the first entry holds 1")
        for entry, handle in enumerate(handles):
            number, slot = divmod(entry, ENTRIES)
            data = contents(index_chunk_path(store, JOBS, number))
            offset = HEADER_SIZE + slot * 16
            self.assertEqual(INDEX_ENTRY.unpack_from(data, offset)[:2], (position_of(handle) + 1, 3))
            self.assertEqual(data[offset : offset + 16], index_entry(handle, 3))
        self.assertFalse(any(contents(index_chunk_path(store, JOBS, 1))[HEADER_SIZE + 6 * 16 :]))


class ChunkedRollTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_record_that_does_not_fit_goes_to_the_start_of_the_next_chunk_and_the_chunk_gets_its_footer(self):
        size = record_bytes(big(0))
        self.assertLess(DATA - 3 * size, size)
        store, handles = yield self.store_with([big(n) for n in range(4)])
        self.assertEqual([position_of(handle) for handle in handles], [0, size, 2 * size, DATA])
        self.assertEqual([store.chunk_of(handle) for handle in handles], [0, 0, 0, 1])
        data = contents(chunk_path(store, 0))
        magic, used, records, crc = CHUNK_FOOTER.unpack_from(data, HEADER_SIZE + DATA)
        self.assertEqual((magic, used, records), (b"brokerd chunkend", 3 * size, 3))
        self.assertEqual(crc, zlib.crc32(data[HEADER_SIZE + DATA : HEADER_SIZE + DATA + CHUNK_FOOTER.size - 4]))
        self.assertFalse(any(data[HEADER_SIZE + 3 * size : HEADER_SIZE + DATA]), "the end no record fitted in")
        self.assertFalse(any(data[HEADER_SIZE + DATA + CHUNK_FOOTER.size :]))
        self.assertFalse(any(contents(chunk_path(store, 1))[HEADER_SIZE + DATA :]), "chunk 1 has no footer yet")
        self.assertEqual([body for _, _, body in walk_forwards(data_area(store, 1))], [big(3).body])
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [big(n).body for n in range(4)])

    @defer.inlineCallbacks
    def test_a_record_that_fills_its_chunk_exactly_stays_in_it(self):
        first = big(0)
        fill = filling("fill", DATA - record_bytes(first))
        store, handles = yield self.store_with([first, fill, message(b"next")])
        self.assertEqual([position_of(handle) for handle in handles], [0, record_bytes(first), DATA])
        footer = CHUNK_FOOTER.unpack_from(contents(chunk_path(store, 0)), HEADER_SIZE + DATA)
        self.assertEqual(footer[1:3], (DATA, 2))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [first.body, fill.body, b"next"])


class ChunkedReopenTests(ChunkedStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_the_last_chunk_is_scanned_at_open_and_writing_goes_on_after_its_last_record(self):
        published = [big(n) for n in range(4)] + [message(b"small")]
        store, handles = yield self.store_with(published)
        end = position_of(handles[-1]) + record_bytes(published[-1])
        self.assertEqual(store.stats()["write_position"], end)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual(logged.matching("torn"), [], "a zero-filled tail is the normal end of the last chunk")
        self.assertEqual((store.stats()["write_position"], store.stats()["append_position"]), (end, end))
        self.assertEqual(list(store.recovered_handles(JOBS)), handles)
        added = [store.append(message(b"after%d" % n), [JOBS]) for n in range(2)]
        self.assertEqual(position_of(added[0]), end)
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [m.body for m in published] + [b"after0", b"after1"])
        self.assertEqual(os.path.getsize(chunk_path(store, 1)), FILE_SIZE)
        self.assertIsNone(decode_footer(contents(chunk_path(store, 1))[HEADER_SIZE + DATA :]), "still no footer")

    @defer.inlineCallbacks
    def closed_with_a_finished_last_chunk(self):
        """A closed store whose queue holds m00..m02 in chunk 0, which has its footer and is the last chunk."""
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        handles = [store.append(big(n), [JOBS]) for n in range(3)]
        store.append(big(3), [AUDIT])  # rolls to chunk 1, finishing chunk 0
        store.delete_queue(AUDIT)
        yield store.close()
        os.unlink(chunk_path(store, 1))  # as if a crash came between chunk 0's footer and chunk 1's creation
        return store, handles

    @defer.inlineCallbacks
    def test_a_last_chunk_with_its_footer_is_not_scanned_and_the_next_append_starts_a_chunk(self):
        store, handles = yield self.closed_with_a_finished_last_chunk()
        store = yield self.reopen(store)
        self.assertEqual(store.stats()["write_position"], DATA)
        handle = store.append(message(b"small"), [JOBS])
        self.assertEqual((position_of(handle), store.chunk_of(handle)), (DATA, 1))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [big(n).body for n in range(3)] + [b"small"])

    @defer.inlineCallbacks
    def test_a_last_chunk_whose_footer_is_gone_is_scanned_and_filled_up(self):
        store, handles = yield self.closed_with_a_finished_last_chunk()
        path = chunk_path(store, 0)
        os.truncate(path, HEADER_SIZE + DATA)
        end = 3 * record_bytes(big(0))
        store = yield self.reopen(store)
        self.assertEqual(store.stats()["write_position"], end)
        small = store.append(message(b"small"), [JOBS])
        rolled = store.append(big(4), [JOBS])
        self.assertEqual((position_of(small), position_of(rolled)), (end, DATA))
        yield store.sync()
        footer = CHUNK_FOOTER.unpack_from(contents(path), HEADER_SIZE + DATA)
        self.assertEqual(footer[:3], (b"brokerd chunkend", end + record_bytes(message(b"small")), 4))
        store = yield self.reopen(store)
        self.assertEqual(self.bodies(store), [big(n).body for n in range(3)] + [b"small", big(4).body])
        self.assertEqual(len(contents(path)), HEADER_SIZE + DATA + FOOTER_SIZE)
