"""The one owner of durability: when a store's buffered writes reach the disk.

A durable store buffers appends, acks and topology changes on the reactor
thread and hands them over in batches. L{GroupCommit} writes each batch on one
writer thread (so neither fsync nor SQLite ever blocks the reactor) and fires
the Deferreds of every C{sync()} made before the batch was taken once the batch
is as safe as the sync policy promises:

  - C{always} (the default): the batch is fsynced before the syncs fire; every
    sync caller of a reactor turn, and every one that arrives while a commit is
    running, shares one fsync (group commit);
  - C{interval:MS}: batches are written and fsynced every MS milliseconds, and
    syncs fire after that fsync;
  - C{none}: syncs fire once the batch is written to the OS, without fsync
    (unsafe on power loss).

Writes nobody syncs on are committed within C{IDLE_COMMIT_SECONDS} anyway.

The two threads share no mutable object: the reactor thread owns what it
buffers until C{take_batch} hands it over, the writer thread owns its files,
and what a commit tells the store (positions reached, files removed, figures)
comes back as the value C{write_batch} returns, handed to C{on_written} on the
reactor thread. Time and scheduling come from the reactor given, never from
the global one. Each commit's duration, on that reactor's clock, goes into the
L{CommitTimes} histogram the metrics show.

A commit that fails (a full disk: C{ENOSPC}) fails the syncs it covers, and
L{CommitFailures} tells whoever watches the store which appends it lost, so
that the broker takes those messages out of their queues rather than deliver
what it nacked. A run of failed commits is logged once, when it starts, and
once more when commits succeed again, whatever the number of publishes.

A commit may take writes whose writer has not called C{sync()} yet (the idle
commit, or one another writer's sync started); if it fails and the next one
succeeds, that later C{sync()} alone would report them safe. The
L{CommitLedger} numbers the commits and remembers which failed, so a writer
that notes the number when it writes can tell (the publisher confirms do).
"""

import bisect
import errno
from collections import deque

from twisted.internet import defer, threads
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from brokerd.interfaces import ICommitFailures

log = Logger()

IDLE_COMMIT_SECONDS = 0.1
FAILED_COMMITS_REMEMBERED = 4096


class SyncPolicy:
    """
    A parsed C{--sync} value, and where a store's commits run.

    @ivar mode: C{"always"}, C{"interval"} or C{"none"}.
    @ivar interval: seconds between commits in C{interval} mode.
    @ivar on_reactor_thread: commits run on the reactor's thread, not on a writer
        thread of their own (L{on_reactor}).
    """

    MODES = ("always", "interval", "none")

    def __init__(self, mode="always", interval=0.1, on_reactor_thread=False):
        if mode not in self.MODES:
            raise ValueError(f"unknown sync mode {mode!r}; use always, interval:MS or none")
        self.mode = mode
        self.interval = interval
        self.on_reactor_thread = on_reactor_thread

    def on_reactor(self):
        """
        This policy with commits made on the reactor's thread: for a store whose
        reactor has nothing else to do meanwhile (a cluster follower's, which only
        applies the leader's operations), where handing each commit to a thread and
        back (and the interpreter lock to and fro while both run Python) costs more
        than the commit's own wait for the disk.
        """
        return SyncPolicy(self.mode, self.interval, on_reactor_thread=True)

    @classmethod
    def parse(cls, text):
        """C{always}, C{none} or C{interval:MS} (MS > 0, default 100)."""
        mode, _, argument = text.partition(":")
        if mode == "interval":
            try:
                milliseconds = int(argument or "100")
                if milliseconds <= 0:
                    raise ValueError
            except ValueError:
                raise ValueError("interval needs a positive number of milliseconds,"
                                 f" not {argument!r}") from None
            return cls("interval", milliseconds / 1000.0)
        if argument:
            raise ValueError(f"sync mode {mode!r} takes no argument")
        return cls(mode)

    @property
    def fsyncs(self):
        """True if commits end with an fsync."""
        return self.mode != "none"

    def __str__(self):
        return f"interval:{round(self.interval * 1000)}" if self.mode == "interval" else self.mode

    def __repr__(self):
        on_reactor = ", on_reactor_thread=True" if self.on_reactor_thread else ""
        return f"SyncPolicy({str(self)!r}{on_reactor})"


COMMIT_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class CommitTimes:
    """
    How long a store's commits took, from the reactor's hand-over to the
    writer thread until the reactor hears back (fsync included): the counts
    per upper bound of L{COMMIT_SECONDS_BUCKETS} (not cumulative; the last one
    counts the longer ones), their sum and their number, for a histogram metric.
    """

    def __init__(self, bounds=COMMIT_SECONDS_BUCKETS):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total_seconds = 0.0
        self.count = 0

    def observe(self, seconds):
        """One commit took C{seconds}."""
        self.count += 1
        self.total_seconds += seconds
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1


