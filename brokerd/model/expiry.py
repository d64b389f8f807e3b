"""A queue's timers: messages that expire (x-message-ttl, expiration) and the queue itself (x-expires).

Expired messages are never delivered: the queue checks the head before every
delivery. Those behind the head are taken out too, at their expiry time, so
the message count and dead-lettering do not wait for them to reach the head.
Every timer runs on the broker's clock (a C{twisted.internet.task.Clock} in
tests).
"""

import heapq


class MessageExpiry:
    """
    Knows when the queue's ready messages expire and calls the queue back
    (L{brokerd.interfaces.IExpiringQueue.expire_due}) at the earliest such time.
    """

    def __init__(self, queue, clock):
        self._queue = queue
        self._clock = clock
        self._deadlines = []  # heap of (expires_at in ms, sequence); entries gone since are skipped lazily
        self._call = None

    def now(self):
        """The clock's time in milliseconds."""
        return self._clock.seconds() * 1000.0

    def track(self, entry):
        heapq.heappush(self._deadlines, (entry.expires_at, entry.sequence))
        if self._deadlines[0][1] == entry.sequence:
            self._schedule()

    def due(self, now):
        """True if some tracked deadline has passed (the queue then looks for expired entries)."""
        deadlines = self._deadlines
        passed = False
        while deadlines and deadlines[0][0] <= now:
            heapq.heappop(deadlines)
            passed = True
        return passed

    def _schedule(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        if self._deadlines:
            delay = max(self._deadlines[0][0] - self.now(), 0.0) / 1000.0
            self._call = self._clock.callLater(delay, self._fire)

    def _fire(self):
        self._call = None
        self._queue.expire_due()
        self._schedule()

    def stop(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._deadlines = []


class UnusedExpiry:
    """Deletes a queue (x-expires) once it has had no consumer, get or redeclare for that long."""

    def __init__(self, queue, clock, milliseconds):
        self._queue = queue
        self._clock = clock
        self._seconds = milliseconds / 1000.0
        self._call = None
        self.touch()

    def touch(self):
        """The queue was used: the countdown starts again (it runs only while no one consumes)."""
        self.stop()
        if not self._queue.consumer_count:
            self._call = self._clock.callLater(self._seconds, self._fire)

    def _fire(self):
        self._call = None
        queue = self._queue
        if not queue.consumer_count and not queue.deleted:
            queue.vhost.delete_queue(queue.name)

    def stop(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
