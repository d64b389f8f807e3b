"""The reactor thread's part of chunked compaction, mixed into L{ChunkedStore}.

Each commit's L{BatchWritten} may name a slice of held records to copy
(C{compaction}): they are read on the reactor's thread pool, so that neither
the reactor thread nor the writer waits for the disk, and placed at the head
of the log in the batch being buffered; the commit that writes them hands the
pairs (handle, new position) back (C{moved}), and the store reads a moved
handle there from then on (C{_moves}), until no queue holds it (C{unmoved}).
A store with a sparse chunk waiting to be quiet long enough commits by itself
when it is due (C{compaction_due_in}), so an idle broker compacts too.
"""

from twisted.logger import Logger

from backends.chunked.compaction import place_copies, read_slice

log = Logger()


class CompactingStore:
    """
    Needs the store's C{_reactor}, C{_commit}, C{_state}, C{directory},
    C{_batch}, C{_position} and C{_data_size}.

    @ivar _moves: handle -> position of its record, for the held messages
        compaction moved.
    """

    _nudge = None  # the call that commits once a sparse chunk is due for compaction
    _slice_reading = None  # the Deferred of a compaction slice being read, if one is

    def _follow_compaction(self, written):
        """Take in what a commit's L{BatchWritten} says of compaction."""
        if written.moved:
            self._moves.update(written.moved)
        for handle in written.unmoved:
            self._moves.pop(handle, None)
        if written.compaction:
            self._slice_reading = read_slice(self._reactor, self.directory, self._data_size, written.compaction)
            self._slice_reading.addCallbacks(self._place_copies, self._slice_unreadable)
        elif written.compaction_due_in and self._nudge is None:
            self._nudge = self._reactor.callLater(written.compaction_due_in, self._commit_for_compaction)

    def _place_copies(self, read):
        self._slice_reading = None
        if self._state == "open":
            self._position = place_copies(self._batch, self._position, self._data_size, *read)

    def _slice_unreadable(self, failure):
        self._slice_reading = None
        if self._state == "open":
            log.error("records to compact cannot be read: {problem}", problem=failure.value)
            self._batch.slice_dropped = True  # the writer leaves their chunk alone

    def _commit_for_compaction(self):
        """A sparse chunk is due for compaction: commit, even with nothing buffered, so that it starts."""
        self._nudge = None
        if self._state == "open":
            self._commit.sync().addErrback(lambda failure: None)  # a failed commit fails its own syncs too

    def _stop_following(self):
        """The store closes: no more commits for compaction."""
        nudge, self._nudge = self._nudge, None
        if nudge is not None and nudge.active():
            nudge.cancel()
