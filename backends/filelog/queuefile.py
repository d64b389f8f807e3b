"""One queue's data file on the writer thread: recovered, appended to, acked in place, compacted.

Only the store's writer thread touches a L{QueueFile}. The file holds a header
naming its queue, then records (see L{backends.filelog.records}). The object
keeps an index of the file's message records in arrays, not objects (handle,
offset, size and whether it is still valid: 21 bytes a record), which is what
an ack (flip the valid byte), a delivery count and a compaction need. Opening
a file reads no message: L{backends.filelog.records.walk} finds the records
by their framing. The reactor thread reads the messages back on its own
(L{backends.filelog.reads}): L{QueueFile.report} gives it what it has not
seen of the index yet, with a descriptor of its own whenever the file is new
or was replaced by a compaction.
"""

import mmap
import os
from array import array
from bisect import bisect_left
from itertools import accumulate, compress
from typing import NamedTuple

from twisted.logger import Logger

from backends.common.fileio import fsync_directory, queue_key_name, write_all, write_gathered
from backends.filelog.records import (
    ACKED_FLAG,
    FLAG_OFFSET,
    OVERHEAD,
    TAIL_CHECK_BYTES,
    decode_returns,
    encode_returns,
    file_header,
    find_record,
    frame,
    walk,
)
from brokerd.interfaces import StoreCorrupted

log = Logger()

DATA_SUFFIX = ".qlog"
COMPACT_SUFFIX = ".compact"
COMPACTION_WRITE_SIZE = 1 << 20


def queue_file_name(queue):
    """The data file name of a queue key C{(vhost, name)} (see L{queue_key_name})."""
    return queue_key_name(queue) + DATA_SUFFIX


class QueueUpdate(NamedTuple):
    """
    What the reactor thread learns of one queue file after a commit (or at
    open): where the message records it has not been told of yet are.

    @ivar handles: their handles, in file order (an array of its own).
    @ivar offsets: their offsets (an array of its own).
    @ivar size: the file's size.
    @ivar descriptor: None if the records follow those reported before, in
        the same file; else the file is new or was replaced, C{handles} and
        C{offsets} cover it whole, and this is a descriptor of it for reads,
        the receiver's to close.
    """

    handles: array
    offsets: array
    size: int
    descriptor: int | None


