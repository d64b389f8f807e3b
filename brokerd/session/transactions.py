"""Transactions of a channel (tx.select, tx.commit, tx.rollback), free of any wire protocol.

L{ChannelTransactions} is a part of L{brokerd.session.channel.Channel}: in tx mode its
publishes, acks, nacks and rejects wait, in order, for tx.commit; the bodies of
the publishes waiting count against the memory watermark meanwhile.
"""

from brokerd.errors import PreconditionFailed


class ChannelTransactions:
    """
    The tx methods of a L{brokerd.session.channel.Channel}, which holds their state:
    C{_transaction} (the pending C{(operation, arguments)}, or None outside tx
    mode) and C{_transaction_bytes}.
    """

    def tx_select(self):
        """Put the channel in transaction mode: publishes and acks wait for commit."""
        if self._confirms is not None:
            raise PreconditionFailed("cannot switch from confirm to tx mode")
        if self._transaction is None:
            self._transaction = []

    def tx_commit(self):
        """Apply the transaction's publishes and acks, in the order they came; a new one begins."""
        pending = self._pending_transaction()
        self._transaction = None
        self._release_transaction_bytes()  # the queues count the bodies they take from here on
        try:
            for operation, arguments in pending:
                operation(*arguments)
        finally:
            self._transaction = []

    def tx_rollback(self):
        """Drop the transaction's publishes and acks (the deliveries stay un-acked); a new one begins."""
        self._pending_transaction()
        self._transaction = []
        self._release_transaction_bytes()

    @property
    def transaction_bytes(self):
        """Body bytes of the publishes waiting for tx.commit (counted against the watermark)."""
        return self._transaction_bytes

    def _hold_for_transaction(self, size):
        """A publish waits for commit: its body counts against the memory watermark meanwhile."""
        self._transaction_bytes += size
        self.vhost.watermark.add(size)

    def _release_transaction_bytes(self):
        size, self._transaction_bytes = self._transaction_bytes, 0
        if size:
            self.vhost.watermark.release(size)

    def _deferred_by_transaction(self, operation, arguments, delivery_tag, multiple):
        """In tx mode, check C{delivery_tag} now and keep the settlement for commit."""
        if self._transaction is None:
            return False
        if delivery_tag not in self.unacked_deliveries and not (multiple and delivery_tag == 0):
            raise PreconditionFailed(f"unknown delivery tag {delivery_tag}")
        self._transaction.append((operation, arguments))
        return True

    def _pending_transaction(self):
        if self._transaction is None:
            raise PreconditionFailed("channel is not transactional")
        return self._transaction
