"""Bringing the chunk bytes just ahead of a queue's deliveries into the page
cache, on a thread of its own.

The reactor thread reads paged messages through maps of the chunk files. A
record that is not in the page cache (chunks are written with direct I/O, so
nothing just written is; nor is anything after a restart) is read from the
disk by the page fault itself, with the interpreter lock held: every
connection waits. L{ReadAhead} keeps a window of each chunk ahead of the
reads in the page cache: when a read comes within half a window of what was
asked for, the next window is handed to its thread, which reads it with
C{pread} (the lock let go while the disk works) into a scratch buffer and
throws the bytes away; the faults that follow find the pages cached.

Where the queue's messages are large, the thread also checks the CRCs of the
records it brought in (a second C{pread}, from the page cache), so that the
reactor thread, which checked every body it delivered (a fifth of its time
with 64 KiB messages), checks only their framing. What it has checked is one
run of records per chunk (L{ReadAhead.checked}); a damaged record ends the
run, and the reactor's own check finds it. Small records are left to the
reactor thread: walking them would cost this thread more of the interpreter
lock than their CRCs cost the reactor.
"""

import os
import threading
from queue import SimpleQueue

from twisted.logger import Logger

from backends.chunked.format import sound_records

log = Logger()

READ_SIZE = 1 << 20  # bytes the thread reads at a time
# A read of a body this large asks the thread to check the CRCs of what it reads ahead.
CHECK_AHEAD_BODY = 4096
_STOP = None


class ReadAhead:
    """
    Read-ahead for the chunks of one store: C{ahead} (called on the reactor
    thread as records are read) asks for the next window; the thread reads it.

    @ivar window: bytes read ahead of a read (0: none).
    @ivar half: half of it: a read that comes this close to what was asked for asks for more.
    @ivar requested: file offset, per chunk number, up to which read-ahead was asked for.
    @ivar checked: C{(first, end)} file offsets, per chunk number: the records
        starting from C{first} up to C{end} were read whole by the thread and
        their CRCs found right. The thread replaces the pair; the reactor
        thread only reads it.
    @ivar bytes_read: bytes the thread has read (for stats and tests).
    @ivar bytes_checked: bytes of records whose CRCs the thread has checked.
    """

    def __init__(self, window, path_of):
        self.window = window
        self.half = window >> 1
        self.path_of = path_of
        self.requested = {}
        self.checked = {}
        self.bytes_read = 0
        self.bytes_checked = 0
        self._work = SimpleQueue()
        self._thread = None

    def ahead(self, number, offset, end, check=False):
        """
        A record at file offset C{offset} of chunk C{number} was read, and
        the chunk is written up to C{end}: ask for the next window if the
        read came within half a window of what was asked for, and (C{check})
        for the CRCs of its records to be checked.
        """
        requested = self.requested.get(number, 0)
        if offset + self.half < requested:
            return
        start = max(requested, offset)
        stop = min(start + self.window, end)
        if stop <= start:
            return
        self.requested[number] = stop
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chunked read-ahead",
                                            daemon=True)
            self._thread.start()
        self._work.put((number, self.path_of(number), start, stop, offset if check else None))

    def forget(self, number):
        """Chunk C{number} was deleted: nothing more to read of it."""
        self.requested.pop(number, None)
        self.checked.pop(number, None)

    def close(self):
        """Stop the thread once it has done what it was asked (a chunk deleted meanwhile is
        skipped)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._work.put(_STOP)
            thread.join()
        self.requested.clear()
        self.checked.clear()

    def _run(self):
        scratch = bytearray(READ_SIZE)
        while True:
            request = self._work.get()
            if request is _STOP:
                return
            number, path, start, stop, record = request
            try:
                descriptor = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # the chunk went while the request waited
            except OSError as problem:
                log.warn("read-ahead of {path} failed: {problem}", path=path, problem=problem)
                continue
            try:
                self._read(descriptor, scratch, start, stop)
                if record is not None:
                    self._check(descriptor, number, record, stop)
            except OSError as problem:
                log.warn("read-ahead of {path} failed: {problem}", path=path, problem=problem)
            finally:
                os.close(descriptor)

    def _read(self, descriptor, scratch, start, stop):
        view = memoryview(scratch)
        offset = start
        while offset < stop:
            count = os.preadv(descriptor, [view[: min(READ_SIZE, stop - offset)]], offset)
            if count <= 0:
                return
            offset += count
            self.bytes_read += count

    def _check(self, descriptor, number, record, stop):
        """
        Check the CRCs of the whole records from the one at C{record} (or
        from the end of the run already checked, if that run reaches it) up
        to C{stop}, and extend or replace the chunk's checked run.
        """
        first, end = self.checked.get(number, (0, 0))
        if not first <= record <= end:
            first = end = record  # a new run, from the record just read
        if end >= stop:
            return
        span = os.pread(descriptor, stop - end, end)  # in the page cache now
        sound, _ = sound_records(span, 0, len(span))
        if sound and number in self.requested:  # not deleted meanwhile
            self.checked[number] = (first, end + sound)
            self.bytes_checked += sound
