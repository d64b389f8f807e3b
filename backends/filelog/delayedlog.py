"""The filelog store's delayed messages as its writer thread works on them:
the log on disk, its index in memory.

``delayed.dlog`` starts with ``DELAYED_MAGIC`` (which carries the format
version); records follow, framed like a queue file's
(L{backends.filelog.records}): ``[u32 length][payload][u32 CRC]`` where the
payload is ``[0x08][valid flag][u64 due][u64 handle][u16 length][vhost]
[u16 length][exchange name][StoredMessage without valid flag, body last]``.
The CRC covers the payload from its third byte, so a release flips the valid
flag in place, as an ack does in a queue file. Records are appended in handle
order. Once the log holds at least C{compact_min_records} records and fewer
than C{compact_valid_ratio} of them are valid, the valid ones are copied to a
new log that replaces it.

The order by due time is kept in memory only (L{FilelogDelayedMemoryIndex},
at the end of this module), rebuilt by reading the log at open: the valid
records' entries grouped in buckets of due time (C{width} milliseconds each),
each a L{backends.common.sorted_runs.MemoryBucket} of sorted runs, and
a L{HandleMap} that says where each kept handle's record is and when it is
due. That is about 33 bytes per kept message and no object per message; a
window reads only the buckets it spans.

``delayed.meta`` (L{backends.common.delayed_meta}) holds the handle
limit, so that handles keep increasing across restarts whatever was released.

Damage confined to these files leaves the queues working: the delayed calls
then fail with the L{StoreCorrupted} that names the file.
"""

import mmap
import os
import struct
from bisect import bisect_left, insort
from typing import NamedTuple

from google.protobuf.message import DecodeError
from twisted.logger import Logger

from backends.common.delayed_meta import Meta, encode_meta, read_meta
from backends.common.fileio import fsync_directory, replace_file, write_all, write_gathered
from backends.common.handle_map import HandleMap
from backends.common.message_record import record_of_stored
from backends.common.quarantine import unreadable_message
from backends.common.sorted_runs import MemoryBucket, window
from backends.filelog.queuefile import COMPACT_SUFFIX
from backends.filelog.records import (
    ACKED_FLAG,
    FLAG_OFFSET,
    HEADER_SIZE,
    LENGTH,
    OVERHEAD,
    encode,
    find_record,
    frame,
    record_problem,
    record_size,
)
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2

log = Logger()

DELAYED_LOG = "delayed.dlog"
DELAYED_META = "delayed.meta"
DELAYED_MAGIC = b"brokerd filelog delayed 1\n"
META_MAGIC = b"brokerd filelog delayed meta 1\n"
PREFIX = struct.Struct(">QQ")  # due, handle
KEY_LENGTH = struct.Struct(">H")
DUE_OFFSET = HEADER_SIZE + 2  # of the due time, from the start of a record
READ_SIZE = 4096  # bytes read at once for a record; a longer one takes a second read
COPY_SIZE = 1 << 20  # bytes gathered before a compaction writes them


def encode_delayed(message, exchange, due, handle):
    """The payload of a delayed record as C{(head, body)}; C{head + body} is the whole payload."""
    head, body = encode(message)  # the StoredMessage, its valid flag first
    vhost, name = (part.encode("utf-8") for part in exchange)
    prefix = (PREFIX.pack(due, handle) + KEY_LENGTH.pack(len(vhost)) + vhost
              + KEY_LENGTH.pack(len(name)) + name)
    return head[:2] + prefix + head[2:], body


def decode_delayed(payload, where="a delayed record"):
    """
    C{(due, handle, exchange key, MessageRecord)} of a delayed record's
    payload; an L{UnreadableMessage} naming C{where} in place of the
    record if its StoredMessage does not parse.
    """
    due, handle = PREFIX.unpack_from(payload, 2)
    offset = 2 + PREFIX.size
    key = []
    for _ in range(2):
        (length,) = KEY_LENGTH.unpack_from(payload, offset)
        key.append(bytes(payload[offset + 2 : offset + 2 + length]).decode("utf-8"))
        offset += 2 + length
    try:
        record = record_of_stored(messages_pb2.StoredMessage.FromString(bytes(payload[offset:])))
    except DecodeError as problem:
        record = unreadable_message(where, problem)
    return due, handle, tuple(key), record


class FilelogDelayedRecovery(NamedTuple):
    kept: HandleMap  # the kept handles (a set), for the reactor thread
    next_handle: int  # the first handle to give out
    damage: StoreCorrupted | None


