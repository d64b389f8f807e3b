"""GroupCommit: batches committed in order on one writer thread, syncs sharing
commits, and each --sync policy keeping its promise."""

import os
import shutil
import tempfile
import threading

import pytest
from twisted.internet import defer, reactor, task, threads
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from backends.memory import MemoryStore
from brokerd.interfaces import ICommitFailures
from brokerd.storage import registry
from brokerd.storage.durability import IDLE_COMMIT_SECONDS, CommitLedger, GroupCommit, SyncPolicy, commit_ledger_of
from tests.support.logs import LogWatcher
from tests.support.threaded_clock import ThreadedClock


@pytest.mark.parametrize(
    "text, mode, interval",
    [("always", "always", 0.1), ("none", "none", 0.1), ("interval", "interval", 0.1),
     ("interval:250", "interval", 0.25)],
)
def test_sync_policies_parse(text, mode, interval):
    policy = SyncPolicy.parse(text)
    assert (policy.mode, policy.interval) == (mode, interval)
    assert SyncPolicy.parse(str(policy)).mode == mode
    on_reactor = policy.on_reactor()
    assert (on_reactor.mode, on_reactor.interval, on_reactor.on_reactor_thread) == (mode, interval, True)
    assert not policy.on_reactor_thread


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("sometimes", "unknown sync mode 'sometimes'; use always, interval:MS or none"),
        ("interval:0", "interval needs a positive number of milliseconds, not '0'"),
        ("interval:soon", "interval needs a positive number of milliseconds, not 'soon'"),
        ("always:5", "sync mode 'always' takes no argument"),
    ],
)
def test_bad_sync_policies_are_refused(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        SyncPolicy.parse(text)


class FileLog:
    """A tiny store: lines buffered in memory, appended to a real file in batches."""

    def __init__(self, path):
        self.path = path
        self.buffer = []
        self.file = open(path, "ab")
        self.batches = []  # (lines, fsync, thread id) per write_batch
        self.fail_next = False
        self.writing = threading.Event()  # set while write_batch runs
        self.may_finish = threading.Event()  # write_batch waits for it
        self.may_finish.set()

    def add(self, line):
        self.buffer.append(line)

    def take_batch(self):
        batch, self.buffer = self.buffer, []
        return batch or None

    def write_batch(self, batch, fsync):
        self.writing.set()
        self.may_finish.wait(5)
        self.writing.clear()
        if self.fail_next:
            self.fail_next = False
            raise OSError(28, "No space left on device")
        if batch:
            self.file.write(b"".join(line + b"\n" for line in batch))
            self.file.flush()
        if fsync:
            os.fsync(self.file.fileno())
        self.batches.append((batch, fsync, threading.get_ident()))

    def on_disk(self):
        with open(self.path, "rb") as data:
            return data.read().splitlines()


class GroupCommitTests(unittest.TestCase):
    timeout = 10

    def temporary_path(self):
        directory = tempfile.mkdtemp(prefix="brokerd-durability-")
        self.addCleanup(shutil.rmtree, directory, True)
        return os.path.join(directory, "log")

    def started(self, policy="always"):
        log = FileLog(self.temporary_path())
        group = GroupCommit(log.take_batch, log.write_batch, SyncPolicy.parse(policy), reactor, name="test")
        group.start()
        self.addCleanup(group.stop)
        self.addCleanup(log.file.close)
        return log, group

    @defer.inlineCallbacks
    def test_syncs_of_one_turn_share_one_fsync_on_the_writer_thread(self):
        log, group = self.started("always")
        syncs = []
        for number in range(50):
            log.add(b"m%d" % number)
            syncs.append(group.sync())
        yield defer.gatherResults(syncs)
        self.assertEqual(log.on_disk(), [b"m%d" % number for number in range(50)])
        self.assertEqual(group.commits, 1)
        self.assertEqual(group.fsyncs, 1)
        batch, fsync, thread = log.batches[0]
        self.assertTrue(fsync)
        self.assertNotEqual(thread, threading.get_ident())

    @defer.inlineCallbacks
    def test_a_policy_on_the_reactor_commits_on_the_reactor_thread_with_no_writer_thread(self):
        log = FileLog(self.temporary_path())
        self.addCleanup(log.file.close)
        before = threading.active_count()
        group = GroupCommit(log.take_batch, log.write_batch, SyncPolicy.parse("always").on_reactor(),
                            reactor, name="test")
        group.start()
        self.addCleanup(group.stop)
        syncs = []
        for number in range(5):
            log.add(b"m%d" % number)
            syncs.append(group.sync())
        yield defer.gatherResults(syncs)
        self.assertEqual(log.on_disk(), [b"m%d" % number for number in range(5)])
        self.assertEqual([(fsync, thread) for _, fsync, thread in log.batches],
                         [(True, threading.get_ident())])
        self.assertEqual(threading.active_count(), before)

    @defer.inlineCallbacks
    def test_a_sync_during_a_commit_waits_for_the_next_one(self):
        log, group = self.started("always")
        log.may_finish.clear()
        log.add(b"first")
        first = group.sync()
        deadline = reactor.seconds() + 5
        while not log.writing.is_set() and reactor.seconds() < deadline:
            yield task.deferLater(reactor, 0.001, lambda: None)
        self.assertTrue(log.writing.is_set(), "the first commit never started")
        log.add(b"second")
        second = group.sync()
        log.may_finish.set()
        yield first
        self.assertEqual(log.on_disk(), [b"first"])
        yield second
        self.assertEqual(log.on_disk(), [b"first", b"second"])
        self.assertEqual([batch for batch, _, _ in log.batches], [[b"first"], [b"second"]])

    @defer.inlineCallbacks
    def test_none_writes_without_fsync(self):
        log, group = self.started("none")
        log.add(b"quick")
        yield group.sync()
        self.assertEqual(log.on_disk(), [b"quick"])
        self.assertEqual(group.fsyncs, 0)
        self.assertEqual([fsync for _, fsync, _ in log.batches], [False])

    @defer.inlineCallbacks
    def test_interval_commits_on_its_timer_with_fsync(self):
        log, group = self.started("interval:50")
        log.add(b"a")
        synced = group.sync()
        self.assertEqual(log.batches, [])  # nothing is written before the timer
        yield synced
        self.assertEqual(log.on_disk(), [b"a"])
        self.assertEqual([fsync for _, fsync, _ in log.batches], [True])

    @defer.inlineCallbacks
    def test_writes_nobody_syncs_on_are_committed_anyway(self):
        log, group = self.started("always")
        log.add(b"unsynced")
        deadline = reactor.seconds() + 5
        while not log.batches and reactor.seconds() < deadline:
            yield task.deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(log.on_disk(), [b"unsynced"])

    @defer.inlineCallbacks
    def test_a_failed_commit_fails_its_syncs_and_the_next_one_works(self):
        log, group = self.started("always")
        log.fail_next = True
        log.add(b"lost")
        failed = group.sync()
        yield self.assertFailure(failed, OSError)
        self.flushLoggedErrors(OSError)
        log.add(b"kept")
        yield group.sync()
        self.assertEqual(log.on_disk(), [b"kept"])

    @defer.inlineCallbacks
    def test_the_ledger_says_which_commit_took_writes_and_whether_it_failed(self):
        log, group = self.started("always")
        log.add(b"one")
        first = group.ledger.started + 1  # the commit that takes what is written now
        yield group.sync()
        log.fail_next = True
        log.add(b"lost")
        lost = group.ledger.started + 1
        # Taken by the idle commit, which fails before anyone syncs:
        deadline = reactor.seconds() + 5
        while group.failures.failed == 0 and reactor.seconds() < deadline:
            yield task.deferLater(reactor, 0.01, lambda: None)
        self.flushLoggedErrors(OSError)
        log.add(b"two")
        kept = group.ledger.started + 1
        yield group.sync()  # succeeds: it took "two" alone
        self.assertEqual(log.on_disk(), [b"one", b"two"])
        self.assertEqual((first, lost, kept), (1, 2, 3))
        self.assertEqual([group.ledger.failed(number) for number in (first, lost, kept)],
                         [False, True, False])

    @defer.inlineCallbacks
    def test_watchers_hear_what_failed_commits_lost_before_their_syncs_fail_and_a_run_is_logged_once(self):
        directory = tempfile.mkdtemp(prefix="brokerd-durability-")
        self.addCleanup(shutil.rmtree, directory, True)
        log = FileLog(os.path.join(directory, "log"))
        self.addCleanup(log.file.close)
        lines = LogWatcher(self)
        group = GroupCommit(log.take_batch, log.write_batch, SyncPolicy(), reactor, name="test",
                            lost_in=lambda batch: [("queue", line) for line in batch])
        heard = []
        group.failures.watch(lambda failure, lost: heard.append((failure.type, lost, len(syncs_failed))))
        group.start()
        self.addCleanup(group.stop)
        syncs_failed = []
        for line in (b"one", b"two"):
            log.fail_next = True
            log.add(line)
            yield self.assertFailure(group.sync().addErrback(lambda failure: syncs_failed.append(1) or failure),
                                     OSError)
        self.assertEqual(heard, [(OSError, [("queue", b"one")], 0), (OSError, [("queue", b"two")], 1)])
        self.assertEqual((group.failures.failing, group.failures.failed), (True, 2))
        log.add(b"three")
        yield group.sync()
        self.assertFalse(group.failures.failing)
        self.assertEqual(len(lines.matching("test store: a commit failed (ENOSPC: No space left on device)")), 1)
        self.assertEqual(len(lines.matching("test store: commits succeed again, after 2 failed")), 1)
        self.assertEqual(lines.matching("Traceback"), [])

    @defer.inlineCallbacks
    def test_stop_commits_what_is_buffered_and_refuses_later_syncs(self):
        log = FileLog(self.temporary_path())
        self.addCleanup(log.file.close)
        group = GroupCommit(log.take_batch, log.write_batch, SyncPolicy(), reactor, name="test")
        group.start()
        log.add(b"last words")
        yield group.stop()
        self.assertEqual(log.on_disk(), [b"last words"])
        yield self.assertFailure(group.sync(), RuntimeError)


class OverdueTickTests(unittest.TestCase):
    timeout = 10

    @defer.inlineCallbacks
    def test_an_overdue_idle_tick_that_commits_cancels_the_commit_already_scheduled(self):
        """
        A reactor busy past the idle tick runs it before a commit scheduled for
        now: the tick commits what the scheduled one would have, so the latter
        must not start a second commit beside the first when a sync comes in between.
        """
        clock = ThreadedClock()
        directory = tempfile.mkdtemp(prefix="brokerd-durability-")
        self.addCleanup(shutil.rmtree, directory, True)
        log = FileLog(os.path.join(directory, "log"))
        self.addCleanup(log.file.close)
        group = GroupCommit(log.take_batch, log.write_batch, SyncPolicy.parse("always"), clock, name="test")
        group.start()
        self.addCleanup(group.stop)
        self.addCleanup(log.may_finish.set)  # before the stop, should the test fail while a commit waits
        log.may_finish.clear()  # the first commit stays on the writer thread until the test lets it finish
        clock.rightNow = IDLE_COMMIT_SECONDS * 1.5  # time passed without the reactor running its timers
        log.add(b"first")
        first = group.sync()  # schedules a commit for now, behind the overdue tick
        second = []

        def in_between():
            log.add(b"second")
            second.append(group.sync())

        clock.callLater(-IDLE_COMMIT_SECONDS * 0.2, in_between)  # due after the tick, before the scheduled commit
        clock.advance(0)  # the tick, then in_between, then (unless cancelled) the scheduled commit
        self.assertEqual(group.commits, 1)
        log.may_finish.set()
        deadline = reactor.seconds() + 5
        while not second[0].called and reactor.seconds() < deadline:  # the writer answers through the reactor
            clock.advance(0)  # the commit the second sync waits for, once the first has ended
            yield task.deferLater(reactor, 0.001, lambda: None)
        yield first
        yield second[0]
        self.assertEqual([batch for batch, _, _ in log.batches], [[b"first"], [b"second"]])
        self.assertEqual(group.commits, 2)


class NumberedLog(FileLog):
    """A FileLog whose write_batch returns a value: the commit's number and the lines it wrote."""

    def __init__(self, path):
        super().__init__(path)
        self.written = 0

    def write_batch(self, batch, fsync):
        super().write_batch(batch, fsync)
        self.written += 1
        return (self.written, tuple(batch or ()))


class CommitResultTests(unittest.TestCase):
    """What write_batch returns comes back on the reactor thread, in commit order, before the syncs fire."""

    timeout = 10

    def started(self, on_written):
        directory = tempfile.mkdtemp(prefix="brokerd-durability-")
        self.addCleanup(shutil.rmtree, directory, True)
        log = NumberedLog(os.path.join(directory, "log"))
        group = GroupCommit(log.take_batch, log.write_batch, SyncPolicy(), reactor, name="test", on_written=on_written)
        group.start()
        self.addCleanup(log.file.close)
        self.addCleanup(group.stop)
        return log, group

    @defer.inlineCallbacks
    def test_each_commits_result_is_handed_back_on_the_reactor_thread_in_order_before_its_syncs_fire(self):
        delivered = []  # (result, thread id)
        log, group = self.started(lambda result: delivered.append((result, threading.get_ident())))
        seen_by_syncs = []
        log.may_finish.clear()
        log.add(b"first")
        first = group.sync().addCallback(lambda _: seen_by_syncs.append(list(delivered)))
        writing = threads.deferToThreadPool(reactor, reactor.getThreadPool(), log.writing.wait, 5)
        self.assertTrue((yield writing), "the first commit never started")
        log.add(b"second")
        second = group.sync().addCallback(lambda _: seen_by_syncs.append(list(delivered)))
        log.add(b"third")
        third = group.sync().addCallback(lambda _: seen_by_syncs.append(list(delivered)))
        log.may_finish.set()
        yield defer.gatherResults([first, second, third])
        reactor_thread = threading.get_ident()
        self.assertEqual(delivered, [((1, (b"first",)), reactor_thread), ((2, (b"second", b"third")), reactor_thread)])
        self.assertEqual([len(seen) for seen in seen_by_syncs], [1, 2, 2])

    @defer.inlineCallbacks
    def test_a_failing_on_written_fails_the_syncs_of_its_commit_and_the_next_commit_works(self):
        delivered = []

        def on_written(result):
            delivered.append(result)
            if len(delivered) == 1:
                raise ValueError("cannot take it")

        log, group = self.started(on_written)
        log.add(b"one")
        yield self.assertFailure(group.sync(), ValueError)
        self.flushLoggedErrors(ValueError)
        log.add(b"two")
        yield group.sync()
        self.assertEqual(delivered, [(1, (b"one",)), (2, (b"two",))])


@pytest.mark.parametrize("backend", ["chunked", "filelog", "sqlite"])
def test_durable_stores_say_what_failed_commits_lost(backend, tmp_path):
    assert verifyObject(ICommitFailures, registry.make_store(backend, str(tmp_path), reactor=task.Clock()))


def test_a_ledger_that_forgot_old_failures_says_older_commits_may_have_failed():
    ledger = CommitLedger(remembered=2)
    numbers = [ledger.took_batch() for _ in range(6)]
    assert numbers == [1, 2, 3, 4, 5, 6]
    for number in (2, 4, 5):
        ledger.commit_failed(number)
    assert [ledger.failed(number) for number in numbers] == [True, True, False, True, True, False]


def test_the_ledger_of_a_store_whose_commits_cannot_fail_never_says_writes_were_lost():
    ledger = commit_ledger_of(MemoryStore())
    assert (ledger.started, ledger.lost(0)) == (0, False)
