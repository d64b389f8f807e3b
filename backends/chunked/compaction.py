"""Compaction of sparse message chunks: the writer thread's L{Compactor} and
the reactor thread's L{CompactionFollower}.

A finished message chunk is deleted once nothing points into it; a queue
that keeps a few messages in every chunk (a parked queue) would keep every
chunk. So a finished chunk whose held records are a small share of it (under
C{below} of its bytes, counting bodies and record framing but not heads, once
that share has not changed for C{quiet} seconds) has its held records copied
forward to the head of the log and is then deleted like a consumed one. A
chunk holding a kept delayed message is left alone (those are never moved),
and so is the last sparse chunk: moving it would only make the chunk its
copies land in sparse in turn. So the message chunks take at most what is
held divided by C{below}, plus two chunks. Handles do not change: the pairs
(handle, new position) go to the moves file (L{backends.chunked.movesfile})
and reads of a moved handle follow them.

One compaction goes in slices, each at most C{slice_bytes} of held records
(and at least one record), so that no commit carries much more than its own
work and publishers' confirms are not held up:

  1. commit I{k}: the writer picks a slice of held records of the chunk and
     hands their positions back with the commit's result;
  2. the reactor thread has them read on its thread pool (one pread of the
     span they cover) and places the copies in its next batch, at the head
     of the log, with the pairs (handle, new position);
  3. the commit of that batch: the writer writes the copies with its
     records and fsyncs the log (whatever the sync policy), then appends the
     pairs of the handles still held to the moves file, then counts the
     moved records in their new chunks, and picks the next slice;
  4. once the chunk holds nothing, it is deleted as consumed chunks are,
     the moves file fsynced first: the moves that emptied it are durable
     before it goes.

A crash before the moves record is durable leaves the copies unreferenced
(dead bytes in a newer chunk) and the old records in place; one after it
leaves the old chunk unreferenced, and opening deletes it. Either way each
held message is read from exactly one record, once: the queue indexes are
never rewritten.
"""

import time
from collections import deque

from twisted.internet import threads
from twisted.logger import Logger

from backends.chunked.chunkfiles import read_run
from backends.chunked.format import RECORD_OVERHEAD

log = Logger()

# A slice's records are read in one pread of a span up to this many times its bytes.
SPAN_PER_SLICE = 8


