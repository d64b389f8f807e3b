"""Reading messages back from the queue files on the reactor thread.

The reactor thread keeps, per queue file, a descriptor of its own and where
each message record the writer thread reported is (a L{QueueReader}: two
arrays, 16 bytes a record, nothing per message beyond them); a load reads the
record with C{os.pread}, together with the records that follow it (a run of
up to C{READ_AHEAD_BYTES}), and keeps the runs it read within a byte budget,
as a queue's messages are mostly loaded in queue order. A record's CRC is
checked as it is read back: damage makes the queue unavailable; a record
intact but unparsable is quarantined by the broker.

A compaction replaces a file: until the commit's result hands the reactor
thread the new file's index and descriptor, it reads the old file through its
old descriptor (the inode outlives the rename), so it never reads an offset of
one file in the other.

A handle names the queues its message was appended to by the route number in
its low bits (L{Routes}), so that a load, which names no queue, finds the
files that hold a copy without a per-message table.
"""

import os
from bisect import bisect_left, bisect_right
from collections import OrderedDict

from google.protobuf.message import DecodeError

from backends.common.checksum import crc32
from backends.common.message_record import record_of_stored
from backends.common.quarantine import read_varint, unreadable_message
from backends.filelog.writer import ROUTE_BITS
from backends.filelog.records import (
    BODY_TAG,
    HEADER_SIZE,
    LENGTH,
    OVERHEAD,
    TRAILER_SIZE,
    VALID_TAG,
)
from brokerd.interfaces import MessageRecord, StoreCorrupted
from brokerd.proto import messages_pb2

ROUTE_MASK = (1 << ROUTE_BITS) - 1
# One load reads the records following its own up to about this many bytes.
READ_AHEAD_BYTES = 256 << 10
RUNS_CACHED = 8  # ... or an eighth of the cache, so that the runs of several queues fit in it
# Distinct message heads (exchange, routing key, properties) a reader recognises without parsing.
KNOWN_HEADS = 8
_new_tuple = tuple.__new__
_body_tag = BODY_TAG[0]


class Routes:
    """
    The sets of queues messages were appended to, each numbered: a handle
    is C{sequence << ROUTE_BITS | route}. Route 0 means "any queue": once
    the numbers run out, a handle of route 0 is looked for in every file.
    """

    def __init__(self):
        self._queues = [()]  # route number -> tuple of queue keys
        self._numbers = {}  # tuple of queue keys -> route number
        self._single = {}  # queue key -> number of the route of that queue alone

    def number_recovered(self, queues):
        """Number the routes anew from the durable queues open found, each alone, in order:
        queue i's is i + 1."""
        self._queues, self._numbers, self._single = [()], {}, {}
        for queue in queues:
            self.single(queue)

    def single(self, queue):
        """The route of messages appended to C{queue} alone."""
        number = self._single.get(queue)
        if number is None:
            number = self._single[queue] = self.number((queue,))
        return number

    def number(self, queues):
        """The route of messages appended to the tuple of queue keys C{queues}."""
        number = self._numbers.get(queues)
        if number is None:
            if len(self._queues) > ROUTE_MASK:
                return 0
            number = self._numbers[queues] = len(self._queues)
            self._queues.append(queues)
        return number

    def queues(self, handle):
        """The queue keys of C{handle}'s route, or None for route 0 (any)."""
        number = handle & ROUTE_MASK
        if not number:
            return None
        try:
            return self._queues[number]
        except IndexError:
            raise KeyError(f"the filelog store holds no message with handle {handle!r}") from None


