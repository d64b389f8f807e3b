"""One durable queue's index: which messages it holds, in order, and which it acked.

Only the store's writer thread touches a L{QueueIndex}. Its directory holds:

  - index chunks (``index-chunk-NNNNNNNNN``): fixed 16-byte entries naming a
    message by its position in the message log, entry N at a place computed
    from N alone (L{backends.chunked.format}), read back at open by
    L{backends.chunked.indexchunks};
  - ``acks``: an ack log, per commit a record of acks and one of delivery
    counts of entries that came back unacked, so neither rewrites the message
    log or the index;
  - ``checkpoint``: the queue key, the low-water mark (the first entry not
    acked), the acked entries above it and the delivery counts of entries
    not acked, replaced atomically now and then; the ack log is emptied after
    each checkpoint and index chunks wholly below the mark are deleted.

Both formats are in L{backends.chunked.ackformat}.

Entries of a queue are appended in position order, so the handles of its
un-acked window are sorted and an ack finds its entry by bisection.
"""

import bisect
import os
import shutil
from array import array

from twisted.logger import Logger

from backends.chunked.ackformat import (
    ACK_LOG_MAGIC,
    decode_ack_log,
    decode_checkpoint,
    encode_ack_records,
    encode_checkpoint,
)
from backends.chunked.format import (
    HEADER_SIZE,
    INDEX_CHUNK,
    INDEX_ENTRY_SIZE,
    encode_header,
    encode_index_entry,
)
from backends.chunked.indexchunks import index_chunk_path, read_entries, zero_from
from backends.common.fileio import TEMPORARY_SUFFIX, fsync_directory, replace_file, write_all
from brokerd.interfaces import StoreCorrupted

log = Logger()

ACK_LOG = "acks"
CHECKPOINT = "checkpoint"
CHECKPOINT_EVERY_ACK_BYTES = 1 << 20  # of ack log before a checkpoint empties it


def creation_cut_short(directory):
    """
    Whether an index directory holds only what an interrupted L{QueueIndex.create}
    leaves: nothing, or a checkpoint not yet renamed into place. No entry can
    have been written before the checkpoint, so the queue holds nothing.
    """
    return set(os.listdir(directory)) <= {CHECKPOINT + TEMPORARY_SUFFIX}