class CommitFailures:
    """
    The failed commits of one store: who hears of them, and the log lines.

    @ivar failing: True from a failed commit until the next one succeeds.
    @ivar failed: commits failed since start.
    """

    def __init__(self, name):
        self.name = name
        self.failing = False
        self.failed = 0
        self._run = 0  # commits failed in the current run
        self._listeners = []

    def watch(self, listener):
        """
        Call C{listener(failure, lost)} on the reactor thread after each failed
        commit, before its syncs fail: C{lost} is a list of C{(queue, handle)}
        of the appends that commit held, which the store does not keep.
        """
        self._listeners.append(listener)

    def commit_failed(self, failure, lost):
        self.failed += 1
        self._run += 1
        if not self.failing:
            self.failing = True
            if failure.check(OSError) or is_out_of_space(failure):
                log.error(
                    "{name} store: a commit failed ({problem}); the publishes it covers are"
                    " nacked and taken out of their queues; further failures are not logged"
                    " until a commit succeeds", name=self.name, problem=_os_problem(failure.value),
                )
            else:
                log.failure("{name} store: a commit failed; the publishes it covers are nacked"
                            " and taken out of their queues; further failures are not logged"
                            " until a commit succeeds", failure, name=self.name)
        for listener in self._listeners:
            try:
                listener(failure, lost)
            except Exception:
                log.failure("{name} store: a watcher of failed commits failed", name=self.name)

    def commit_succeeded(self):
        if self.failing:
            self.failing = False
            log.info("{name} store: commits succeed again, after {count} failed",
                     name=self.name, count=self._run)
            self._run = 0


class CommitLedger:
    """
    Which commit takes what a store is given now, and which commits failed.

    What is written while C{started} is N goes in commit N + 1 (commits are
    numbered from 1, in the order they take their batches). The numbers of the
    last L{FAILED_COMMITS_REMEMBERED} failed commits are kept; a commit numbered
    at or below the last one forgotten is said to have failed, which errs on
    the side of a nack.

    @ivar started: how many commits have taken their batch.
    """

    def __init__(self, remembered=FAILED_COMMITS_REMEMBERED):
        self.started = 0
        self._remembered = remembered
        self._failed = set()
        self._failed_order = deque()
        self._forgotten_through = 0  # the last failed commit no longer remembered

    def took_batch(self):
        """A commit took its batch: its number."""
        self.started += 1
        return self.started

    def commit_failed(self, number):
        self._failed.add(number)
        self._failed_order.append(number)
        if len(self._failed_order) > self._remembered:
            self._forgotten_through = self._failed_order.popleft()
            self._failed.discard(self._forgotten_through)

    def failed(self, number):
        """Whether commit C{number} failed (or may have: see the class)."""
        return number in self._failed or number <= self._forgotten_through

    def lost(self, started):
        """Whether what was written while C{started} was C{started} was lost: the commit that
        took it failed."""
        return self.failed(started + 1)


def commit_ledger_of(store):
    """The L{CommitLedger} of C{store}'s commits; for a store whose commits cannot fail (not an
    L{ICommitFailures}), one in which no commit ever starts or fails."""
    return store.commit_ledger() if ICommitFailures.providedBy(store) else CommitLedger()


def _os_problem(error):
    if not isinstance(error, OSError) or not error.strerror:
        return str(error)
    return f"{errno.errorcode.get(error.errno, error.errno)}: {error.strerror}"


def is_out_of_space(failure):
    """Whether C{failure} is a write refused for want of space (a full disk or quota)."""
    error = failure.value if failure.check(OSError) else None
    if error is None:
        # SQLite says it in words: "database or disk is full".
        return "disk is full" in str(failure.value)
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