class QueueReader:
    """
    One queue file as the reactor thread reads it: a descriptor of its own,
    and the handle and offset of every message record the writer reported
    (valid ones, and acked ones until the file is compacted).
    """

    __slots__ = ("queue", "descriptor", "handles", "offsets", "size", "cursor", "run")

    def __init__(self, queue, update):
        self.queue = queue
        self.descriptor = update.descriptor
        self.handles = update.handles
        self.offsets = update.offsets
        self.size = update.size
        self.cursor = 0  # the row after the last one read: where the next load most likely is
        self.run = None  # the Run last read from the file, while it is kept

    def take(self, update):
        """What a commit reported: more records, or (with a descriptor) the file replaced whole."""
        if update.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = update.descriptor
            self.handles, self.offsets = update.handles, update.offsets
            self.cursor = 0
            self.run = None
        else:
            self.handles += update.handles
            self.offsets += update.offsets
        self.size = update.size

    def row(self, handle):
        """The row of C{handle}'s record, or None."""
        handles = self.handles
        row = self.cursor
        if row >= len(handles) or handles[row] != handle:
            row = bisect_left(handles, handle)
            if row >= len(handles) or handles[row] != handle:
                return None
        self.cursor = row + 1
        return row

    def close(self):
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


class Run:
    """Bytes of a queue file read at once: the records from C{start} to C{end} (whole ones)."""

    __slots__ = ("start", "end", "data")

    def __init__(self, start, data):
        self.start = start
        self.end = start + len(data)
        self.data = data


