"""A persisted queue's messages coming back from its store at start.

L{brokerd.model.broker.Broker} gives each queue it recovers the delivery
counts its store kept, then its messages: by handle over a store that can
load messages at once (L{brokerd.interfaces.IPagingStore}), else loaded. The
queue's L{QueueRecovery} takes them in through the queue's own paths and
counts them, since the queue does not count them as published since start.
"""

from brokerd.model.paging import STORE_FAILURES


class QueueRecovery:
    """
    Takes one queue's stored messages back at start.

    @ivar count: the entries recovered, which the queue does not count as
        published since start.
    """

    def __init__(self, queue, pager, expiry):
        self._queue = queue
        self._pager = pager
        self._expiry = expiry
        self.count = 0

    def restore_delivery_counts(self, counts):
        """
        How often recovered messages had come back before the restart (handle
        to count), given before they are restored: each entry takes its count
        when it is made, a paged one when it is loaded.
        """
        self._pager.restore_delivery_counts(counts)

    def restore_paged(self, handles):
        """
        Add stored messages recovered at start, flagged redelivered: by handle
        only (each loaded when delivered), unless the queue must see every
        message (priority, TTL, byte limit), which loads them now.
        """
        self._expiry.restored()
        queue = self._queue
        if queue.policy.needs_messages:
            load = self._pager.load
            for handle in handles:
                try:
                    message = load(handle)
                except STORE_FAILURES as problem:
                    queue.store_failed(problem)
                    return
                if message is not None:  # else unreadable, and quarantined
                    self.restore(message, handle, True)
            return
        queue.append_handles(handles)
        self.count += len(handles)

    def restore(self, message, handle, redelivered):
        """
        Add a stored message recovered at start, loaded (not counted as
        published since start).
        """
        self._queue.enqueue(message, handle, redelivered)
        self.count += 1