class FilelogDelayedLog:
    """The delayed log, its meta file and its in-memory index, under the filelog store's
    directory."""

    def __init__(self, directory, width, compact_min_records, compact_valid_ratio, figures):
        self.path = os.path.join(directory, DELAYED_LOG)
        self.meta_path = os.path.join(directory, DELAYED_META)
        self.width = width
        self.compact_min_records = compact_min_records
        self.compact_valid_ratio = compact_valid_ratio
        self.figures = figures
        self.index = FilelogDelayedMemoryIndex(width)
        self.descriptor = None
        self.size = 0
        self.records = 0  # in the log, valid or released
        self.damage = None
        self._unsynced = False
        self._directory_unsynced = False

    # -- open

    def open(self):
        """Read the meta file and the log back; damage makes the delayed part unusable,
        nothing else."""
        kept, highest = HandleMap(), 0
        try:
            meta = read_meta(self.meta_path, META_MAGIC)
            if os.path.exists(self.path):
                self.descriptor = os.open(self.path, os.O_RDWR)
                highest = self._scan(kept)
        except StoreCorrupted as damage:
            self._damaged(damage)
            return FilelogDelayedRecovery(HandleMap(), 1, damage)
        limit = meta.handle_limit if meta is not None else 1
        self.compact_if_worth_it()
        return FilelogDelayedRecovery(kept, max(limit, highest + 1), None)

    def _scan(self, kept):
        """Index the valid records, cutting off a torn tail; returns the highest handle found."""
        size = os.fstat(self.descriptor).st_size
        if size < len(DELAYED_MAGIC):
            start = os.pread(self.descriptor, size, 0)
            if not DELAYED_MAGIC.startswith(start) and start.strip(b"\0"):
                raise StoreCorrupted(f"delayed log {self.path} does not start with its header",
                                     self.path, 0)
            if size:
                log.warn("delayed log {path}: dropped a torn header of {size} bytes",
                         path=self.path, size=size)
                self._truncate(0)
            return 0
        highest, offset, add, index = 0, len(DELAYED_MAGIC), kept.add, self.index
        with mmap.mmap(self.descriptor, size, access=mmap.ACCESS_READ) as data:
            if data[: len(DELAYED_MAGIC)] != DELAYED_MAGIC:
                raise StoreCorrupted(f"delayed log {self.path} does not start with its header",
                                     self.path, 0)
            while offset < size:
                problem = record_problem(data, offset)
                if problem is not None:
                    if find_record(data, offset + 1) is not None:
                        raise StoreCorrupted(
                            f"delayed log {self.path} is damaged: the record at offset {offset}"
                            f" is bad ({problem}), yet sound records follow it", self.path, offset,
                        )
                    log.warn("delayed log {path}: dropped a torn tail of {dropped} bytes"
                             " at offset {offset} ({reason})",
                             path=self.path, dropped=size - offset, offset=offset, reason=problem)
                    break
                due, handle = PREFIX.unpack_from(data, offset + DUE_OFFSET)
                highest = max(highest, handle)
                if data[offset + FLAG_OFFSET]:
                    index.add(due, handle, offset)
                    add(handle)
                self.records += 1
                offset += record_size(data, offset)
        self.size = size
        if offset < size:
            self._truncate(offset)
        return highest

    def _truncate(self, size):
        os.ftruncate(self.descriptor, size)
        os.fsync(self.descriptor)
        self.size = size
        self.figures.syncs += 1

    def _damaged(self, damage):
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None
        self.index = FilelogDelayedMemoryIndex(self.width)
        self.damage = damage

    # -- commits

    def write(self, lease, delays, releases, fsync):
        """
        Write a batch's part: the handle limit if it moved (C{lease}), the
        records of C{delays} (handle -> (due, exchange, head, body), in handle
        order) with one gathered write, then flip the flags of C{releases}.
        """
        if self.damage is not None:
            if delays:
                raise StoreCorrupted(f"cannot delay messages: {self.damage}", self.damage.path)
            return
        if lease is not None:
            meta = encode_meta(META_MAGIC, Meta(lease, self.width, []))
            self.figures.syncs += replace_file(self.meta_path, meta, sync_directory=fsync)
            self._directory_unsynced = self._directory_unsynced or not fsync
        if delays:
            self._append(delays)
        for handle in releases:
            offset = self.index.release(handle)
            if offset is not None:
                os.pwrite(self.descriptor, ACKED_FLAG, offset + FLAG_OFFSET)
                self._unsynced = True

    def _append(self, delays):
        if self.descriptor is None:
            self.descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            self._directory_unsynced = True
        parts, added, offset = [], [], self.size
        if not offset:
            parts.append(DELAYED_MAGIC)
            offset = len(DELAYED_MAGIC)
        for handle, (due, _, head, body) in delays.items():
            header, trailer = frame(head, body)
            parts += (header, head, body, trailer)
            added.append((due, handle, offset))
            offset += OVERHEAD + len(head) + len(body)
        try:
            self.figures.writes += write_gathered(self.descriptor, parts, self.size)
        except OSError:
            try:
                os.ftruncate(self.descriptor, self.size)
            except OSError:
                pass
            raise
        for due, handle, at in added:
            self.index.add(due, handle, at)
        self.records += len(added)
        self.size = offset
        self._unsynced = True

    def sync(self):
        if self._unsynced and self.descriptor is not None:
            os.fsync(self.descriptor)
            self.figures.syncs += 1
        self._unsynced = False
        if self._directory_unsynced:
            fsync_directory(os.path.dirname(self.path))
            self.figures.syncs += 1
            self._directory_unsynced = False

    # -- compaction

    def compact_if_worth_it(self):
        if (self.damage is None and self.descriptor is not None
                and self.records >= self.compact_min_records
                and len(self.index) < self.compact_valid_ratio * self.records):
            try:
                self._compact()
            except OSError:
                log.failure("compaction of delayed log {path} failed; the log stays as it was",
                            path=self.path)

    def _compact(self):
        """Copy the valid records, in log order, to a new log that replaces this one
        (always durable)."""
        temporary = self.path + COMPACT_SUFFIX
        descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        moved = []  # (handle, new offset)
        try:
            pending, written, size = [DELAYED_MAGIC], 0, len(DELAYED_MAGIC)
            with mmap.mmap(self.descriptor, self.size, access=mmap.ACCESS_READ) as data:
                for handle, (offset, _) in self.index.where.items():
                    length = record_size(data, offset)
                    pending.append(data[offset : offset + length])
                    moved.append((handle, size))
                    size += length
                    if size - written >= COPY_SIZE:
                        write_all(descriptor, b"".join(pending), written)
                        pending, written = [], size
            write_all(descriptor, b"".join(pending), written)
            os.fsync(descriptor)
            os.replace(temporary, self.path)
        except BaseException:
            os.close(descriptor)
            os.unlink(temporary)
            raise
        os.close(self.descriptor)
        log.info("compacted delayed log {path}: {records} records in {old_size} bytes"
                 " to {valid} in {size}", path=self.path, records=self.records,
                 old_size=self.size, valid=len(moved), size=size)
        for handle, offset in moved:
            self.index.relocate(handle, offset)
        self.descriptor, self.size, self.records = descriptor, size, len(moved)
        self._unsynced = False
        fsync_directory(os.path.dirname(self.path))
        self.figures.compactions += 1
        self.figures.syncs += 2

    # -- reads

    def window(self, cursor, until, limit):
        """Up to C{limit} C{(due, handle, exchange key, MessageRecord)} after C{cursor}, due by
        C{until}."""
        if self.damage is not None:
            raise StoreCorrupted(f"delayed messages are unavailable: {self.damage}",
                                 self.damage.path)
        return [decode_delayed(self._read(offset), f"delayed log {self.path}, offset {offset}")
                for _, _, offset in self.index.window(cursor, until, limit)]

    def _read(self, offset):
        record = os.pread(self.descriptor, READ_SIZE, offset)
        if len(record) >= HEADER_SIZE:
            wanted = OVERHEAD + LENGTH.unpack_from(record)[0]
            if wanted > len(record):
                record += os.pread(self.descriptor, wanted - len(record), offset + len(record))
            record = record[:wanted]
        problem = record_problem(record)
        if problem is not None:
            raise StoreCorrupted(f"delayed log {self.path}: the record at offset {offset} reads"
                                 f" back damaged: {problem}", self.path, offset)
        return memoryview(record)[HEADER_SIZE:-LENGTH.size]

    def close(self):
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


