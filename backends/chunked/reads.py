"""Reading messages back on the reactor thread: a ring cache of the most recent
ones, and read-only maps of the chunk files for the rest.

The ring cache keeps records (head and body bytes), not message objects: bytes
are nothing the garbage collector walks, whereas a cache full of small
messages held some 250,000 objects and made each full collection stop the
reactor for over 100 ms.

A chunk's file has its full size from the start, so one map serves it while it
is written and after; the reactor reads only below the write position the last
commit handed back, which the writer moves once the bytes are in the file. A
body is copied out of the map once, as bytes (a small record whole, then split);
the head is parsed on its own.
"""

import mmap
import os
from collections import OrderedDict

from backends.chunked.chunkfiles import chunk_path
from backends.chunked.format import HEADER_SIZE, decode_head, position_of, record_at, record_damage
from backends.chunked.readahead import CHECK_AHEAD_BODY
from brokerd.interfaces import MessageRecord

# Bytes a cached record costs beyond its head and body (dict slot, tuple, bytes headers).
CACHE_ENTRY_OVERHEAD = 200
_new_tuple = tuple.__new__
HEAD_CACHE_ENTRIES = 256  # distinct message heads (exchange, routing key, properties) remembered


class RingCache:
    """The records (head, body) of the most recently appended messages, up to a byte budget,
    oldest dropped first."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._records = OrderedDict()  # handle -> (head, body)

    def put(self, handle, head, body):
        if self.capacity <= 0:
            return
        self._records[handle] = (head, body)
        self.size += len(head) + len(body) + CACHE_ENTRY_OVERHEAD
        while self.size > self.capacity:
            _, (old_head, old_body) = self._records.popitem(last=False)
            self.size -= len(old_head) + len(old_body) + CACHE_ENTRY_OVERHEAD

    def get(self, handle):
        """The C{(head, body)} of C{handle}, or None."""
        record = self._records.get(handle)
        if record is None:
            self.misses += 1
        else:
            self.hits += 1
        return record

    @property
    def hit_ratio(self):
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def clear(self):
        self._records.clear()
        self.size = 0


class HeadCache:
    """
    Messages read back mostly share their exchange, routing key and
    properties: the head of each distinct kind is parsed once, and its
    messages share one (read-only) properties object, which also lets a
    protocol adapter reuse what it encoded for the last one.
    """

    def __init__(self, capacity=HEAD_CACHE_ENTRIES):
        self.capacity = capacity
        self._kinds = {}  # head bytes -> (exchange, routing key, properties, published_at)

    def message(self, head, body):
        kind = self._kinds.get(head)
        if kind is None:
            if len(self._kinds) >= self.capacity:
                self._kinds.clear()
            stored = decode_head(head)
            published = stored.published_at if stored.HasField("published_at") else None
            kind = self._kinds[head] = (stored.exchange, stored.routing_key, stored.properties,
                                        published)
        exchange, routing_key, properties, published = kind
        # Half a namedtuple's call.
        return _new_tuple(MessageRecord, (exchange, routing_key, properties, body, published))


class ChunkReader:
    """
    Read-only maps of message chunk files, opened on first read, closed when
    the chunk goes. The reactor thread owns it: the store tells it the data
    size the files have at open and, as each commit's result comes back, up
    to where records are in the files and which chunks are gone.

    @ivar written: records below this position are in the files.
    @ivar reads: chunk number -> records read from it.
    """

    def __init__(self, directory, data_size, read_ahead=None):
        self.directory = directory
        self.data_size = data_size
        self.written = 0
        self.read_ahead = read_ahead  # a ReadAhead, or None
        self._maps = {}  # chunk number -> mmap
        self._heads = HeadCache()
        self.reads = {}  # chunk number -> records read

    def opened(self, data_size, written):
        """The store opened: its chunks' data size, and the position records are written up to."""
        self.data_size = data_size
        self.written = written

    def follow(self, written, deleted_chunks):
        """A commit wrote records up to position C{written} and deleted the chunks numbered
        C{deleted_chunks}."""
        self.written = written
        for number in deleted_chunks:
            self.forget(number)

    def read(self, handle):
        """
        The message stored at C{handle}.

        @raise KeyError: if the handle names no record (never written, or in
            a chunk deleted since).
        @raise StoreCorrupted: if the record there is damaged.
        @raise DecodeError: if the record is whole but its head does not parse.
        """
        head, body = self.record(handle)
        return self._heads.message(head, body)

    def record(self, handle):
        """
        The C{(head, body)} bytes of the record at C{handle}, checked.

        @raise KeyError: as L{read}.
        @raise StoreCorrupted: as L{read}.
        """
        position = position_of(handle)
        data_size = self.data_size
        number, offset = divmod(position, data_size)
        if position >= self.written:
            raise KeyError(f"the chunked store holds no message with handle {handle!r}")
        chunk = self._maps.get(number)
        if chunk is None:
            chunk = self._map(number, handle)
        offset += HEADER_SIZE
        read_ahead = self.read_ahead
        if read_ahead is None:
            parts = record_at(chunk, offset, HEADER_SIZE + data_size)
        else:
            checked = read_ahead.checked.get(number)
            parts = record_at(chunk, offset, HEADER_SIZE + data_size,
                              checked is not None and checked[0] <= offset < checked[1])
            if (parts is not None
                    and offset + read_ahead.half >= read_ahead.requested.get(number, 0)):
                written_end = HEADER_SIZE + min(data_size, self.written - number * data_size)
                read_ahead.ahead(number, offset, written_end,
                                 check=len(parts[1]) >= CHECK_AHEAD_BODY)
        if parts is None:
            raise record_damage(chunk, offset, HEADER_SIZE + data_size,
                                chunk_path(self.directory, number), offset)
        reads = self.reads
        reads[number] = reads.get(number, 0) + 1
        return parts

    def where(self, handle):
        """Where the record of C{handle} is, in words: its chunk file and data offset."""
        number, offset = divmod(position_of(handle), self.data_size)
        return f"chunk {chunk_path(self.directory, number)}, data offset {offset}"

    def message(self, head, body):
        """The message of a record already in memory (the ring cache's)."""
        return self._heads.message(head, body)

    def _map(self, number, handle):
        try:
            descriptor = os.open(chunk_path(self.directory, number), os.O_RDONLY)
        except FileNotFoundError:
            raise KeyError(f"the chunked store holds no message with handle {handle!r}"
                           " (its chunk is gone)") from None
        try:
            chunk = self._maps[number] = mmap.mmap(descriptor, 0, prot=mmap.PROT_READ)
            if hasattr(chunk, "madvise"):
                # Queues are mostly read in log order: read ahead far.
                chunk.madvise(mmap.MADV_SEQUENTIAL)
        finally:
            os.close(descriptor)
        return chunk

    def forget(self, number):
        """Chunk C{number} was deleted: drop its map."""
        if self.read_ahead is not None:
            self.read_ahead.forget(number)
        chunk = self._maps.pop(number, None)
        if chunk is not None:
            chunk.close()

    def close(self):
        for number in list(self._maps):
            self.forget(number)
        if self.read_ahead is not None:
            self.read_ahead.close()
