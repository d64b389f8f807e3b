"""The life every durable store shares: its file work runs on the writer thread
of one L{GroupCommit}, which opens the files, commits each batch and is
stopped at close.

A L{WriterThreadStore} starts the writer, opens the files on it and takes in
what they hold on the reactor thread; a failed open stops the writer again
and leaves the store closed; C{close} commits what is buffered, stops the
writer and closes the files, and waits first for an open under way. The
reactor thread owns the store object; the writer thread owns the files object
(the subclass's), and the two meet only through values: what the files'
C{open} returns, the batches C{_take_batch} hands over, and what each
C{write_batch} returns (given to C{_batch_written}).
"""

from twisted.internet import defer
from zope.interface import implementer

from brokerd.interfaces import ITimedCommits
from brokerd.storage.durability import GroupCommit


@implementer(ITimedCommits)
class WriterThreadStore:
    """
    The open / sync / close half of a durable store.

    A subclass sets C{name}, C{sync_policy} and C{_reactor} (the clock and
    thread pool caller the L{GroupCommit} runs on), calls L{_open} from its
    C{open}, and provides:

      - C{_take_batch()}: on the reactor thread, what is buffered, or None;
      - C{_close_files()}: on the reactor thread, once the writer thread has
        stopped (after an open that failed, too);
      - C{_batch_written(result)} (optional): on the reactor thread, what a
        commit's C{write_batch} returned, before the syncs it covers fire.

    @ivar _state: C{new}, C{opening}, C{open}, C{closing} (the final commit
        is under way) or C{closed}.
    """

    name = "store"
    _state = "new"
    _commit = None  # the GroupCommit, from open on
    _batch_written = None

    @defer.inlineCallbacks
    def _open(self, open_files, write_batch, take_in):
        """
        Start the writer thread committing batches with C{write_batch}, run
        C{open_files} on it and give what it returns to C{take_in} on the
        reactor thread; then the store is open. If either fails, the writer
        is stopped, the files are closed and the failure is passed on.
        """
        if self._state != "new":
            raise RuntimeError(f"the {self.name} store was opened before")
        self._state = "opening"
        self._open_waiters = []  # Deferreds of close() calls made while opening
        self._commit = GroupCommit(self._take_batch, write_batch, self.sync_policy, self._reactor, name=self.name,
                                   on_written=self._batch_written)
        self._commit.start()
        try:
            found = yield self._commit.call(open_files)
            take_in(found)
        except BaseException:
            self._state = "closed"
            try:
                yield self._shut_down()
            finally:
                self._opening_ended()
            raise
        self._state = "open"
        self._opening_ended()

    def _opening_ended(self):
        waiters, self._open_waiters = self._open_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def sync(self):
        if self._state != "open":
            return defer.fail(RuntimeError(f"the {self.name} store is not open"))
        return self._commit.sync()

    def commit_times(self):
        """The L{brokerd.storage.durability.CommitTimes} of this store's commits (None before it opens)."""
        commit = self._commit
        return commit.commit_times if commit is not None else None

    def _commit_stats(self):
        """Commits and fsyncs so far, for stats()."""
        commit = self._commit
        return {
            "commits": commit.commits if commit is not None else 0,
            "fsyncs": commit.fsyncs if commit is not None else 0,
        }

    @defer.inlineCallbacks
    def close(self):
        """Commit what is buffered (fsynced unless the policy is none), stop the writer and close the files."""
        if self._state == "opening":
            waiter = defer.Deferred()
            self._open_waiters.append(waiter)
            yield waiter
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closing"
        try:
            yield self._shut_down()
        finally:
            self._state = "closed"

    @defer.inlineCallbacks
    def _shut_down(self):
        try:
            if self._commit is not None:
                yield self._commit.stop()
        finally:
            self._close_files()
