"""The chunked store's on-disk due-time index of delayed messages
(L{ChunkedDelayedIndex}), as its writer thread works on it.

A delayed message's record goes to the message log like any message (written
once); the index says, by due time, where it is. It is kept like a small LSM
tree, so that a commit writes one file however spread out the due times are:

  - each commit appends its delays and releases to the I{journal} (one write,
    one fsync) and to the in-memory I{memtables} of their buckets;
  - once the journal holds C{flush_entries} entries (and at close), they are
    I{flushed}: each bucket touched gets one sorted run and one list of
    released handles appended to its file (L{ChunkedDelayedBucket.flush}), the files
    are fsynced, then the journal starts over with a new generation. A crash
    (or an error) in between replays the journal, skipping in each bucket
    what its file holds already: its last block says up to which entry of
    which generation;
  - a window (L{ChunkedDelayedIndex.window}) loads only the buckets it spans (a few
    are kept loaded, as arrays) and merges their runs from the cursor on.

At open every bucket file is read once, one at a time, to count what is kept:
the store gets, per kept handle, its due time and chunk (a L{HandleMap}), and
the number of kept entries per message chunk (so no chunk they point into is
deleted). Nothing per message outlives the open as an object.

One bucket's file and memtable are a L{ChunkedDelayedBucket}
(L{backends.chunked.delayedbuckets}); the bytes of the journal and bucket
files are in L{backends.chunked.delayedformat}, those of the meta file in
L{backends.common.delayed_meta}. L{backends.chunked.writer} drives the
index at each commit; the reactor side is L{backends.chunked.delayedhandles}. (The
filelog store's index, L{backends.filelog.delayedlog.FilelogDelayedMemoryIndex},
is a different thing: in memory only, rebuilt from its log.)
"""

import os
from array import array
from bisect import bisect_left, insort
from collections import Counter, OrderedDict
from typing import NamedTuple

from twisted.logger import Logger

from backends.chunked.delayedbuckets import ChunkedDelayedBucket
from backends.chunked.delayedformat import (
    JOURNAL_HEADER,
    META_MAGIC,
    RELEASED,
    DelayedFormatError,
    bucket_number_of,
    decode_journal_entries,
    decode_journal_header,
    encode_journal_entries,
    encode_journal_header,
    sound_entry_after,
)
from backends.common.delayed_meta import encode_meta, read_meta
from backends.common.fileio import TEMPORARY_SUFFIX, fsync_directory, replace_file, write_all
from backends.common.handle_map import HandleMap
from backends.common.sorted_runs import window
from brokerd.interfaces import StoreCorrupted

log = Logger()

DIRECTORY = "delayed"
JOURNAL = "journal"
META = "meta"
LOADED_VIEWS = 16  # buckets kept loaded for windows
KEPT_TYPECODES = ("Q", "Q")  # the store's values per kept handle: due time, message chunk number


class ChunkedDelayedRecovery(NamedTuple):
    """What L{ChunkedDelayedIndex.open} found, for the store's reactor side."""

    kept: HandleMap  # kept handle -> (due, chunk number)
    references: Counter  # message chunk number -> kept entries pointing into it
    next_handle: int
    exchanges: list  # exchange keys by number
    width: int  # of a bucket, in milliseconds
    damage: StoreCorrupted | None  # what makes the delayed messages unusable, if anything