class QueueFile:
    """
    One queue's data file and the index of its message records.

    @ivar handles: the handle of each indexed record, in file order (so in
        increasing order); with C{offsets}, C{sizes} and C{valid}, one row
        per record: every valid record, and those acked since the file was
        opened or compacted.
    @ivar records: how many records the file holds, valid, acked or of delivery counts.
    @ivar held: how many rows are valid.
    @ivar delivery_counts: handle -> how often its message came back to the
        queue unacked, for valid records that came back at least once.
    @ivar damage: the L{StoreCorrupted} found in the file, if any; a damaged
        file is closed and left as it is until its queue is deleted.
    """

    def __init__(self, queue, path, descriptor, figures):
        self.queue = queue
        self.path = path
        self.descriptor = descriptor
        self.figures = figures
        self.size = 0
        self.records = 0
        self.handles = array("Q")
        self.offsets = array("Q")
        self.sizes = array("I")
        self.valid = bytearray()
        self.held = 0
        self.delivery_counts = {}
        self.damage = None
        self._cursor = 0  # the row after the last one acked: where the next ack most likely is
        self._reported = 0  # rows the reactor thread has been told of
        self._renewed = True  # the reactor thread must be given the whole index and a descriptor

    @classmethod
    def create(cls, queue, path, figures):
        """A new, empty file. O_TRUNC: a file of a queue of the same name that the
        topology no longer holds (ignored at open) must not lend it its messages."""
        return cls(queue, path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644), figures)

    # -- recovery

    def recover(self, first_handle, step):
        """
        Index the file's valid records by their framing alone, cutting off a
        torn header or tail; no message is parsed (a record whole but
        unparsable is found when it is read back).

        @param first_handle: the handle of the first valid record; each next
            one's is C{step} higher.
        @return: how many valid records the file holds.
        @raise StoreCorrupted: if the file is damaged before its end or is not
            this queue's; the file is then marked damaged and left untouched.
        """
        framing = self._sound_records()
        if framing is None:
            return 0
        count = len(framing.offsets)
        self.handles = array("Q", range(first_handle, first_handle + count * step, step))
        self.offsets, self.sizes = framing.offsets, framing.sizes
        self.valid = bytearray(b"\x01") * count
        self.held = count
        self.records = framing.records
        counts = {}
        for offset, payload in framing.counts:
            try:
                counts.update(decode_returns(payload))
            except ValueError as problem:
                raise self._damaged(f"the record at offset {offset}: {problem}", offset) from None
        for offset, delivered in counts.items():
            row = bisect_left(self.offsets, offset)
            if delivered and row < count and self.offsets[row] == offset:
                self.delivery_counts[self.handles[row]] = delivered
        self.figures.file_bytes += self.size
        self.figures.held += count
        self.figures.held_bytes += sum(self.sizes)
        return count

    def _sound_records(self):
        """The L{Framing} of the file's sound records (None if it holds none), its torn tail cut
        off."""
        header = file_header(self.queue)
        size = os.fstat(self.descriptor).st_size
        if size < len(header):
            self._drop_torn_header(header, size)
            return None
        with mmap.mmap(self.descriptor, size, access=mmap.ACCESS_READ) as data:
            if data[: len(header)] != header:
                raise self._damaged(f"it does not start with the header of {self.queue!r}", 0)
            framing = walk(data, len(header), size - TAIL_CHECK_BYTES)
            torn = framing.problem is not None and find_record(data, framing.end + 1) is None
        self.size = size
        if framing.problem is None:
            return framing
        if not torn:
            raise self._damaged(
                f"the record at offset {framing.end} is bad ({framing.problem}), yet sound records"
                f" follow it ({size - framing.end} bytes from there on)",
                framing.end,
            )
        log.warn(
            "queue file {path}: dropped a torn tail of {dropped} bytes at offset {offset}"
            " ({reason})",
            path=self.path, dropped=size - framing.end, offset=framing.end, reason=framing.problem,
        )
        self._truncate(framing.end)
        return framing

    def _drop_torn_header(self, header, size):
        """A file too short for its header holds no message: if what it holds is
        the start of its header (or zeros), its creation was cut short; empty it."""
        if not size:
            return
        start = os.pread(self.descriptor, size, 0)
        if not header.startswith(start) and start.strip(b"\0"):
            raise self._damaged(f"it does not start with the header of {self.queue!r}", 0)
        log.warn("queue file {path}: dropped a torn header of {size} bytes",
                 path=self.path, size=size)
        self._truncate(0)

    def _truncate(self, size):
        os.ftruncate(self.descriptor, size)
        os.fsync(self.descriptor)
        self.size = size
        self.figures.syncs += 1

    def _damaged(self, reason, offset):
        self.mark_damaged(StoreCorrupted(f"queue file {self.path} is damaged: {reason}",
                                         self.path, offset))
        return self.damage

    def mark_damaged(self, damage):
        """Leave the file alone from now on (found damaged at open, or when a record was read
        back)."""
        self.close()
        self.damage = damage

    # -- writes

    def append(self, handles, payloads, framings):
        """
        Append the records of C{handles} with one gathered write (after the
        header, if the file is empty).

        @param payloads: handle -> encoded StoredMessage as C{(head, body, ...)}.
        @param framings: handle -> (header, trailer), shared by the files a
            message goes to so its CRC is computed once; filled in here.
        """
        if self.damage is not None:
            raise StoreCorrupted(f"cannot append to {self.path}: {self.damage}", self.path)
        parts, offset, rows = [], self.size, len(self.handles)
        if not offset:
            parts.append(file_header(self.queue))
            offset = len(parts[0])
        add_handle, add_offset = self.handles.append, self.offsets.append
        add_size = self.sizes.append
        for handle in handles:
            head, body = payloads[handle][:2]
            framing = framings.get(handle)
            if framing is None:
                framing = framings[handle] = frame(head, body)
            parts += (framing[0], head, body, framing[1])
            size = OVERHEAD + len(head) + len(body)
            add_handle(handle)
            add_offset(offset)
            add_size(size)
            offset += size
        try:
            self.figures.writes += write_gathered(self.descriptor, parts, self.size)
        except OSError:
            self._cut_failed_append()
            del self.handles[rows:], self.offsets[rows:], self.sizes[rows:]
            raise
        added = len(self.handles) - rows
        self.valid += b"\x01" * added
        self.held += added
        self.figures.held += added
        self.figures.held_bytes += offset - self.size - (len(parts[0]) if not self.size else 0)
        self.figures.file_bytes += offset - self.size
        self.records += added
        self.size = offset

    def _row(self, handle):
        """The row of C{handle}, or None if the file indexes no record of it."""
        handles = self.handles
        row = self._cursor
        if row >= len(handles) or handles[row] != handle:
            row = bisect_left(handles, handle)
            if row >= len(handles) or handles[row] != handle:
                return None
        self._cursor = row + 1
        return row

    def returned(self, counts):
        """
        Keep the delivery counts of C{counts} (handle -> count) whose records
        the file holds valid: one record of counts appended, naming the
        message records by offset.
        """
        if self.damage is not None:
            return False
        kept = {}
        for handle, count in counts.items():
            row = self._row(handle)
            if row is not None and self.valid[row]:
                kept[handle] = (self.offsets[row], count)
        if not kept:
            return False
        self.delivery_counts.update((handle, count) for handle, (_, count) in kept.items())
        self._append_counts(dict(kept.values()))
        return True

    def _append_counts(self, counts):
        parts = self._counts_record(counts)
        try:
            self.figures.writes += write_gathered(self.descriptor, parts, self.size)
        except OSError:
            self._cut_failed_append()
            raise
        size = sum(map(len, parts))
        self.figures.file_bytes += size
        self.records += 1
        self.size += size

    def _cut_failed_append(self):
        """Cut off whatever part of a failed append reached the file, so no half
        record sits before the next append; the failure itself is what matters."""
        try:
            os.ftruncate(self.descriptor, self.size)
        except OSError:
            pass

    def ack(self, handles):
        """Flip the valid byte of each record of C{handles} the file holds valid;
        returns how many it flipped."""
        if self.damage is not None:
            return 0
        flipped = flipped_bytes = 0
        valid, offsets, descriptor = self.valid, self.offsets, self.descriptor
        for handle in handles:
            row = self._row(handle)
            if row is not None and valid[row]:
                valid[row] = 0
                flipped += 1
                flipped_bytes += self.sizes[row]
                if self.delivery_counts:
                    self.delivery_counts.pop(handle, None)
                os.pwrite(descriptor, ACKED_FLAG, offsets[row] + FLAG_OFFSET)
        self.held -= flipped
        self.figures.held -= flipped
        self.figures.held_bytes -= flipped_bytes
        return flipped

    def fsync(self):
        os.fsync(self.descriptor)
        self.figures.syncs += 1

    # -- what the reactor thread reads by

    def report(self):
        """
        The L{QueueUpdate} of the records the reactor thread has not been told
        of (the whole index, with a new descriptor, if the file is new or was
        replaced), or None if there are none.
        """
        if self.damage is not None:
            return None
        if self._renewed:
            update = QueueUpdate(self.handles[:], self.offsets[:], self.size,
                                 os.dup(self.descriptor))
            self._renewed = False
        elif self._reported < len(self.handles):
            reported = self._reported
            update = QueueUpdate(self.handles[reported:], self.offsets[reported:], self.size, None)
        else:
            return None
        self._reported = len(self.handles)
        return update

    # -- compaction

    def worth_compacting(self, min_records, valid_ratio):
        """At least C{min_records} records, and fewer than C{valid_ratio} of them valid."""
        return (self.damage is None and self.records >= min_records
                and self.held < valid_ratio * self.records)

    def compact(self):
        """
        Rewrite the file with only its valid records: into a temporary file,
        fsynced, renamed over the data file, directory fsynced. Always durable,
        whatever the sync policy, as the rename replaces data already committed.
        The reactor thread reads the old file (its own descriptor keeps it)
        until the next L{report} gives it the new one.
        """
        temporary = self.path + COMPACT_SUFFIX
        descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            handles, offsets, sizes, size = self._copy_valid_records(descriptor)
            os.fsync(descriptor)
            os.replace(temporary, self.path)
        except BaseException:
            os.close(descriptor)
            os.unlink(temporary)
            raise
        os.close(self.descriptor)
        log.info(
            "compacted queue file {path}: {records} records in {old_size} bytes"
            " to {valid} in {size}",
            path=self.path, records=self.records, old_size=self.size, valid=len(handles), size=size,
        )
        self.figures.file_bytes += size - self.size
        self.figures.compactions += 1
        self.descriptor, self.size = descriptor, size
        self.handles, self.offsets, self.sizes = handles, offsets, sizes
        self.valid = bytearray(b"\x01") * len(handles)
        self.records = len(handles) + bool(self.delivery_counts)
        self._cursor = self._reported = 0
        self._renewed = True
        fsync_directory(os.path.dirname(self.path))
        self.figures.syncs += 2

    def _copy_valid_records(self, descriptor):
        """Copy the header and the valid records to C{descriptor}, reading runs of adjacent records
        at once: C{(handles, offsets, sizes, size)} of the copy."""
        header = file_header(self.queue)
        handles = array("Q", compress(self.handles, self.valid))
        sizes = array("I", compress(self.sizes, self.valid))
        offsets = array("Q", accumulate(sizes, initial=len(header)))
        size = offsets.pop()
        copy = _Copy(self, descriptor)
        copy.add(header)
        start = end = None
        for offset, record_size in zip(compress(self.offsets, self.valid), sizes):
            if offset != end:
                if start is not None:
                    copy.add_range(start, end)
                start = end = offset
            end += record_size
        if start is not None:
            copy.add_range(start, end)
        if self.delivery_counts:
            counts = {offsets[bisect_left(handles, handle)]: count
                      for handle, count in self.delivery_counts.items()}
            for part in self._counts_record(counts):
                copy.add(part)
                size += len(part)
        copy.flush()
        return handles, offsets, sizes, size

    @staticmethod
    def _counts_record(counts):
        """The parts of a record of delivery counts, C{counts} mapping record offsets to counts."""
        payload = encode_returns(counts)
        header, trailer = frame(payload, b"")
        return [header, payload, trailer]

    def close(self):
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


class _Copy:
    """Bytes copied into a compacted file, written in pieces of about C{COMPACTION_WRITE_SIZE}."""

    def __init__(self, source, descriptor):
        self.source = source
        self.descriptor = descriptor
        self.pending = []
        self.pending_size = 0
        self.written = 0

    def add(self, data):
        self.pending.append(data)
        self.pending_size += len(data)
        if self.pending_size >= COMPACTION_WRITE_SIZE:
            self.flush()

    def add_range(self, start, end):
        """The bytes from C{start} to C{end} of the source file."""
        while start < end:
            piece = os.pread(self.source.descriptor, min(end - start, COMPACTION_WRITE_SIZE), start)
            if not piece:
                raise OSError(f"{self.source.path} ends inside the record at offset {start}")
            self.add(piece)
            start += len(piece)

    def flush(self):
        if self.pending:
            write_all(self.descriptor, b"".join(self.pending), self.written)
            self.written += self.pending_size
            self.pending, self.pending_size = [], 0
