"""The paging contract over the chunked store, and what only chunks can do: logs past 4 GiB, records too big
for a chunk, chunk files lost or missing."""

import os

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked import backend
from backends.chunked.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    MESSAGE_CHUNK,
    RECORD_TAIL,
    encode_header,
    position_of,
    record_size,
)
from backends.common.message_heads import encode_head
from brokerd.errors import PreconditionFailed
from brokerd.model.message import Message
from tests.support.broker import open_channel
from tests.support.paging_contract import DEEP, SIZE, PagingContract, body, props


def chunk_path(store, number):
    return chunk_path_in(os.path.dirname(store.directory), number)


def chunk_path_in(data_dir, number):
    return os.path.join(data_dir, "chunked", "message-chunk-%09d" % number)


class ChunkedPaging(PagingContract, unittest.TestCase):
    backend = backend
    options = {"chunk_size": "65536", "index_chunk_entries": "4096"}
    no_cache_options = {"cache_size": "0"}
    file_reads_stat = "chunk_reads"
    damage_text = "CRC mismatch"

    def damage_record(self, store, handle, number):
        """Invert the last body byte of message C{number}'s record so that its CRC fails."""
        head = encode_head(Message("", "jobs", props(number), body(number)))
        chunk, offset = divmod(position_of(handle), store.chunk_capacity)
        at = HEADER_SIZE + offset + record_size(head, SIZE) - RECORD_TAIL.size - 1
        with open(chunk_path(store, chunk), "r+b") as opened:
            opened.seek(at)
            byte = opened.read(1)
            opened.seek(at)
            opened.write(bytes([byte[0] ^ 0xFF]))

    @defer.inlineCallbacks
    def test_a_log_past_4_gib_pages_and_recovers_as_any_other(self):
        # Positions (handles) past 2**32 once overflowed the handle arrays. A log that has
        # written 8 GiB is made by starting it at a chunk that far in (its file is sparse).
        far = (8 << 30) // 65536
        os.makedirs(os.path.join(self.data_dir, "chunked"))
        with open(chunk_path_in(self.data_dir, far), "wb") as chunk:
            chunk.write(encode_header(MESSAGE_CHUNK, far, far * 65536, 65536))
            chunk.truncate(HEADER_SIZE + 65536 + FOOTER_SIZE)
        broker, _, channel, _ = yield self.started()
        self.publish(channel, range(DEEP))
        self.assertGreater(position_of(max(self.queue(broker)._ready.handles())), 1 << 33)
        broker, _, counts = yield self.restarted()
        self.assertEqual(counts["messages"], DEEP)
        channel, _ = open_channel(broker)
        self.assertEqual(self.get_all(channel), [(n, True) for n in range(DEEP)])

    @defer.inlineCallbacks
    def test_a_message_too_big_for_a_chunk_closes_its_channel_with_406_and_the_queue_goes_on(self):
        broker, _, channel, _ = yield self.started()
        with self.assertRaises(PreconditionFailed) as raised:
            channel.basic_publish("", "jobs", props(0), b"x" * 70000)
        self.assertIn("does not fit in a chunk of 65536 bytes", str(raised.exception))
        channel, _ = open_channel(broker)
        self.publish(channel, [1])
        self.assertEqual(self.get_all(channel), [(1, False)])

    @defer.inlineCallbacks
    def test_a_chunk_lost_while_running_stops_a_consumer_and_leaves_other_queues_serving(self):
        yield self.published()
        broker, clock, counts = yield self.recovered()
        self.assertEqual((counts["messages"], counts["unavailable"]), (3003, 0))
        os.remove(chunk_path(self.store, 0))  # under a running broker, before anything was read from it
        channel, peer = open_channel(broker)
        channel.basic_consume("jobs", "c", no_ack=True)
        clock.advance(0)
        self.assertEqual(peer.deliveries, [])
        self.assertEqual(peer.cancelled, ["c"], "the broker cancels consumers of a queue it can no longer read")
        self.assertIn("chunk is gone", self.queue(broker).unavailable)
        self.assertEqual((self.queue(broker).message_count, broker.watermark.queued_bytes), (3000, 0))
        self.assert_unavailable(broker, channel)

    @defer.inlineCallbacks
    def test_a_chunk_missing_at_start_makes_its_queue_unavailable_at_once(self):
        store, _ = yield self.published()
        os.remove(chunk_path(store, 0))
        broker, _, counts = yield self.recovered()
        self.assertEqual((counts["messages"], counts["unavailable"]), (3, 1))
        self.assert_unavailable(broker, open_channel(broker)[0])