class ChunkedDelayedIndex:
    """
    The journal, the meta file and the bucket files under C{<directory>/delayed}.

    Damage beyond a torn tail in any of them makes the whole index unusable
    (C{damage}): windows fail with it, nothing is flushed, no message chunk is
    deleted, and the files stay as they are for repair; the queues go on.
    """

    def __init__(self, directory, width, flush_entries):
        self.directory = os.path.join(directory, DIRECTORY)
        self.journal_path = os.path.join(self.directory, JOURNAL)
        self.meta_path = os.path.join(self.directory, META)
        self.width = width
        self.flush_entries = flush_entries
        self.buckets = {}  # bucket number -> ChunkedDelayedBucket
        self.numbers = []  # bucket numbers, sorted
        self.generation = 1  # the journal's
        self.damage = None
        self.flushes = 0
        self._journal = None  # descriptor, once the journal exists
        self._journal_size = 0
        self._journal_entries = 0
        self._unsynced = False
        self._directory_unsynced = False
        # bucket numbers whose view is loaded, least recently used first
        self._loaded = OrderedDict()

    @property
    def damaged(self):
        """True if some delayed data cannot be read: then no message chunk may be deleted."""
        return self.damage is not None

    # -- open

    def open(self, write_position, data_size, chunk_exists):
        """Read the meta file, the journal and every bucket; replay and flush the journal."""
        kept, references = HandleMap(KEPT_TYPECODES), Counter()
        if not os.path.isdir(self.directory):
            return ChunkedDelayedRecovery(kept, references, 1, [], self.width, None)
        for name in os.listdir(self.directory):
            if name.endswith(TEMPORARY_SUFFIX):
                os.unlink(os.path.join(self.directory, name))
        numbers = sorted(number for number in map(bucket_number_of, os.listdir(self.directory))
                         if number is not None)
        opening = _Opening(kept, references, write_position, data_size, chunk_exists)
        try:
            meta = read_meta(self.meta_path, META_MAGIC)
            if meta is None:
                if numbers or os.path.exists(self.journal_path):
                    raise StoreCorrupted(f"delayed-message meta file {self.meta_path} is missing",
                                         self.meta_path)
                return ChunkedDelayedRecovery(kept, references, 1, [], self.width, None)
            if meta.bucket_width != self.width:
                log.info("delayed buckets in {directory} are {found} ms wide; keeping that width",
                         directory=self.directory, found=meta.bucket_width)
                self.width = meta.bucket_width
            entries = self._read_journal()
            flushing = self.generation if entries is not None else None
            for number in numbers:
                self._open_bucket(number, opening, flushing)
            if entries is None:
                generations = [state.flushed[0] for state in self.buckets.values()]
                self.generation = 1 + max(generations + [0])
            else:
                self._replay(entries, opening)
        except StoreCorrupted as damage:
            log.error("{damage}; delayed messages are unavailable until it is repaired"
                      " (the queues are not affected)", damage=damage)
            self.damage = damage
            self.buckets, self.numbers = {}, []
            if self._journal is not None:
                os.close(self._journal)
                self._journal = None
            return ChunkedDelayedRecovery(HandleMap(KEPT_TYPECODES), Counter(), 1, [], self.width,
                                          damage)
        if opening.dropped:
            log.warn("delayed index {directory}: {count} entries point past the end of the message"
                     " log ({position}), which a crash cut short; they are dropped",
                     directory=self.directory, count=opening.dropped, position=write_position)
        if any(state.touched for state in self.buckets.values()):
            self.flush()
        next_handle = max(meta.handle_limit, opening.highest + 1)
        return ChunkedDelayedRecovery(kept, references, next_handle, meta.exchanges, self.width,
                                      None)

    def _state(self, number):
        state = self.buckets.get(number)
        if state is None:
            state = self.buckets[number] = ChunkedDelayedBucket(self.directory, number)
            insort(self.numbers, number)
        return state

    def _drop_state(self, number):
        del self.buckets[number]
        del self.numbers[bisect_left(self.numbers, number)]
        self._loaded.pop(number, None)

    def _open_bucket(self, number, opening, flushing):
        """Count a bucket file's kept entries into C{opening}, one bucket's arrays in memory at a
        time."""
        state = self._state(number)
        state.size = os.path.getsize(state.path)
        runs, released = state.read(self.width, flushing)
        data_size, end, kept = opening.data_size, opening.write_position, opening.kept
        chunks = Counter()
        for run in runs:
            if not len(run):
                continue
            opening.highest = max(opening.highest, max(run.handles))
            positions = run.extra[0]
            # The usual case: every entry kept, taken at C speed.
            if not released and max(positions) < end:
                numbers = array("Q", map(data_size.__rfloordiv__, positions))
                before = len(kept)
                kept.add_many(run.handles, run.dues, numbers)
                chunks.update(numbers)
                state.live += len(kept) - before
                continue
            for due, handle, position in zip(run.dues, run.handles, positions):
                if handle in released:
                    continue
                if position >= end:
                    state.pending.add(handle)  # written as released by the flush that follows
                    opening.dropped += 1
                    continue
                chunk = position // data_size
                kept.add(handle, due, chunk)
                chunks[chunk] += 1
                state.live += 1
        missing = [chunk for chunk in chunks if not opening.chunk_exists(chunk)]
        if missing:
            raise StoreCorrupted(f"delayed bucket {state.path} holds entries in message chunk"
                                 f" {min(missing)}, which is missing", state.path)
        opening.references.update(chunks)
        if state.live == 0 and not state.pending:
            state.remove()
            self._drop_state(number)

    def _read_journal(self):
        """The journal's entries (a torn tail cut off), or None if there is no journal;
        opens it for appends."""
        if not os.path.exists(self.journal_path):
            return None
        with open(self.journal_path, "rb") as journal:
            data = journal.read()
        try:
            self.generation = decode_journal_header(data)
        except DelayedFormatError as problem:
            raise StoreCorrupted(f"delayed journal {self.journal_path} is damaged: {problem}",
                                 self.journal_path, problem.offset) from None
        entries, stop, problem = decode_journal_entries(data, JOURNAL_HEADER.size)
        self._journal = os.open(self.journal_path, os.O_RDWR)
        if problem is not None:
            if sound_entry_after(data, stop):
                raise StoreCorrupted(f"delayed journal {self.journal_path} is damaged:"
                                     f" the entry at offset {stop} is bad ({problem}),"
                                     " yet sound entries follow it", self.journal_path, stop)
            log.warn("delayed journal {path}: dropped a torn tail of {size} bytes"
                     " at offset {offset} ({problem})",
                     path=self.journal_path, size=len(data) - stop, offset=stop, problem=problem)
            os.ftruncate(self._journal, stop)
            os.fsync(self._journal)
        self._journal_size, self._journal_entries = stop, len(entries)
        return entries

    def _replay(self, entries, opening):
        """Apply the journal's entries that no bucket file holds yet."""
        kept, references = opening.kept, opening.references
        width, generation = self.width, self.generation
        for index, (due, handle, position, exchange) in enumerate(entries):
            opening.highest = max(opening.highest, handle)
            number = due // width
            if exchange == RELEASED:
                values = kept.pop(handle)
                if values is not None:
                    references[values[1]] -= 1
                    state = self.buckets[number]
                    state.live -= 1
                    state.pending.add(handle)
                continue
            state = self.buckets.get(number)
            if state is not None and state.flushed > (generation, index):
                # A flush wrote it already (one a crash or an error cut short, or the journal is
                # older).
                continue
            if position >= opening.write_position:
                opening.dropped += 1
                continue
            chunk = position // opening.data_size
            if not opening.chunk_exists(chunk):
                raise StoreCorrupted(f"delayed journal {self.journal_path}: an entry points into"
                                     f" message chunk {chunk}, which is missing",
                                     self.journal_path)
            state = self._state(number)
            state.memtable.add(due, handle, position, exchange)
            state.live += 1
            kept.add(handle, due, chunk)
            references[chunk] += 1

    # -- commits

    def write(self, meta, delays, releases, fsync):
        """
        Apply one commit: the meta file if it changed, then the journal entries
        of C{delays} (C{(due, handle, position, exchange number)}) and
        C{releases} (C{(handle, due, chunk)}), and the memtables. Once the
        index is damaged the journal still takes them (nothing is lost; they
        are replayed once it is repaired), but nothing else changes.
        """
        if self.damage is not None and self._journal is None:
            if delays:
                raise StoreCorrupted(f"cannot delay messages: {self.damage}", self.damage.path)
            return
        if meta is not None:
            self._make_directory()
            replace_file(self.meta_path, encode_meta(META_MAGIC, meta), sync_directory=fsync)
            self._directory_unsynced = self._directory_unsynced or not fsync
        entries = list(delays)
        entries += [(due, handle, 0, RELEASED) for handle, due, _ in releases]
        if not entries:
            return
        self._open_journal()
        data = encode_journal_entries(entries)
        write_all(self._journal, data, self._journal_size)
        self._journal_size += len(data)
        self._journal_entries += len(entries)
        self._unsynced = True
        if self.damage is not None:
            return
        width, by_bucket = self.width, {}
        for delay in delays:
            number = delay[0] // width
            rows = by_bucket.get(number)
            if rows is None:
                by_bucket[number] = [delay]
            else:
                rows.append(delay)
        for number, rows in by_bucket.items():
            state = self._state(number)
            state.memtable.add_rows(rows)
            state.live += len(rows)
        for handle, due, _ in releases:
            state = self.buckets[due // width]
            state.live -= 1
            state.pending.add(handle)

    def _make_directory(self):
        if not os.path.isdir(self.directory):
            os.makedirs(self.directory)
            fsync_directory(os.path.dirname(self.directory))

    def _open_journal(self):
        if self._journal is None:
            self._make_directory()
            replace_file(self.journal_path, encode_journal_header(self.generation),
                         sync_directory=True)
            self._journal = os.open(self.journal_path, os.O_RDWR)
            self._journal_size, self._journal_entries = JOURNAL_HEADER.size, 0

    def sync(self, fsync):
        if fsync:
            if self._unsynced:
                os.fdatasync(self._journal)
            if self._directory_unsynced:
                fsync_directory(self.directory)
                self._directory_unsynced = False
        self._unsynced = False

    def flush_if_due(self):
        if self._journal_entries >= self.flush_entries:
            self.flush()

    def flush(self):
        """Write every memtable and pending release to the bucket files, then start the journal
        over."""
        if self.damage is not None:
            return
        generation, directory_changed = self.generation, False
        flushed = (generation, self._journal_entries)
        for number in list(self.numbers):
            state = self.buckets[number]
            if not state.touched:
                continue
            if state.live == 0:
                directory_changed = state.remove() or directory_changed
                self._drop_state(number)
            else:
                directory_changed = state.flush(self.width, flushed) or directory_changed
                if state.view is not None and number not in self._loaded:
                    state.unload()  # loaded for a rewrite only: no window is reading it
        if directory_changed:
            fsync_directory(self.directory)
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
        self.generation = generation + 1
        self._open_journal()
        self._unsynced = False
        self.flushes += 1

    # -- reads

    def window(self, cursor, until, limit):
        """Up to C{limit} C{(due, handle, position, exchange number)} after C{cursor},
        due by C{until}, in order."""
        if self.damage is not None:
            raise StoreCorrupted(f"delayed messages are unavailable: {self.damage}",
                                 self.damage.path)
        found, numbers, last = [], self.numbers, until // self.width
        index = 0 if cursor is None else bisect_left(numbers, cursor[0] // self.width)
        while index < len(numbers) and numbers[index] <= last and len(found) < limit:
            state = self.buckets[numbers[index]]
            released = state.is_released
            runs = [*self._view(state), *state.memtable.view(released)]
            found += window(runs, cursor, until, limit - len(found), released)
            index += 1
        return found

    def _view(self, state):
        try:
            view = state.load(self.width)
        except StoreCorrupted as damage:
            log.error("{damage}; delayed messages are unavailable until it is repaired",
                      damage=damage)
            self.damage = damage
            raise
        loaded = self._loaded
        loaded[state.number] = None
        loaded.move_to_end(state.number)
        while len(loaded) > LOADED_VIEWS:
            number, _ = loaded.popitem(last=False)
            if number in self.buckets:
                self.buckets[number].unload()
        return view

    def close(self):
        """Flush what the journal holds (so the next open has nothing to replay) and close it."""
        try:
            if any(state.touched for state in self.buckets.values()):
                self.flush()
        finally:
            if self._journal is not None:
                os.close(self._journal)
                self._journal = None


class _Opening:
    """What L{ChunkedDelayedIndex.open} gathers while it reads the files."""

    def __init__(self, kept, references, write_position, data_size, chunk_exists):
        self.kept = kept
        self.references = references
        self.write_position = write_position
        self.data_size = data_size
        self.chunk_exists = chunk_exists
        self.highest = 0
        self.dropped = 0
