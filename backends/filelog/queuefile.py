"""One queue's data file: recovered, appended to, acked in place, compacted, read.

Only the store's writer thread touches a L{QueueFile}. The file holds a header
naming its queue, then records (see L{backends.filelog.records}); the object
knows where each valid record is (handle -> offset and size), which is what an
ack (flip the valid byte), a read and a compaction need.
"""

import mmap
import os
from typing import NamedTuple

from google.protobuf.message import DecodeError
from twisted.logger import Logger

from backends.fileio import fsync_directory, queue_key_name, write_all, write_gathered
from backends.filelog.records import (
    ACKED_FLAG,
    FLAG_OFFSET,
    OVERHEAD,
    decode_returns,
    encode_returns,
    file_header,
    frame,
    is_returns,
    payload_of,
    record_problem,
    scan,
)
from backends.messagerecord import record_of_stored
from backends.quarantine import unreadable_message
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2

log = Logger()

DATA_SUFFIX = ".qlog"
COMPACT_SUFFIX = ".compact"
COMPACTION_WRITE_SIZE = 1 << 20


def queue_file_name(queue):
    """The data file name of a queue key C{(vhost, name)} (see L{queue_key_name})."""
    return queue_key_name(queue) + DATA_SUFFIX


class FiguresNow(NamedTuple):
    """The L{Figures} at one moment, as a value the reactor thread may keep."""

    file_bytes: int
    writes: int
    syncs: int
    compactions: int


class Figures:
    """Counters of a store's files for its stats(), kept by the writer thread; L{now} gives them as a value."""

    def __init__(self):
        self.file_bytes = 0
        self.writes = 0
        self.syncs = 0
        self.compactions = 0

    def now(self):
        return FiguresNow(self.file_bytes, self.writes, self.syncs, self.compactions)