class GroupCommit:
    """
    Commits one store's batches on a writer thread, in order (on the reactor's
    thread, for a policy made L{on_reactor<SyncPolicy.on_reactor>}).

    @param take_batch: called on the reactor thread; returns what was buffered
        since the last call (swapping in a new buffer) or None if nothing was.
        The batch belongs to the writer thread from then on.
    @param write_batch: called on the writer thread with C{(batch, fsync)};
        writes the batch (C{batch} may be None) and, if C{fsync}, makes
        everything written so far durable. What it returns should be a value
        the writer no longer changes (numbers, tuples, fresh containers). Its
        failure fails the waiting syncs.
    @param policy: the L{SyncPolicy}.
    @param reactor: runs the timer, the scheduled commits and the callbacks
        from the writer thread (an C{IReactorThreads} and C{IReactorTime}).
    @param on_written: if given, called on the reactor thread with what
        C{write_batch} returned, once per successful commit, in commit order,
        before the syncs that commit covers fire. If it raises, those syncs
        fail with its error.
    @param lost_in: if given, called on the reactor thread with the batch of a
        failed commit; returns the C{(queue, handle)} of the appends it held,
        for the watchers of C{failures}.
    @param failures: the L{CommitFailures} told of each failed commit (made
        here if not given).
    @param ledger: the L{CommitLedger} that numbers the commits (made here if not given).
    @param on_start: listeners called on the reactor thread, with no argument, as each
        commit (or idle tick) takes what was buffered, before it goes to the writer; the
        list is the caller's, so that it may add to it later.
    """

    def __init__(self, take_batch, write_batch, policy, reactor, name="store", on_written=None,
                 lost_in=None, failures=None, ledger=None, on_start=()):
        self.policy = policy
        self._take_batch = take_batch
        self._write_batch = write_batch
        self._on_written = on_written
        self._reactor = reactor
        self._pool = (None if policy.on_reactor_thread else
                      ThreadPool(minthreads=1, maxthreads=1, name=f"brokerd-{name}-writer"))
        self._waiting = []  # Deferreds of sync() calls not yet covered by a running commit
        self._running = None  # the Deferred of the commit on the writer thread
        self._scheduled = None
        self._timer = None
        self._stopped = False
        self.commits = 0
        self.fsyncs = 0
        self.commit_times = CommitTimes()
        self._lost_in = lost_in
        self.failures = failures if failures is not None else CommitFailures(name)
        self.ledger = ledger if ledger is not None else CommitLedger()
        self._on_start = on_start

    def start(self):
        if self._pool is not None:
            self._pool.start()
        period = self.policy.interval if self.policy.mode == "interval" else IDLE_COMMIT_SECONDS
        self._timer = LoopingCall(self._tick)
        self._timer.clock = self._reactor
        self._timer.start(period, now=False)

    def call(self, function, *args, **kwargs):
        """Run C{function} on the writer thread, after every commit already started (on the
        reactor's thread at once, with a policy L{on_reactor<SyncPolicy.on_reactor>})."""
        if self._pool is None:
            return defer.maybeDeferred(function, *args, **kwargs)
        return threads.deferToThreadPool(self._reactor, self._pool, function, *args, **kwargs)

    def sync(self):
        """A Deferred firing once every write made before this call is as safe as the policy
        says."""
        if self._stopped:
            return defer.fail(RuntimeError("the store is closed"))
        waiter = defer.Deferred()
        self._waiting.append(waiter)
        if self.policy.mode != "interval":
            self._schedule()
        return waiter

    def _schedule(self):
        if self._scheduled is None and self._running is None:
            self._scheduled = self._reactor.callLater(0, self._commit)

    def _tick(self):
        if self._running is None:
            self._commit()

    def _commit(self):
        scheduled, self._scheduled = self._scheduled, None
        # An overdue idle tick came first: it commits for both.
        if scheduled is not None and scheduled.active():
            scheduled.cancel()
        for listener in self._on_start:
            listener()
        waiters, self._waiting = self._waiting, []
        batch = self._take_batch()
        if batch is None and not waiters:
            return defer.succeed(None)
        fsync = self.policy.fsyncs
        self.commits += 1
        number = self.ledger.took_batch()
        if fsync:
            self.fsyncs += 1
        running = self._running = self.call(self._write_batch, batch, fsync)
        running.addBoth(self._committed, waiters, self._reactor.seconds(), batch, number)
        return running

    def _committed(self, result, waiters, started_at, batch, number):
        self._running = None
        self.commit_times.observe(self._reactor.seconds() - started_at)
        if not isinstance(result, Failure) and self._on_written is not None:
            try:
                self._on_written(result)
            except BaseException:
                result = Failure()
        if isinstance(result, Failure):
            self.ledger.commit_failed(number)
            # The final commit of a stop: its messages go with the broker, nothing is acked.
            lost = (self._lost_in(batch) if self._lost_in is not None and batch is not None
                    and not self._stopped else [])
            self.failures.commit_failed(result, lost)
            for waiter in waiters:
                waiter.errback(result)
        else:
            self.failures.commit_succeeded()
            for waiter in waiters:
                waiter.callback(None)
        if self._waiting and self.policy.mode != "interval" and not self._stopped:
            self._schedule()
        return None

    @defer.inlineCallbacks
    def stop(self):
        """Commit what is buffered (with fsync unless the policy is none), then end the writer
        thread."""
        if self._stopped:
            return
        self._stopped = True
        if self._timer is not None and self._timer.running:
            self._timer.stop()
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None
        try:
            if self._running is not None:
                yield self._running
            yield self._commit()
        finally:
            if self._pool is not None:
                self._pool.stop()
