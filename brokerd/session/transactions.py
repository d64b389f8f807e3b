"""A channel's transaction (tx.select, tx.commit, tx.rollback), free of any wire protocol.

In tx mode a channel's publishes, acks, nacks and rejects wait, in order, for
tx.commit; the bodies of the publishes waiting count against the memory
watermark meanwhile. A L{Transaction} keeps them; the channel
(L{brokerd.session.channel.Channel}) decides what waits and runs what commits.
As RabbitMQ's does, the commit is answered once the messages the store took are
as safe as a publisher confirm would say (L{CommitOutcome}), and fails as a
partial completion if a full queue refused a publish or a store commit lost one.
"""

from twisted.internet import defer

from brokerd.errors import PreconditionFailed
from brokerd.storage.durability import commit_ledger_of

PARTIAL_COMPLETION = "partial tx completion"  # RabbitMQ's words, on tx.commit


class Transaction:
    """
    What one channel in tx mode has kept for tx.commit: operations, each a
    callable and its arguments, in the order they came, and the body bytes of
    the publishes among them.
    """

    def __init__(self, watermark, deliveries):
        """
        @param watermark: what the bodies waiting count against: the broker's
            L{brokerd.model.watermark.MemoryWatermark}, or the connection's account
            of what it holds (L{brokerd.session.connection.Connection.inbound}).
        @param deliveries: the channel's L{brokerd.session.deliveries.Deliveries},
            whose un-acked deliveries a settlement must name when it is kept.
        """
        self._watermark = watermark
        self._deliveries = deliveries
        self._pending = []  # (operation, arguments), in the order they came
        self.committing = None  # the CommitOutcome of the commit running what was kept
        self._held_bytes = 0
        self.held_publishes = self.held_settlements = 0  # for the management API

    @property
    def held_bytes(self):
        """
        Body bytes of the publishes waiting, counted against the memory
        watermark until commit or rollback.
        """
        return self._held_bytes

    def hold_publish(self, publish, arguments, size):
        """Keep a publish of C{size} body bytes for commit: C{publish(*arguments)} then."""
        self._pending.append((publish, arguments))
        self.held_publishes += 1
        self._held_bytes += size
        self._watermark.add(size)

    def hold_settlement(self, settle, arguments, delivery_tag, multiple):
        """
        Keep an ack, nack or reject of C{delivery_tag} (with C{multiple}, of
        every delivery up to it; 0: all of them) for commit: C{settle(*arguments)}
        then. The tag is checked now, as RabbitMQ does.

        @raise PreconditionFailed: if C{delivery_tag} names no un-acked delivery.
        """
        if delivery_tag not in self._deliveries.unacked and not (multiple and delivery_tag == 0):
            raise PreconditionFailed(f"unknown delivery tag {delivery_tag}")
        self._pending.append((settle, arguments))
        self.held_settlements += 1

    def commit(self, store):
        """
        Run what was kept, in the order it came (the channel runs it as outside
        tx mode while C{committing} is set, telling it what each publish came
        to); the next transaction begins empty. The bodies are the queues' to
        count from here on. If one operation raises, those after it are
        dropped. Returns the Deferred of L{CommitOutcome.safe}, over C{store}.
        """
        pending, self._pending = self._pending, []
        self._release_held_bytes()
        outcome = self.committing = CommitOutcome(store)
        try:
            for operation, arguments in pending:
                operation(*arguments)
        finally:
            self.committing = None
        return outcome.safe()

    def rollback(self):
        """
        Drop what was kept (the deliveries it would have settled stay
        un-acked); the next one begins empty.
        """
        self._pending = []
        self._release_held_bytes()

    def _release_held_bytes(self):
        self.held_publishes = self.held_settlements = 0
        size, self._held_bytes = self._held_bytes, 0
        if size:
            self._watermark.release(size)


class CommitOutcome:
    """
    What the publishes of one tx.commit came to, told by the channel as it runs them: whether
    the store took some, and whether a full queue refused one.
    """

    def __init__(self, store):
        self._store = store
        self._ledger = commit_ledger_of(store)
        self._started = self._ledger.started  # as the transaction's publishes are written
        self._stored = self._refused = False

    def published(self, stored, refused):
        self._stored = self._stored or stored
        self._refused = self._refused or refused

    def safe(self):
        """
        A Deferred that fires once what the store took is as safe as the sync policy (and a
        cluster's in-sync set) promises; it fails with L{PreconditionFailed} (RabbitMQ's
        "partial tx completion") if a full queue refused a publish, or if the commit that took
        them failed.
        """
        if self._refused:
            return defer.fail(PreconditionFailed(PARTIAL_COMPLETION))
        if not self._stored:
            return defer.succeed(None)
        return self._store.sync().addCallbacks(self._synced, self._sync_failed)

    def _synced(self, _):
        if self._ledger.lost(self._started):
            raise PreconditionFailed(PARTIAL_COMPLETION)

    @staticmethod
    def _sync_failed(failure):
        # The store logs its failed commits (once a run of them).
        raise PreconditionFailed(PARTIAL_COMPLETION)