class Compactor:
    """
    Chooses sparse chunks and hands out their held records a slice at a
    time, on the writer thread; makes the copies a commit wrote count.

    @param log: the L{MessageLog}.
    @param references: the L{ChunkReferences} of its chunks.
    @param moves: the L{MovesFile}.
    @param indexes: the L{QueueIndexSet}, which says what is held where.
    @param held: the L{Held} counts, which say what is shared.

    @ivar moving: handle -> body length, of the held records of the chunk
        being compacted not yet moved (those handed out included); a
        handle leaves it when moved or when no queue holds it any more
        (L{let_go}). Read it, never change it from outside.
    """

    def __init__(self, log, references, moves, indexes, held, below, slice_bytes, quiet):
        self._log = log
        self._references = references
        self._moves = moves
        self._indexes = indexes
        self._held = held
        self.below = below  # a share of a chunk's bytes (0 to 1); 0 turns compaction off
        self.slice_bytes = slice_bytes
        self.quiet = quiet  # seconds a chunk's held bytes stay the same before it is compacted
        self.number = None  # the chunk being compacted
        self.moving = {}
        self.compacted_chunks = 0
        self.compacted_bytes = 0
        # something was released or a chunk finished since the last look for a sparse chunk
        self._changed = True
        self._pending = deque()  # handles of the chunk not yet handed out, in position order
        self._handed = []  # handles of the last slice handed out
        self._left_alone = set()  # chunks with a damaged record: never compacted
        # chunk number -> (entries into it, since when, held bytes or None), of sparse ones
        self._seen = {}
        self.due_in = 0.0  # seconds until a sparse chunk waiting to be quiet is, if one is (else 0)

    def look_again(self):
        """Something was released or a chunk finished: look for a sparse chunk at the next slice."""
        self._changed = True

    def let_go(self, handle):
        """No queue holds C{handle} any more: it is not to be moved."""
        self.moving.pop(handle, None)

    # -- choosing

    def _choose(self):
        """
        Start on the sparsest finished chunk under the limit whose held
        records have not changed for C{quiet} seconds (a chunk its consumers
        are still acking is not copied), if there is another such chunk: the
        last sparse chunk is left as it is, or a few held messages would be
        copied again with every chunk the log fills. A chunk's held bytes are
        counted here, from the queue indexes, and only again once the number
        of entries pointing into it has changed.
        """
        self._changed = False
        message_log, references = self._log, self._references
        log_chunks, data_size = message_log.chunks, message_log.data_size
        limit = self.below * data_size
        now, seen, watched, moved_into = time.monotonic(), self._seen, {}, None
        best, best_held, quiet, due_in = None, limit, 0, 0.0
        for number, figures in log_chunks.items():
            entries = references.entries(number)
            if (not entries or references.delayed_entries(number) or 0 < figures.records <= entries
                    or not message_log.deletable(number) or number in self._left_alone):
                continue
            previous = seen.get(number)
            if previous is not None and previous[0] == entries:
                since, held = previous[1], previous[2]
            else:
                since, held = now, None
            if now - since < self.quiet:
                watched[number] = (entries, since, None)
                self._changed = True  # look again with the next commit
                wait = since + self.quiet - now
                due_in = min(due_in, wait) if due_in else wait
                continue
            if held is None:
                if moved_into is None:
                    moved_into = self._moved_into()
                found = self._held_in(number, moved_into)
                held = sum(found.values()) + len(found) * RECORD_OVERHEAD
            watched[number] = (entries, since, held)
            if held < limit:
                quiet += 1
                if held < best_held:
                    best, best_held = number, held
        self._seen, self.due_in = watched, due_in
        if quiet < 2:
            return
        found = self._held_in(best, self._moved_into() if moved_into is None else moved_into)
        if not found:  # entries point into it, yet no queue holds a record there: leave it as it is
            self._left_alone.add(best)
            return
        moves = self._moves.pairs
        self.number = best
        self.moving = found
        self._pending = deque(sorted(found, key=lambda handle: moves.get(handle, handle)))
        log.info("compacting message chunk {number}: {count} held records,"
                 " about {held} of {size} bytes",
                 number=best, count=len(found), held=best_held, size=data_size)

    def _moved_into(self):
        """Chunk number -> handles moved into it."""
        data_size, moved_into = self._log.data_size, {}
        for handle, position in self._moves.pairs.items():
            moved_into.setdefault(position // data_size, []).append(handle)
        return moved_into

    def _held_in(self, number, moved_into):
        """The held records in chunk C{number}: C{{handle: body length}}."""
        data_size = self._log.data_size
        low, high = number * data_size, (number + 1) * data_size
        moves, indexes = self._moves.pairs, self._indexes.values()
        found = {}
        for index in indexes:
            for handle, size in index.held_between(low, high):
                if handle not in moves:
                    found[handle] = size
        for handle in moved_into.get(number, ()):
            for index in indexes:
                size = index.held_size(handle)
                if size is not None:
                    found[handle] = size
                    break
        return found

    # -- slices

    def next_slice(self):
        """
        The next slice of held records to copy forward: a tuple of C{(handle,
        position)} pairs, in position order and all in one chunk, empty if
        there is nothing to move (or a slice is out). The reactor thread has
        them read and places the copies in a later batch (or marks the batch
        C{slice_dropped} if they cannot be read). The writer asks only while
        it knows every entry and kept delayed message (nothing is moved
        while something may point anywhere).
        """
        if not self.below or self._handed:
            return ()
        if self.number is None:
            if not self._changed:
                return ()
            self._choose()
            if self.number is None:
                return ()
        pending, moving, moves = self._pending, self.moving, self._moves.pairs
        taken, positions, size = [], [], 0
        span_limit = SPAN_PER_SLICE * self.slice_bytes
        while pending and (not taken or size < self.slice_bytes):
            handle = pending[0]
            if handle in moving:
                position = moves.get(handle, handle)
                if taken and position - positions[0] > span_limit:
                    break
                taken.append(handle)
                positions.append(position)
                size += moving[handle] + RECORD_OVERHEAD
            pending.popleft()
        if not taken:
            if not moving:
                self._finished()
            return ()
        self._handed = taken
        return tuple(zip(taken, positions))

    def apply_moves(self, moves, dropped=False):
        """
        Make a batch's copies (written and fsynced) the records of their
        messages: their pairs go to the moves file (fsynced before any chunk
        is deleted), then the records count in their new chunks. The pairs
        taken, for the reactor.
        """
        accepted = self.accept(moves, dropped)
        if not accepted:
            return {}
        data_size, known = self._log.data_size, self._moves.pairs
        olds = [known.get(handle, handle) // data_size for handle, _, _ in accepted]
        self._moves.append([(handle, position) for handle, position, _ in accepted])
        references, shared = self._references, self._held.shared
        moved = {}
        for (handle, position, _), old in zip(accepted, olds):
            references.move(old, position // data_size, shared.get(handle, 1))
            moved[handle] = position
        return moved

    def accept(self, moves, dropped=False):
        """
        The C{(handle, position, body length)} of a batch's moves whose
        handles are still held (the others' copies are left unreferenced);
        handles of the last slice the batch did not move are taken up again.
        A batch with neither (the slice is still being read) changes nothing;
        one whose slice could not be read (C{dropped}) leaves its chunk alone.
        """
        if dropped and self.number is not None:
            log.error("message chunk {number} is not compacted: a record in it cannot be read",
                      number=self.number)
            self._left_alone.add(self.number)
            self._drop()
            return []
        if not moves:
            return []
        moving, accepted = self.moving, []
        for handle, position in moves:
            size = moving.pop(handle, None)
            if size is not None:
                accepted.append((handle, position, size))
                self.compacted_bytes += size + RECORD_OVERHEAD
        handed, self._handed = self._handed, []
        returned = [handle for handle in handed if handle in moving]
        if returned:
            self._pending.extendleft(reversed(returned))
        if self.number is not None and not moving and not self._pending:
            self._finished()
        return accepted

    def _finished(self):
        self.compacted_chunks += 1
        self._drop()

    def _drop(self):
        self.number, self.moving, self._pending, self._handed = None, {}, deque(), []
        self._changed = True


class CompactionFollower:
    """
    The reactor thread's part of compaction: what each commit's
    L{BatchWritten<backends.chunked.handover.BatchWritten>} says of it.

    A commit may name a slice of held records to copy (C{compaction}): they
    are read on the reactor's thread pool, so that neither the reactor
    thread nor the writer waits for the disk, and handed to C{place_copies}
    (which puts them at the head of the log in the batch being buffered), or
    C{drop_slice} is called if they cannot be read. The commit that writes
    them hands back the pairs (handle, new position) (C{moved}): a moved
    handle's record is read where L{moves} says from then on, until no queue
    holds it (C{unmoved}). While a sparse chunk waits to be quiet long
    enough, the store commits by itself when it is due (C{compaction_due_in}),
    so an idle broker compacts too.

    @param writer_thread: the store's L{WriterThread<backends.common.writer_thread.WriterThread>}:
        nothing is placed nor committed unless it is open.

    @ivar moves: handle -> position of its record, for the held messages
        compaction moved (read it, never change it from outside).
    @ivar reading: the Deferred of a slice being read, if one is.
    """

    def __init__(self, reactor, directory, writer_thread, place_copies, drop_slice):
        self.moves = {}
        self.reading = None
        self._reactor = reactor
        self._directory = directory
        self._writer_thread = writer_thread
        self._place_copies = place_copies
        self._drop_slice = drop_slice
        self._data_size = 0
        self._nudge = None  # the call that commits once a sparse chunk is due for compaction

    def recovered(self, moves, data_size):
        """Take what the writer's open found: the moves of held messages, and the log's chunk data
        size."""
        self.moves = dict(moves)
        self._data_size = data_size

    def follow(self, written):
        """Take in what a commit's L{BatchWritten<backends.chunked.handover.BatchWritten>} says
        of compaction."""
        if written.moved:
            self.moves.update(written.moved)
        for handle in written.unmoved:
            self.moves.pop(handle, None)
        if written.compaction:
            self.reading = self._read_slice(written.compaction)
            self.reading.addCallbacks(self._slice_read, self._slice_unreadable)
        elif written.compaction_due_in and self._nudge is None:
            self._nudge = self._reactor.callLater(written.compaction_due_in,
                                                  self._commit_for_compaction)

    def _read_slice(self, pairs):
        """
        A Deferred firing with C{(handles, records)} of a slice's C{(handle,
        position)} pairs, the records read on the reactor's thread pool, so
        that neither the reactor thread nor the writer (and so no publisher's
        confirm) waits for the disk.
        """
        handles = [handle for handle, _ in pairs]
        positions = [position for _, position in pairs]
        reactor = self._reactor
        reading = threads.deferToThreadPool(reactor, reactor.getThreadPool(), read_run,
                                            self._directory, self._data_size, positions)
        return reading.addCallback(lambda records: (handles, records))

    def _slice_read(self, read):
        self.reading = None
        if self._writer_thread.state == "open":
            self._place_copies(*read)

    def _slice_unreadable(self, failure):
        self.reading = None
        if self._writer_thread.state == "open":
            log.error("records to compact cannot be read: {problem}", problem=failure.value)
            self._drop_slice()  # the writer leaves their chunk alone

    def _commit_for_compaction(self):
        """A sparse chunk is due for compaction: commit, even with nothing buffered, so that it
        starts."""
        self._nudge = None
        if self._writer_thread.state == "open":
            # A failed commit fails its own syncs too.
            self._writer_thread.sync().addErrback(lambda failure: None)

    def stop(self):
        """The store closes: no more commits for compaction."""
        nudge, self._nudge = self._nudge, None
        if nudge is not None and nudge.active():
            nudge.cancel()
