"""One due-time bucket of the chunked store's delayed-message index
(L{backends.chunked.delayedindex.ChunkedDelayedIndex}): its file and what the
writer thread knows of it (L{ChunkedDelayedBucket}).

A bucket's file (L{backends.chunked.delayedformat}) holds sorted runs of
entries and lists of handles released since; L{ChunkedDelayedBucket} keeps
only figures about it, plus, while the bucket is in use, its runs loaded as
arrays (the I{view}). Entries newer than the last flush live in the bucket's
I{memtable}, a L{backends.common.sorted_runs.MemoryBucket}; handles
released since the last flush are in C{pending}. A flush appends one run and
one release block (L{ChunkedDelayedBucket.flush}), or rewrites the file as
one run when it has too many blocks or too much released.
"""

import os

from twisted.logger import Logger

from backends.chunked.delayedformat import (
    BLOCK_HEAD,
    BUCKET_HEADER,
    ENTRY_SIZES,
    RELEASES,
    RUN,
    DelayedFormatError,
    bucket_file_name,
    decode_blocks,
    decode_bucket_header,
    encode_bucket_header,
    encode_releases_block,
    encode_run_block,
    handles_of,
    run_of,
    sound_block_after,
)
from backends.common.fileio import replace_file, write_all
from backends.common.sorted_runs import MAX_RUNS, MemoryBucket, merge_runs
from brokerd.interfaces import StoreCorrupted

log = Logger()

TYPECODES = ("Q", "Q")  # the extra columns of an entry: log position, exchange number
MAX_BLOCKS = 16  # a file with more blocks is rewritten as one run at the next flush
REWRITE_RELEASED = 1024  # ... and so is one with this many released entries, if they are half of it


def torn_block(data, offset, flushing):
    """True if the bad block at C{offset}, the last of a file, can be a write of flush
    C{flushing} cut short."""
    if flushing is None:
        return False
    if len(data) - offset < BLOCK_HEAD.size:
        return True  # not even its head was written whole
    length, kind, generation, _, count = BLOCK_HEAD.unpack_from(data, offset)
    return generation == flushing and kind in ENTRY_SIZES and length == count * ENTRY_SIZES[kind]


