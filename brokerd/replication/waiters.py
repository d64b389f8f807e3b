"""Deferreds waiting for a sequence number to be reached, fired in sequence order."""

import heapq

from twisted.internet import defer


class SequenceWaiters:
    """
    Who waits for which operation of the stream: L{wait} gives a Deferred for a sequence,
    L{release} fires, in sequence order, every one at or below a floor reached.
    """

    def __init__(self):
        self._heap = []  # (sequence, order of arrival, Deferred)
        self._order = 0

    def __bool__(self):
        return bool(self._heap)

    def wait(self, sequence):
        """A Deferred firing with C{sequence} once a L{release} reaches it."""
        waiter = defer.Deferred()
        self._order += 1
        heapq.heappush(self._heap, (sequence, self._order, waiter))
        return waiter

    def release(self, floor):
        """Fire every waiter at or below C{floor} (None: every one)."""
        while self._heap and (floor is None or self._heap[0][0] <= floor):
            sequence, _, waiter = heapq.heappop(self._heap)
            waiter.callback(sequence)
