"""The life every durable store's writer thread shares: its file work runs on
the writer thread of one L{GroupCommit}, which opens the files, commits each
batch and is stopped at close.

A store owns one L{WriterThread}. Opening it starts the writer, opens the
files on it and has the store take in what they hold on the reactor thread; a
failed open stops the writer again and leaves the store closed; C{close}
commits what is buffered, stops the writer and closes the files, and waits
first for an open under way. The reactor thread owns the store; the writer
thread owns the store's files object, and the two meet only through values:
what the files' C{open} returns, the batches the store's C{take_batch} hands
over, and what each C{write_batch} returns (given to the store's
C{on_written}).
"""

from twisted.internet import defer

from brokerd.storage.durability import CommitFailures, CommitLedger, GroupCommit


class WriterThread:
    """
    The open / sync / close half of a durable store.

    @param name: the store's name, for errors and the thread's name.
    @param policy: the L{brokerd.storage.durability.SyncPolicy}.
    @param reactor: the clock and thread pool caller the L{GroupCommit} runs on.
    @param take_batch: on the reactor thread, what the store buffered, or None.
    @param close_files: on the reactor thread, once the writer thread has
        stopped (after an open that failed, too).
    @param on_written: if given, on the reactor thread, what a commit's
        C{write_batch} returned, before the syncs it covers fire.
    @param lost_in: if given, on the reactor thread, the C{(queue, handle)} of
        the appends in the batch of a failed commit.

    @ivar state: C{new}, C{opening}, C{open}, C{closing} (the final commit is
        under way) or C{closed}.
    @ivar commit: the L{GroupCommit}, from open on (None before).
    @ivar failures: the L{CommitFailures} of the commits, watched from before open on.
    @ivar ledger: the L{CommitLedger} that numbers the commits, from before open on.
    """

    def __init__(self, name, policy, reactor, take_batch, close_files, on_written=None,
                 lost_in=None):
        self.name = name
        self.policy = policy
        self.state = "new"
        self.commit = None
        self._reactor = reactor
        self._take_batch = take_batch
        self._close_files = close_files
        self._on_written = on_written
        self._lost_in = lost_in
        self.failures = CommitFailures(name)
        self.ledger = CommitLedger()
        self.start_listeners = []  # told as each commit starts (GroupCommit's on_start)
        self._open_waiters = []  # Deferreds of close() calls made while opening

    @defer.inlineCallbacks
    def open(self, open_files, write_batch, take_in):
        """
        Start the writer thread committing batches with C{write_batch}, run
        C{open_files} on it and give what it returns to C{take_in} on the
        reactor thread; then the store is open. If either fails, the writer
        is stopped, the files are closed and the failure is passed on.
        """
        if self.state != "new":
            raise RuntimeError(f"the {self.name} store was opened before")
        self.state = "opening"
        self.commit = GroupCommit(self._take_batch, write_batch, self.policy, self._reactor,
                                  name=self.name, on_written=self._on_written,
                                  lost_in=self._lost_in, failures=self.failures,
                                  ledger=self.ledger, on_start=self.start_listeners)
        self.commit.start()
        try:
            found = yield self.commit.call(open_files)
            take_in(found)
        except BaseException:
            self.state = "closed"
            try:
                yield self._shut_down()
            finally:
                self._opening_ended()
            raise
        self.state = "open"
        self._opening_ended()

    def _opening_ended(self):
        waiters, self._open_waiters = self._open_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def sync(self):
        """The L{GroupCommit}'s sync, once the store is open; a failed Deferred otherwise."""
        if self.state != "open":
            return defer.fail(RuntimeError(f"the {self.name} store is not open"))
        return self.commit.sync()

    def call(self, function, *args, **kwargs):
        """Run C{function} on the writer thread, after every commit already started
        (a Deferred of its result)."""
        return self.commit.call(function, *args, **kwargs)

    def commit_times(self):
        """The L{brokerd.storage.durability.CommitTimes} of the commits (None before the store
        opens)."""
        commit = self.commit
        return commit.commit_times if commit is not None else None

    def figures(self):
        """Commits and fsyncs so far, for the store's stats()."""
        commit = self.commit
        return {
            "commits": commit.commits if commit is not None else 0,
            "fsyncs": commit.fsyncs if commit is not None else 0,
        }

    @defer.inlineCallbacks
    def close(self):
        """Commit what is buffered (fsynced unless the policy is none), stop the writer and close
        the files."""
        if self.state == "opening":
            waiter = defer.Deferred()
            self._open_waiters.append(waiter)
            yield waiter
        if self.state != "open":
            self.state = "closed"
            return
        self.state = "closing"
        try:
            yield self._shut_down()
        finally:
            self.state = "closed"

    @defer.inlineCallbacks
    def _shut_down(self):
        try:
            if self.commit is not None:
                yield self.commit.stop()
        finally:
            self._close_files()


def appends_in(batch):
    """The C{(queue, handle)} of the appends in a batch whose C{appends} maps each queue to
    its handles (the chunked and filelog stores' batches)."""
    return [(queue, handle) for queue, handles in batch.appends.items() for handle in handles]