class FilelogDelayedMemoryIndex:
    """
    The delayed log's kept records in C{(due, handle)} order, held in memory
    only: their handles, due times and record offsets. Only the writer
    thread touches it.
    """

    def __init__(self, width):
        self.width = width
        self.where = HandleMap(("Q", "Q"))  # handle -> (record offset, due)
        self._buckets = {}  # bucket number -> MemoryBucket of (due, handle)
        self._numbers = []  # bucket numbers, sorted

    def __len__(self):
        return len(self.where)

    def add(self, due, handle, offset):
        self.where.add(handle, offset, due)
        number = due // self.width
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = MemoryBucket()
            insort(self._numbers, number)
        bucket.add(due, handle)

    def release(self, handle):
        """Forget C{handle}; the offset of its record, or None if it was not kept."""
        values = self.where.pop(handle)
        if values is None:
            return None
        offset, due = values
        number = due // self.width
        bucket = self._buckets[number]
        bucket.released += 1
        if bucket.live == 0:
            del self._buckets[number]
            del self._numbers[bisect_left(self._numbers, number)]
        return offset

    def relocate(self, handle, offset):
        """The record of C{handle} moved to C{offset} (a compaction)."""
        values = self.where.get(handle)
        if values is not None:
            self.where.add(handle, offset, values[1])

    def _released(self, handle):
        return handle not in self.where

    def window(self, cursor, until, limit):
        """Up to C{limit} C{(due, handle, offset)} after C{cursor} and due by C{until}, in key
        order."""
        found = []
        numbers, last = self._numbers, until // self.width
        index = 0 if cursor is None else bisect_left(numbers, cursor[0] // self.width)
        while index < len(numbers) and numbers[index] <= last and len(found) < limit:
            runs = self._buckets[numbers[index]].view(self._released)
            found += window(runs, cursor, until, limit - len(found), self._released)
            index += 1
        where = self.where
        return [(due, handle, where.get(handle)[0]) for due, handle in found]
