"""A publish that a store commit took before its channel asked for a sync, and that commit
failed: the confirm is a nack, even though the channel's own sync succeeds; a transaction whose
commit failed is refused ("partial tx completion"), not answered with commit-ok.

Real filelog stores on a tmpfs too small for the message (mounting needs root; skipped
elsewhere), a broker model, a confirm-mode channel. The store's timers run on a clock the test
drives, so its idle commit comes exactly between the publish and the end of the channel's turn,
as it can on a busy broker.
"""

import os
import shutil
import tempfile
from pathlib import Path

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from backends.filelog import FilelogStore
from brokerd.errors import PreconditionFailed
from brokerd.storage.durability import IDLE_COMMIT_SECONDS
from tests.support.broker import make_broker, open_channel, properties, ready
from tests.support.small_disk import free_bytes, small_filesystem, write_filler
from tests.support.threaded_clock import ThreadedClock

WAIT = 10.0


class FailedCommitConfirmTests(unittest.TestCase):
    timeout = 30

    @defer.inlineCallbacks
    def setUp(self):
        mounted = small_filesystem(self.mktemp_directory(), "1m")
        self.disk = mounted.__enter__()
        self.addCleanup(mounted.__exit__, None, None, None)
        self.filler = self.disk / "filler"
        write_filler(self.filler, 1 << 20)  # the file system is full
        self.store_clock = ThreadedClock()
        self.store = FilelogStore(str(self.disk / "data"), reactor=self.store_clock)
        yield self.store.open()
        self.addCleanup(self.store.close)
        self.failures = []
        self.store.watch_commit_failures(lambda failure, lost: self.failures.append(lost))
        self.broker, self.clock = make_broker(self.store)
        self.channel, self.peer = open_channel(self.broker)
        self.channel.queue_declare("durable", durable=True)
        self.channel.confirm_select()

    def mktemp_directory(self):
        path = Path(tempfile.mkdtemp(prefix="brokerd-confirms-"))
        self.addCleanup(shutil.rmtree, path, True)
        return path

    @defer.inlineCallbacks
    def until(self, found, what):
        """Run both clocks and the real reactor until C{found()} holds, with a deadline."""
        deadline = reactor.seconds() + WAIT
        while not found():
            self.assertLess(reactor.seconds(), deadline, f"no {what} within {WAIT} s")
            self.clock.advance(0)
            self.store_clock.advance(0)
            yield task.deferLater(reactor, 0.001, lambda: None)

    def publish(self, body):
        self.channel.basic_publish("", "durable", properties(persistent=True), body)

    @defer.inlineCallbacks
    def test_a_publish_lost_by_an_idle_commit_before_its_turn_ended_is_nacked(self):
        self.publish(b"x" * (64 << 10))  # more than the disk has left
        # The store's idle commit runs before the channel's turn ends: it takes the publish.
        self.store_clock.advance(IDLE_COMMIT_SECONDS)
        yield self.until(lambda: self.failures, "failed commit")
        self.assertEqual(len(self.failures[0]), 1)
        self.assertEqual(self.peer.confirms, [])
        # The turn ends: the channel's sync is a commit of nothing, and it succeeds.
        yield self.until(lambda: self.peer.confirms, "confirm")
        self.assertEqual(self.peer.confirms, [(1, False, False)])
        self.assertEqual(ready(self.broker, "durable"), 0)
        # Space again: the next publish is written and acked.
        os.unlink(self.filler)
        self.assertGreater(free_bytes(self.disk), 64 << 10)
        self.publish(b"kept")
        yield self.until(lambda: len(self.peer.confirms) == 2, "second confirm")
        self.assertEqual(self.peer.confirms[1], (2, False, True))
        self.assertEqual(len(self.failures), 1)

    @defer.inlineCallbacks
    def test_a_transaction_whose_store_commit_failed_is_refused_and_its_message_dropped(self):
        channel, _ = open_channel(self.broker, channel_id=2, connection=self.channel.connection)
        channel.tx_select()
        channel.basic_publish("", "durable", properties(persistent=True), b"x" * (64 << 10))
        outcomes = []
        channel.tx_commit().addBoth(outcomes.append)
        yield self.until(lambda: outcomes, "tx.commit outcome")
        [failure] = outcomes
        self.assertTrue(failure.check(PreconditionFailed))
        self.assertEqual(failure.value.reply_text, "PRECONDITION_FAILED - partial tx completion")
        self.assertEqual(len(self.failures), 1)
        self.assertEqual(ready(self.broker, "durable"), 0)