class QueueFile:
    """
    One queue's data file.

    @ivar positions: handle -> C{(offset, size)} of every valid record, in
        file order.
    @ivar records: how many records the file holds, valid, acked or of delivery counts.
    @ivar delivery_counts: handle -> how often its message came back to the
        queue unacked, for valid records that came back at least once.
    @ivar damage: the L{StoreCorrupted} recovery found, if any; a damaged file
        is closed and left as it is until its queue is deleted.
    """

    def __init__(self, queue, path, descriptor, figures):
        self.queue = queue
        self.path = path
        self.descriptor = descriptor
        self.figures = figures
        self.size = 0
        self.records = 0
        self.positions = {}
        self.delivery_counts = {}
        self.damage = None
        self.next_handle = None  # after recovery: the first handle not given to one of its records

    @classmethod
    def create(cls, queue, path, figures):
        """A new, empty file. O_TRUNC: a file of a queue of the same name that the
        topology no longer holds (ignored at open) must not lend it its messages."""
        return cls(queue, path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644), figures)

    # -- recovery

    def recover(self, first_handle):
        """
        Read the file's valid records, cutting off a torn header or tail.

        A record that is whole but does not parse is quarantined: logged and
        left out of what is returned, yet kept valid in the file (compaction
        copies it along) until the queue is deleted; it uses up a handle.

        @return: C{[(handle, MessageRecord)]} in file order, handles counted
            from C{first_handle}.
        @raise StoreCorrupted: if the file is damaged before its end or is not
            this queue's; the file is then marked damaged and left untouched.
        """
        recovered, handle, counts = [], first_handle, {}
        records = self._sound_records()
        for record in records:
            if record.payload is None:
                continue
            if is_returns(record.payload):
                try:
                    counts.update(decode_returns(record.payload))
                except ValueError as problem:
                    raise self._damaged(f"the record at offset {record.offset}: {problem}", record.offset) from None
                continue
            message = messages_pb2.StoredMessage()
            self.positions[handle] = (record.offset, record.size)
            try:
                message.ParseFromString(record.payload)
            except DecodeError as problem:
                log.error("queue {queue!r} in vhost {vhost!r}: quarantined stored message at offset {offset} of"
                          " {path}, not delivered: its intact record does not parse ({problem}); it is kept in the"
                          " file as it is", queue=self.queue[1], vhost=self.queue[0], offset=record.offset,
                          path=self.path, problem=problem)
            else:
                recovered.append((handle, record_of_stored(message)))
            handle += 1
        self.next_handle = handle
        if counts:
            self.delivery_counts = {handle: counts[offset] for handle, (offset, _) in self.positions.items()
                                    if counts.get(offset)}
        self.records = len(records)
        self.figures.file_bytes += self.size
        return recovered

    def _sound_records(self):
        header = file_header(self.queue)
        size = os.fstat(self.descriptor).st_size
        if size < len(header):
            self._drop_torn_header(header, size)
            return []
        with mmap.mmap(self.descriptor, size, access=mmap.ACCESS_READ) as data:
            if data[: len(header)] != header:
                raise self._damaged(f"it does not start with the header of {self.queue!r}", 0)
            records, damage = scan(data, len(header))
        self.size = size
        if damage is None:
            return records
        if not damage.torn:
            raise self._damaged(
                f"the record at offset {damage.offset} is bad ({damage.reason}), yet sound records follow it"
                f" ({size - damage.offset} bytes from there on)",
                damage.offset,
            )
        log.warn(
            "queue file {path}: dropped a torn tail of {dropped} bytes at offset {offset} ({reason})",
            path=self.path, dropped=size - damage.offset, offset=damage.offset, reason=damage.reason,
        )
        self._truncate(damage.offset)
        return records

    def _drop_torn_header(self, header, size):
        """A file too short for its header holds no message: if what it holds is
        the start of its header (or zeros), its creation was cut short; empty it."""
        if not size:
            return
        start = os.pread(self.descriptor, size, 0)
        if not header.startswith(start) and start.strip(b"\0"):
            raise self._damaged(f"it does not start with the header of {self.queue!r}", 0)
        log.warn("queue file {path}: dropped a torn header of {size} bytes", path=self.path, size=size)
        self._truncate(0)

    def _truncate(self, size):
        os.ftruncate(self.descriptor, size)
        os.fsync(self.descriptor)
        self.size = size
        self.figures.syncs += 1

    def _damaged(self, reason, offset):
        os.close(self.descriptor)
        self.descriptor = None
        self.positions = {}
        self.damage = StoreCorrupted(f"queue file {self.path} is damaged: {reason}", self.path, offset)
        return self.damage

    # -- writes

    def append(self, handles, payloads, framings):
        """
        Append the records of C{handles} with one gathered write (after the
        header, if the file is empty).

        @param payloads: handle -> encoded StoredMessage as C{(head, body)}.
        @param framings: handle -> (header, trailer), shared by the files a
            message goes to so its CRC is computed once; filled in here.
        """
        if self.damage is not None:
            raise StoreCorrupted(f"cannot append to {self.path}: {self.damage}", self.path)
        parts, positions, offset = [], [], self.size
        if not offset:
            parts.append(file_header(self.queue))
            offset = len(parts[0])
        for handle in handles:
            head, body = payloads[handle]
            framing = framings.get(handle)
            if framing is None:
                framing = framings[handle] = frame(head, body)
            parts += (framing[0], head, body, framing[1])
            size = OVERHEAD + len(head) + len(body)
            positions.append((handle, (offset, size)))
            offset += size
        try:
            self.figures.writes += write_gathered(self.descriptor, parts, self.size)
        except OSError:
            self._cut_failed_append()
            raise
        self.figures.file_bytes += offset - self.size
        self.positions.update(positions)
        self.records += len(positions)
        self.size = offset

    def returned(self, counts):
        """
        Keep the delivery counts of C{counts} (handle -> count) whose records
        the file holds valid: one record of counts appended, naming the
        message records by offset.
        """
        kept = {handle: count for handle, count in counts.items() if handle in self.positions}
        if not kept or self.damage is not None:
            return False
        self.delivery_counts.update(kept)
        self._append_counts({self.positions[handle][0]: count for handle, count in kept.items()})
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
        """Flip the valid byte of each record of C{handles} the file holds; returns how many it held."""
        flipped = 0
        for handle in handles:
            position = self.positions.pop(handle, None)
            if position is not None:
                self.delivery_counts.pop(handle, None)
                os.pwrite(self.descriptor, ACKED_FLAG, position[0] + FLAG_OFFSET)
                flipped += 1
        return flipped

    def fsync(self):
        os.fsync(self.descriptor)
        self.figures.syncs += 1

    # -- compaction

    def worth_compacting(self, min_records, valid_ratio):
        """At least C{min_records} records, and fewer than C{valid_ratio} of them valid."""
        return self.damage is None and self.records >= min_records and len(self.positions) < valid_ratio * self.records

    def compact(self):
        """
        Rewrite the file with only its valid records: into a temporary file,
        fsynced, renamed over the data file, directory fsynced. Always durable,
        whatever the sync policy, as the rename replaces data already committed.
        """
        temporary = self.path + COMPACT_SUFFIX
        descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            positions, size = self._copy_valid_records(descriptor)
            os.fsync(descriptor)
            os.replace(temporary, self.path)
        except BaseException:
            os.close(descriptor)
            os.unlink(temporary)
            raise
        os.close(self.descriptor)
        log.info(
            "compacted queue file {path}: {records} records in {old_size} bytes to {valid} in {size}",
            path=self.path, records=self.records, old_size=self.size, valid=len(positions), size=size,
        )
        self.figures.file_bytes += size - self.size
        self.figures.compactions += 1
        self.descriptor, self.positions, self.size, self.records = descriptor, positions, size, len(positions)
        self.records += bool(self.delivery_counts)
        fsync_directory(os.path.dirname(self.path))
        self.figures.syncs += 2

    def _copy_valid_records(self, descriptor):
        header = file_header(self.queue)
        positions, pending, pending_size, written = {}, [header], len(header), 0
        for handle, (offset, size) in self.positions.items():
            record = os.pread(self.descriptor, size, offset)
            if len(record) != size:
                raise OSError(f"{self.path} ends inside the record at offset {offset}")
            positions[handle] = (written + pending_size, size)
            pending.append(record)
            pending_size += size
            if pending_size >= COMPACTION_WRITE_SIZE:
                write_all(descriptor, b"".join(pending), written)
                written, pending, pending_size = written + pending_size, [], 0
        if self.delivery_counts:
            pending += self._counts_record({positions[handle][0]: count for handle, count in self.delivery_counts.items()})
        write_all(descriptor, b"".join(pending), written)
        return positions, written + sum(map(len, pending))

    @staticmethod
    def _counts_record(counts):
        """The parts of a record of delivery counts, C{counts} mapping record offsets to counts."""
        payload = encode_returns(counts)
        header, trailer = frame(payload, b"")
        return [header, payload, trailer]

    # -- reads

    def read(self, handle):
        """
        The L{MessageRecord} of C{handle}, or None if the file holds no valid record of it.

        @raise StoreCorrupted: if the record no longer reads back whole.
        """
        position = self.positions.get(handle)
        if position is None:
            return None
        offset, size = position
        record = os.pread(self.descriptor, size, offset)
        problem = record_problem(record)
        if problem is not None:
            raise StoreCorrupted(
                f"queue file {self.path}: the record at offset {offset} reads back damaged: {problem}", self.path, offset
            )
        message = messages_pb2.StoredMessage()
        try:
            message.ParseFromString(payload_of(record))
        except DecodeError as problem:
            raise unreadable_message(f"queue file {self.path}, offset {offset}", problem) from None
        return record_of_stored(message)

    def close(self):
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None