class QueueIndex:
    """
    A durable queue's index chunks, ack log and checkpoint.

    @ivar mark: the low-water mark, the first entry number not acked.
    @ivar next_entry: the number the next appended entry gets.
    """

    def __init__(self, directory, queue, entries_per_chunk):
        self.directory = directory
        self.queue = queue
        self.entries_per_chunk = entries_per_chunk
        self.mark = 0
        self.next_entry = 0
        # handles (log positions) of entries window_base .. next_entry - 1
        self._window = array("Q")
        self._sizes = array("I")  # their body lengths
        self._window_base = 0
        self._acked = set()  # acked entry numbers at or above the mark
        self._new_acks = array("Q")  # acked since the last commit, for the ack log
        # entry number -> how often it came back unacked, for entries not acked
        self._delivery_counts = {}
        self._new_returns = {}  # entry number -> delivery count, changed since the last commit
        self._ack_log = None  # descriptor
        self._ack_log_size = 0
        self._checkpointed_mark = 0
        self._chunk = None  # (number, descriptor) of the index chunk being appended to
        self._unsynced = set()
        self._finished = []  # descriptors of index chunks written to before the current one
        self._directory_unsynced = False

    def path_of(self, number):
        return index_chunk_path(self.directory, number)

    @property
    def held(self):
        """The number of entries not acked."""
        return self.next_entry - self.mark - len(self._acked)

    # -- creation and recovery

    def create(self):
        """Make the files of a new, empty queue (the checkpoint names the queue)."""
        os.makedirs(self.directory, exist_ok=True)
        replace_file(os.path.join(self.directory, CHECKPOINT), encode_checkpoint(self.queue, 0, ()),
                     True)
        self._open_ack_log(create=True)

    def recover(self, write_position):
        """
        Read the checkpoint, the ack log and the index from the mark on.
        Entries pointing at or past C{write_position} (a message log tail lost
        in a crash) are cut off with the index tail after them.

        @raise StoreCorrupted: naming the file, if any of them is damaged.
        """
        path = os.path.join(self.directory, CHECKPOINT)
        try:
            with open(path, "rb") as checkpoint:
                queue, self.mark, self._acked, self._delivery_counts = decode_checkpoint(
                    checkpoint.read(), path)
        except FileNotFoundError:
            raise StoreCorrupted(f"queue {self.queue!r} has index files but no checkpoint {path}",
                                 path) from None
        if queue != self.queue:
            raise StoreCorrupted(f"checkpoint {path} belongs to queue {queue!r}, not"
                                 f" {self.queue!r}", path, 0)
        self._checkpointed_mark = self.mark
        self._acked.update(self._read_ack_log())
        self._window_base = self.mark
        self._window, self._sizes, self.next_entry, self.entries_per_chunk = read_entries(
            self.directory, self.queue, self.entries_per_chunk, self.mark)
        cut = self._cut_entries_from(bisect.bisect_left(self._window, write_position),
                                     write_position)
        # Acks of entries past the end (cut off, or never written) must not ack the entries
        # written there next.
        stale = {entry for entry in self._acked if entry >= self.next_entry}
        self._acked = {entry for entry in self._acked if self.mark <= entry < self.next_entry}
        self._advance_mark()
        self._delivery_counts = {
            entry: count for entry, count in self._delivery_counts.items()
            if self.mark <= entry < self.next_entry and entry not in self._acked}
        if cut or stale:
            self.checkpoint(True, force=True)

    def _open_ack_log(self, create=False):
        path = os.path.join(self.directory, ACK_LOG)
        if create:
            with open(path, "wb") as ack_log:
                ack_log.write(ACK_LOG_MAGIC)
        self._ack_log = os.open(path, os.O_RDWR)
        self._ack_log_size = os.fstat(self._ack_log).st_size
        if os.pread(self._ack_log, len(ACK_LOG_MAGIC), 0) != ACK_LOG_MAGIC:
            # version 1 records read the same; returns follow
            write_all(self._ack_log, ACK_LOG_MAGIC, 0)

    def _read_ack_log(self):
        path = os.path.join(self.directory, ACK_LOG)
        if not os.path.exists(path):
            self._open_ack_log(create=True)
            return []
        with open(path, "rb") as ack_log:
            data = ack_log.read()
        acked, delivery_counts, offset = decode_ack_log(data, path)
        self._delivery_counts.update(delivery_counts)
        self._open_ack_log()
        if offset < len(data):
            log.warn("ack log {path}: a torn record at offset {offset} ({size} bytes) is cut off",
                     path=path, offset=offset, size=len(data) - offset)
            os.ftruncate(self._ack_log, offset)
            self._ack_log_size = offset
        return acked

    def _cut_entries_from(self, index, write_position):
        """Drop window entries from C{index} on (they point past the message log's end)."""
        if index >= len(self._window):
            return False
        entry = self._window_base + index
        log.warn(
            "queue {queue!r}: {count} index entries from entry {entry} point past the end of the"
            " message log ({position}), which a crash cut short; they are dropped",
            queue=self.queue, count=len(self._window) - index, entry=entry, position=write_position,
        )
        del self._window[index:]
        del self._sizes[index:]
        self._delivery_counts = {number: count for number, count in self._delivery_counts.items()
                                 if number < entry}
        last_chunk = (self.next_entry - 1) // self.entries_per_chunk
        for number in range(entry // self.entries_per_chunk, last_chunk + 1):
            first = max(entry - number * self.entries_per_chunk, 0)
            zero_from(self.path_of(number), HEADER_SIZE + first * INDEX_ENTRY_SIZE,
                      self.entries_per_chunk)
        self.next_entry = entry
        return True

    def unacked(self):
        """The handles of the entries not acked, in queue order."""
        return self._unacked_of(self._window, "Q")

    def delivery_counts(self):
        """How often entries not acked came back unacked:
        C{{handle: count}}, counts above 0 only."""
        window, base = self._window, self._window_base
        return {window[entry - base]: count for entry, count in self._delivery_counts.items()
                if count}

    def unacked_sizes(self):
        """The body lengths of the entries not acked, in the order of L{unacked}."""
        return self._unacked_of(self._sizes, "I")

    def _unacked_of(self, values, typecode):
        start = self.mark - self._window_base
        if not self._acked:
            return values[start:]
        acked = self._acked
        return array(typecode, (value for number, value in enumerate(values[start:], self.mark)
                                if number not in acked))

    def unacked_positions_by_chunk(self, data_size, moves=None):
        """
        How many un-acked entries point into each message chunk: C{{chunk
        number: count}}, a handle counting where C{moves} (handle ->
        position, from compaction) says its record is now.
        """
        counts = {}
        handles = self.unacked()
        if moves or not handles:
            for handle in handles:
                number = (moves.get(handle, handle) if moves else handle) // data_size
                counts[number] = counts.get(number, 0) + 1
            return counts
        # Entries are appended in log order, so the handles ascend: count each chunk's run by
        # bisection.
        low = 0
        for number in range(handles[0] // data_size, handles[-1] // data_size + 1):
            high = bisect.bisect_left(handles, (number + 1) * data_size, low)
            if high > low:
                counts[number] = high - low
            low = high
        return counts

    def held_between(self, low, high):
        """C{(handle, body length)} of the un-acked entries whose handles are in C{[low, high)},
        in order."""
        window, sizes, base, acked = self._window, self._sizes, self._window_base, self._acked
        start = bisect.bisect_left(window, low, self.mark - base)
        end = bisect.bisect_left(window, high, start)
        return [(window[index], sizes[index]) for index in range(start, end)
                if base + index not in acked]

    def held_size(self, handle):
        """The body length of C{handle}'s un-acked entry, or None if the queue holds none for it."""
        window, base = self._window, self._window_base
        index = bisect.bisect_left(window, handle, self.mark - base)
        if index == len(window) or window[index] != handle or base + index in self._acked:
            return None
        return self._sizes[index]

    # -- commits

    def append(self, handles, sizes):
        """Write entries for C{handles} (in position order; C{sizes} their body lengths) at the end
        of the index."""
        entries = b"".join(map(encode_index_entry, handles, sizes))
        entry, offset = self.next_entry, 0
        while offset < len(entries):
            number, first = divmod(entry, self.entries_per_chunk)
            descriptor = self._chunk_for(number)
            room = (self.entries_per_chunk - first) * INDEX_ENTRY_SIZE
            part = entries[offset : offset + room]
            write_all(descriptor, part, HEADER_SIZE + first * INDEX_ENTRY_SIZE)
            self._unsynced.add(descriptor)
            offset += len(part)
            entry += len(part) // INDEX_ENTRY_SIZE
        self.next_entry = entry
        self._window.extend(handles)
        self._sizes.extend(sizes)

    def _chunk_for(self, number):
        if self._chunk is not None and self._chunk[0] == number:
            return self._chunk[1]
        if self._chunk is not None:
            self._finished.append(self._chunk[1])  # closed once synced
        path = self.path_of(number)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(descriptor).st_size == 0:
            self._directory_unsynced = True
            size = self.entries_per_chunk * INDEX_ENTRY_SIZE
            os.ftruncate(descriptor, HEADER_SIZE + size)
            header = encode_header(INDEX_CHUNK, number, number * self.entries_per_chunk, size)
            write_all(descriptor, header, 0)
        self._chunk = (number, descriptor)
        return descriptor

    def ack(self, handle):
        """Mark the entry of C{handle} acked; its body length, or None if the queue holds no
        un-acked entry for it."""
        window, base = self._window, self._window_base
        index = bisect.bisect_left(window, handle, self.mark - base)
        if index == len(window) or window[index] != handle:
            return None
        entry = base + index
        if entry in self._acked:
            return None
        self._acked.add(entry)
        self._new_acks.append(entry)
        if self._delivery_counts:
            self._delivery_counts.pop(entry, None)
        size = self._sizes[index]
        self._advance_mark()
        return size

    def ack_run(self, handles):
        """
        Mark acked C{handles} that are the queue's oldest un-acked entries, in
        order (what a consumer's multiple ack settles): their body lengths, in
        one pass. None, with nothing marked, if they are not exactly those
        entries or other entries were acked out of order; then L{ack} takes
        them one at a time.
        """
        window, mark = self._window, self.mark
        start, count = mark - self._window_base, len(handles)
        if self._acked or window[start : start + count] != array("Q", handles):
            return None
        if self._delivery_counts:
            for entry in range(mark, mark + count):
                self._delivery_counts.pop(entry, None)
        self._new_acks.extend(range(mark, mark + count))
        sizes = self._sizes[start : start + count]
        self.mark = mark + count
        self._trim_window()
        return sizes

    def returned(self, handle, count):
        """Note the delivery count of C{handle}'s entry; ignored if the queue holds no
        un-acked entry for it."""
        window, base = self._window, self._window_base
        index = bisect.bisect_left(window, handle, self.mark - base)
        if index == len(window) or window[index] != handle or base + index in self._acked:
            return
        self._delivery_counts[base + index] = count
        self._new_returns[base + index] = count

    def _advance_mark(self):
        acked, mark = self._acked, self.mark
        while mark in acked:
            acked.remove(mark)
            mark += 1
        self.mark = mark
        self._trim_window()

    def _trim_window(self):
        """Drop the window's acked head once it is most of the window (and over 4096 entries)."""
        mark = self.mark
        dropped = mark - self._window_base
        if dropped > 4096 and dropped * 2 > len(self._window):
            del self._window[:dropped]
            del self._sizes[:dropped]
            self._window_base = mark

    def write_acks(self):
        """Append this commit's returns and acks to the ack log (a record each)."""
        if not (self._new_returns or self._new_acks):
            return
        data = encode_ack_records(self._new_acks, self._new_returns)
        self._new_acks, self._new_returns = array("Q"), {}
        write_all(self._ack_log, data, self._ack_log_size)
        self._ack_log_size += len(data)
        self._unsynced.add(self._ack_log)

    def sync(self, fsync):
        if fsync:
            for descriptor in self._unsynced:
                os.fsync(descriptor)
            if self._directory_unsynced:
                fsync_directory(self.directory)
                self._directory_unsynced = False
        self._unsynced.clear()
        finished, self._finished = self._finished, []
        for descriptor in finished:
            os.close(descriptor)

    def checkpoint_if_due(self, sync_directory):
        """
        Replace the checkpoint and empty the ack log once the log has grown or
        the mark has passed an index chunk; then delete index chunks below the
        mark. Called after the commit's acks are durable.
        """
        entries_per_chunk = self.entries_per_chunk
        passed_chunk = self.mark // entries_per_chunk > self._checkpointed_mark // entries_per_chunk
        if not passed_chunk and self._ack_log_size < CHECKPOINT_EVERY_ACK_BYTES:
            return
        self.checkpoint(sync_directory)

    def checkpoint(self, sync_directory, force=False):
        if (not force and self.mark == self._checkpointed_mark
                and self._ack_log_size <= len(ACK_LOG_MAGIC)):
            return
        replace_file(os.path.join(self.directory, CHECKPOINT),
                     encode_checkpoint(self.queue, self.mark, self._acked, self._delivery_counts),
                     sync_directory)
        os.ftruncate(self._ack_log, len(ACK_LOG_MAGIC))
        self._ack_log_size = len(ACK_LOG_MAGIC)
        entries_per_chunk = self.entries_per_chunk
        for number in range(self._checkpointed_mark // entries_per_chunk,
                            self.mark // entries_per_chunk):
            if self._chunk is not None and self._chunk[0] == number:
                os.close(self._chunk[1])
                self._unsynced.discard(self._chunk[1])
                self._chunk = None
            try:
                os.unlink(self.path_of(number))
            except FileNotFoundError:
                pass
        self._checkpointed_mark = self.mark

    # -- the end

    def close(self):
        descriptors = [self._ack_log, *self._finished] + ([self._chunk[1]] if self._chunk else [])
        self._finished = []
        for descriptor in descriptors:
            if descriptor is not None:
                os.close(descriptor)
        self._ack_log, self._chunk = None, None

    def delete(self):
        """Remove the queue's files; its entries no longer hold any message."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
