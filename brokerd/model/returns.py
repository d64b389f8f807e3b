"""A queue's deliveries that come back: nacked or rejected with requeue, or
un-acked when their channel closes or their consumer is cancelled.

Each return is counted (x-delivery-count, which the store keeps for a
persistent message). A message returned more often than the queue's delivery
limit allows dies instead, and so does one whose time to live ran out while
it was out (see L{brokerd.model.deadletter}); the others go back near the
head of the queue, each where its arrival order puts it, redelivered.
"""

from operator import attrgetter

from brokerd.model.deadletter import DELIVERY_LIMIT, EXPIRED

_by_sequence = attrgetter("sequence")


class QueueReturns:
    """
    The returns of one queue's delivered entries: counted, then dead past
    the delivery limit or their time to live, else put back in order.
    """

    def __init__(self, queue, store, expiry, dead_letters):
        self._queue = queue
        self._store = store
        self._expiry = expiry
        self._dead_letters = dead_letters

    def returned(self, entry):
        """
        Count a return of a delivered entry (x-delivery-count); False if that
        was one more than the queue's delivery limit allows, and it died.
        """
        entry.redelivered = True
        entry.delivery_count += 1
        queue = self._queue
        limit = queue.policy.delivery_limit
        if limit is not None and entry.delivery_count > limit and not queue.deleted:
            self._dead_letters.died(entry, DELIVERY_LIMIT)
            return False
        if entry.handle is not None and not queue.deleted:
            self._store.returned(queue.key, entry.handle, entry.delivery_count)
        return True

    def requeue(self, entries, ready):
        """
        Put delivered C{entries} back near the head of C{ready} (the queue's
        L{brokerd.model.ready.ReadyList}), each where its arrival order puts
        it, marked redelivered; those past the delivery limit or their time
        to live die instead. True if any went back.
        """
        returned = []
        now = self._expiry.now()
        for entry in sorted(entries, key=_by_sequence):
            entry.consumer = None
            if not self.returned(entry):
                continue
            if entry.expires_at is not None and entry.expires_at <= now:
                self._dead_letters.died(entry, EXPIRED)
            else:
                returned.append(entry)
        if returned:
            ready.put_back(returned)
        return bool(returned)