class ChunkedDelayedBucket:
    """
    What the writer knows of one bucket of the chunked delayed index:
    its file's figures, memtable and view.

    @ivar live: entries kept (not released), in the file and the memtable.
    @ivar flushed: C{(generation, covered)} of the file's last block: the
        journal entries whose part for this bucket the file holds are the
        first C{covered} of that generation, and all of earlier ones.
    @ivar damage: the L{StoreCorrupted} its file's damage raises, or None.
    """

    __slots__ = ("number", "path", "live", "file_entries", "file_released", "blocks", "flushed",
                 "size", "memtable", "pending", "view", "released", "damage")

    def __init__(self, directory, number):
        self.number = number
        self.path = os.path.join(directory, bucket_file_name(number))
        self.live = 0
        self.file_entries = 0  # in the file's runs, released ones included
        self.file_released = 0  # handles in the file's release blocks
        self.blocks = 0
        self.flushed = (-1, 0)
        self.size = 0  # of the file; 0 for none
        self.memtable = MemoryBucket(TYPECODES)
        self.pending = set()  # handles released since the last flush
        self.view = None  # the file's runs, while loaded
        self.released = None  # the handles of the file's release blocks, while loaded
        self.damage = None

    def is_released(self, handle):
        return handle in self.pending or (self.released is not None and handle in self.released)

    @property
    def touched(self):
        """True if the bucket has something to flush."""
        return bool(self.memtable.entries or self.pending)

    # -- reading the file

    def read(self, width, flushing=None):
        """
        The file's runs and released handles: C{(runs, released set)}.

        @param flushing: the journal's generation at open, whose flush a crash
            may have cut short; None once the store runs. A bad last block of
            that generation is a torn tail (its entries are still in the
            journal): it is cut off and logged. Any other bad block (the
            blocks of earlier flushes were all synced) sets and raises
            C{damage}.
        """
        with open(self.path, "rb") as bucket_file:
            data = bucket_file.read()
        try:
            number, found_width = decode_bucket_header(data)
            if (number, found_width) != (self.number, width):
                raise DelayedFormatError(f"its header names bucket {number} of width"
                                         f" {found_width}", 0)
        except DelayedFormatError as problem:
            raise self._damaged(str(problem), problem.offset) from None
        blocks, stop, problem = decode_blocks(data, BUCKET_HEADER.size)
        if problem is not None:
            if sound_block_after(data, stop):
                raise self._damaged(f"the block at offset {stop} is bad ({problem}),"
                                    " yet sound blocks follow it", stop)
            if not torn_block(data, stop, flushing):
                raise self._damaged(f"its last block, at offset {stop}, is bad ({problem})"
                                    " though a flush synced it", stop)
            log.warn("delayed bucket {path}: dropped a torn tail of {size} bytes"
                     " at offset {offset} ({problem})",
                     path=self.path, size=len(data) - stop, offset=stop, problem=problem)
            with open(self.path, "r+b") as bucket_file:
                bucket_file.truncate(stop)
                os.fsync(bucket_file.fileno())
        runs, released = [], set()
        self.file_entries = self.file_released = self.blocks = 0
        for kind, flushed, payload in blocks:
            if kind == RUN:
                runs.append(run_of(payload))
                self.file_entries += len(runs[-1])
            elif kind == RELEASES:
                handles = handles_of(payload)
                released.update(handles)
                self.file_released += len(handles)
            self.blocks += 1
            self.flushed = max(self.flushed, flushed)
        self.size = stop
        return runs, released

    def _damaged(self, reason, offset):
        self.damage = StoreCorrupted(f"delayed bucket {self.path} is damaged: {reason}",
                                     self.path, offset)
        return self.damage

    def load(self, width):
        """Load the view (the file's runs, merged if there are many) if it is not loaded."""
        if self.damage is not None:
            raise self.damage
        if self.view is None:
            runs, self.released = self.read(width) if self.size else ([], set())
            self.view = runs
        if len(self.view) > MAX_RUNS:
            self.view = [merge_runs(self.view, None, TYPECODES)]
        return self.view

    def unload(self):
        self.view = self.released = None

    # -- flushing

    def flush(self, width, flushed):
        """
        Write what the memtable and C{pending} hold to the file, as blocks
        marked C{flushed} (C{(journal generation, entries covered)}), and empty
        them once the file is fsynced. Returns True if the file was created or
        replaced (the directory needs an fsync).
        """
        pending = self.pending
        memtable_runs = self.memtable.view(None)
        run = merge_runs(memtable_runs, pending.__contains__, TYPECODES) if memtable_runs else None
        in_memtable = {handle for memtable_run in memtable_runs for handle in memtable_run.handles}
        releases = [handle for handle in pending if handle not in in_memtable]
        released = self.file_released + len(releases)
        if self.size and (self.blocks + 2 > MAX_BLOCKS or (released >= REWRITE_RELEASED
                                                           and 2 * released >= self.file_entries)):
            created = self._rewrite(width, flushed, run, releases)
        else:
            created = self._append(width, flushed, run, releases)
        self.memtable, self.pending = MemoryBucket(TYPECODES), set()
        return created

    def _append(self, width, flushed, run, releases):
        blocks = []
        if run is not None and len(run):
            blocks.append(encode_run_block(flushed, run))
        if releases:
            blocks.append(encode_releases_block(flushed, releases))
        if not blocks:
            return False
        created = not self.size
        data = b"".join(blocks)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if created:
                header = encode_bucket_header(self.number, width)
                data, self.size = header + data, 0
            write_all(descriptor, data, self.size)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        self.size += len(data)
        self.blocks += len(blocks)
        self.flushed = flushed
        if run is not None and len(run):
            self.file_entries += len(run)
            if self.view is not None:
                self.view.append(run)
        self.file_released += len(releases)
        if self.released is not None:
            self.released.update(releases)
        return created

    def _rewrite(self, width, flushed, run, releases):
        """Replace the file by one run of its live entries and the memtable's."""
        runs = list(self.load(width))
        gone = set(self.released)
        gone.update(releases)
        if run is not None and len(run):
            runs.append(run)
        merged = merge_runs(runs, gone.__contains__, TYPECODES)
        data = encode_bucket_header(self.number, width) + encode_run_block(flushed, merged)
        replace_file(self.path, data, sync_directory=False)
        self.size, self.blocks, self.flushed = len(data), 1, flushed
        self.file_entries, self.file_released = len(merged), 0
        self.view, self.released = [merged], set()
        return True

    def remove(self):
        """Delete the file (every entry is released); True if there was one."""
        self.unload()
        if not self.size:
            return False
        os.unlink(self.path)
        self.size = 0
        return True
