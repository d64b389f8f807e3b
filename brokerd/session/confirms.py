"""Publisher confirms for one channel: numbering, waiting for the store, batching.

Each publish on a confirm-mode channel gets the next sequence number. A publish
the store holds is confirmed only after a C{store.sync()} that covers it; the
others are confirmed at once. Outcomes go to the client in sequence order, at the
end of the reactor turn, as few frames as possible: a run of acks becomes one
C{multiple} ack. One C{sync()} call per turn covers every publish of that turn.

A commit can take a publish before the turn's C{sync()} is called (the store's
idle commit, or one another channel's sync started); if that commit fails, the
later sync alone would wrongly say the publish is safe. So the publishes of a
turn are kept in groups, one per commit of the store's L{CommitLedger} that
takes them, and a group whose commit failed is nacked whatever the sync says.
"""

from brokerd.storage.durability import commit_ledger_of


class PublisherConfirms:
    """
    The publisher confirms of one channel in confirm mode: its publishes'
    numbers and their outcomes.
    """

    def __init__(self, peer, store, clock):
        """
        @param peer: the channel's L{brokerd.interfaces.IChannelPeer}, which the outcomes go to.
        @param store: the vhost's store, whose C{sync()} makes the publishes it holds safe.
        @param clock: what the end of a reactor turn is scheduled on.
        """
        self._peer = peer
        self._store = store
        self._clock = clock
        self._last_sequence = 0
        self._sent_through = 0  # every sequence up to this one has been confirmed to the client
        self._outcomes = {}  # sequence -> True (ack) / False (nack), decided but not yet sent
        # Which commit took a publish decides it too, whatever the sync says.
        self._ledger = commit_ledger_of(store)
        self._awaiting_sync = []  # sequences written while the ledger's started was _group_started
        self._group_started = 0
        self._earlier_groups = []  # (started, sequences) of this turn taken by earlier commits
        self._flush_call = None
        self._discarded = False

    @property
    def published(self):
        """Publishes numbered so far."""
        return self._last_sequence

    @property
    def confirmed(self):
        """Publishes whose confirm (ack or nack) was sent to the client."""
        return self._sent_through

    def next_sequence(self):
        self._last_sequence += 1
        return self._last_sequence

    def confirm(self, sequence, ack=True):
        """The outcome of C{sequence} is known now."""
        self._outcomes[sequence] = ack
        self._schedule()

    def confirm_after_sync(self, sequence):
        """C{sequence} is safe once the store's next sync completes, if the commit that takes it
        does not fail."""
        started = self._ledger.started
        if started != self._group_started:
            if self._awaiting_sync:
                self._earlier_groups.append((self._group_started, self._awaiting_sync))
                self._awaiting_sync = []
            self._group_started = started
        self._awaiting_sync.append(sequence)
        self._schedule()

    def discard(self):
        """The channel closed: nothing more is sent."""
        self._discarded = True
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None

    def _schedule(self):
        if self._flush_call is None and not self._discarded:
            self._flush_call = self._clock.callLater(0, self._flush)

    def _flush(self):
        self._flush_call = None
        if self._awaiting_sync:
            groups, self._earlier_groups = self._earlier_groups, []
            groups.append((self._group_started, self._awaiting_sync))
            self._awaiting_sync = []
            self._store.sync().addCallbacks(
                self._synced, self._sync_failed, callbackArgs=(groups,), errbackArgs=(groups,)
            )
        self._send()

    def _synced(self, _, groups):
        ledger, outcomes = self._ledger, self._outcomes
        for started, sequences in groups:
            safe = not ledger.lost(started)
            for sequence in sequences:
                outcomes[sequence] = safe
        self._send()

    def _sync_failed(self, failure, groups):
        # The store logs its failed commits, once a run of them, not once a channel.
        for _, sequences in groups:
            for sequence in sequences:
                self._outcomes[sequence] = False
        self._send()

    def _send(self):
        if self._discarded:
            return
        outcomes = self._outcomes
        sequence = self._sent_through + 1
        acked_through = None
        run_start = sequence
        while sequence in outcomes:
            if outcomes.pop(sequence):
                acked_through = sequence
            else:
                if acked_through is not None:
                    self._peer.publish_confirmed(acked_through, acked_through > run_start, True)
                    acked_through = None
                self._peer.publish_confirmed(sequence, False, False)
                run_start = sequence + 1
            sequence += 1
        if acked_through is not None:
            self._peer.publish_confirmed(acked_through, acked_through > run_start, True)
        self._sent_through = sequence - 1