class FileReads:
    """
    The queue files' readers, the runs read ahead (at most one a queue, all
    within C{cache_size} bytes) and what it takes to turn a record into a
    L{MessageRecord}.

    @ivar routes: the store's L{Routes}, which say what files a handle's
        message is in (numbered by the store as it appends).
    @ivar records_read: messages read back from the files.
    @ivar read_calls: preads made for them.
    """

    def __init__(self, path_of, cache_size, routes):
        self._path_of = path_of  # queue key -> path of its file, for messages about it
        self.cache_size = cache_size
        self.run_bytes = min(READ_AHEAD_BYTES, cache_size // RUNS_CACHED)
        self.readers = {}  # queue key -> QueueReader
        self.routes = routes
        # queue key -> QueueReader whose run is kept, least recently read first
        self._kept = OrderedDict()
        self.cache_bytes = 0
        # (head bytes from after the valid flag to the body's tag, its fields), latest first
        self._heads = []
        # route number -> the readers of its queues, made again when readers change
        self._route_readers = {}
        self.records_read = 0
        self.read_calls = 0

    def take(self, queue, update):
        """A L{QueueUpdate} the writer thread handed over for C{queue}'s file."""
        reader = self.readers.get(queue)
        if reader is None:
            self.readers[queue] = QueueReader(queue, update)
            self._route_readers.clear()
            return
        if update.descriptor is not None:
            self._drop_run(reader)
        reader.take(update)

    def forget(self, queue):
        """C{queue}'s file is deleted or damaged: close its reader."""
        reader = self.readers.pop(queue, None)
        if reader is not None:
            self._route_readers.clear()
            self._drop_run(reader)
            reader.close()

    def _drop_run(self, reader):
        if self._kept.pop(reader.queue, None) is not None:
            self.cache_bytes -= len(reader.run.data)
        reader.run = None

    def close(self):
        for queue in list(self.readers):
            self.forget(queue)

    # -- loads

    def load(self, handle):
        """
        The L{MessageRecord} of C{handle} from the first file of its route that indexes it.

        @raise KeyError: if none does.
        @raise StoreCorrupted: if its record is damaged (the exception's
            C{queue} names the queue whose file it is).
        @raise UnreadableMessage: if its record is whole but does not parse.
        """
        readers = self._route_readers.get(handle & ROUTE_MASK)
        if readers is None:
            readers = self._readers_of(handle)
        for reader in readers:
            handles = reader.handles
            row = reader.cursor
            if row >= len(handles) or handles[row] != handle:
                row = bisect_left(handles, handle)
                if row >= len(handles) or handles[row] != handle:
                    continue
            reader.cursor = row + 1
            offset = reader.offsets[row]
            run = reader.run
            if run is None or not run.start <= offset < run.end:
                run = self._read_run(reader, row)
            data = run.data
            at = offset - run.start
            length = LENGTH.unpack_from(data, at)[0] if at + OVERHEAD <= len(data) else -1
            end = at + OVERHEAD + length
            if length < 2 or end > len(data) or data[at + HEADER_SIZE] != VALID_TAG:
                raise self._damaged(reader.queue, offset,
                                    "it is not a whole record where the index has one")
            end -= TRAILER_SIZE
            if (crc32(memoryview(data)[at + HEADER_SIZE + 2 : end])
                    != LENGTH.unpack_from(data, end)[0]):
                raise self._damaged(reader.queue, offset, "its CRC does not match")
            self.records_read += 1
            start = at + HEADER_SIZE
            for head, exchange, routing_key, properties, published_at in self._heads:
                # A head seen lately: only the body is copied out.
                if data.startswith(head, start + 2):
                    at = start + 2 + len(head)
                    size = data[at] if at < end else 0x80
                    if size < 0x80:
                        at += 1
                    else:
                        try:
                            size, at = read_varint(data, at, end)
                        except ValueError:
                            size = -1
                    if at + size == end:
                        return _new_tuple(MessageRecord, (exchange, routing_key, properties,
                                                          data[at:end], published_at))
                    break
            return self._parsed(data, start, end, reader.queue, offset)
        raise KeyError(f"the filelog store holds no message with handle {handle!r}")

    def _readers_of(self, handle):
        """The readers of the files of C{handle}'s route, remembered until readers come or go."""
        queues = self.routes.queues(handle)
        readers = self.readers
        found = tuple(readers.values()) if queues is None else tuple(
            readers[queue] for queue in queues if queue in readers)
        self._route_readers[handle & ROUTE_MASK] = found
        return found

    def _read_run(self, reader, row):
        """Read the record at C{row} and the whole records after it within C{run_bytes};
        keep them if they fit."""
        offsets = reader.offsets
        start = offsets[row]
        following = max(bisect_right(offsets, start + self.run_bytes, row + 1) - 1, row + 1)
        end = offsets[following] if following < len(offsets) else reader.size
        data = os.pread(reader.descriptor, end - start, start)
        self.read_calls += 1
        if len(data) < end - start:
            raise self._damaged(reader.queue, start + len(data),
                                f"the file ends {end - start - len(data)} bytes early")
        run = Run(start, data)
        self._drop_run(reader)
        if len(data) <= self.cache_size:
            reader.run = run
            kept = self._kept
            kept[reader.queue] = reader
            self.cache_bytes += len(data)
            while self.cache_bytes > self.cache_size:
                _, old = kept.popitem(last=False)
                self.cache_bytes -= len(old.run.data)
                old.run = None
        return run

    def _parsed(self, data, start, end, queue, offset):
        """
        The L{MessageRecord} of the StoredMessage at C{data[start:end]},
        parsed whole; its head is remembered, so that the next messages with
        the same exchange, routing key and properties are made without parsing
        (copying out their body alone, sharing the properties).
        """
        try:
            stored = messages_pb2.StoredMessage.FromString(data[start:end])
        except DecodeError as problem:
            raise unreadable_message(f"queue file {self._path_of(queue)}, offset {offset}",
                                     problem) from None
        record = record_of_stored(stored)
        self._learn_head(data, start, end, record)
        return record

    def _learn_head(self, data, start, end, record):
        """Remember the head of a record parsed whole if its body is its last field
        (as the store writes it)."""
        size = len(record.body)
        if not size:
            return
        length = bytearray()
        value = size
        while value > 0x7F:
            length.append(value & 0x7F | 0x80)
            value >>= 7
        length.append(value)
        tag_at = end - size - len(length) - 1
        if (tag_at < start + 2 or data[tag_at] != _body_tag
                or data[tag_at + 1 : end - size] != length):
            return
        heads = self._heads
        heads.insert(0, (data[start + 2 : tag_at + 1], *record[:3], record.published_at))
        del heads[KNOWN_HEADS:]

    def _damaged(self, queue, offset, reason):
        path = self._path_of(queue)
        damage = StoreCorrupted(f"queue file {path}: the record at offset {offset} reads back"
                                f" damaged: {reason}", path, offset)
        damage.queue = queue
        return damage
