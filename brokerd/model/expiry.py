"""A queue's timers: messages that expire (x-message-ttl, expiration) and the
queue itself (x-expires).

Expired messages are never delivered: the queue checks the head before every
delivery. Those behind the head are taken out too, at their expiry time, so
the message count and dead-lettering do not wait for them to reach the head.
Every timer runs on the broker's clock (a C{twisted.internet.task.Clock} in
tests).
"""

import heapq

from brokerd.errors import PreconditionFailed
from brokerd.model.queue_arguments import message_ttl_of


class MessageExpiry:
    """
    The time to live of one queue's messages: what it is for each message,
    when each ready one expires, and a timer that calls the queue back
    (L{brokerd.interfaces.IExpiringQueue.expire_due}) at the earliest such time.

    @ivar queue_ttl: the queue's message TTL in milliseconds (x-message-ttl
        or its policy's message-ttl, as its effective settings say), or None.
    """

    def __init__(self, queue, clock, queue_ttl):
        self._queue = queue
        self._clock = clock
        self.queue_ttl = queue_ttl
        # Heap of (expires_at in ms, sequence); entries gone since are skipped lazily.
        self._deadlines = []
        self._call = None
        self._restored_at = None  # when recovered messages came back (see restored)

    def follow(self, settings):
        """The queue's effective settings changed: messages enqueued from now on get their TTL."""
        self.queue_ttl = settings.message_ttl

    def now(self):
        """The clock's time in milliseconds."""
        return self._clock.seconds() * 1000.0

    def ttl_of(self, message):
        """
        The message's time to live in this queue: the smaller of its own and
        the queue's, or None.
        """
        try:
            own = message_ttl_of(message.properties)
        # Refused at publish; one kept by an older broker has no TTL of its own.
        except PreconditionFailed:
            own = None
        queue_ttl = self.queue_ttl
        if own is None:
            return queue_ttl
        return own if queue_ttl is None else min(own, queue_ttl)

    def start(self, entry, ttl):
        """
        An entry just made lives C{ttl} ms from its message's publish time
        (from now if it has none).
        """
        published = entry.message.published_at
        entry.expires_at = (self.now() if published is None else published) + ttl
        self.track(entry)

    def restored(self):
        """
        Messages recovered at start come back now: the TTLs of those that kept
        no publish time count from now.
        """
        self._restored_at = self.now()

    def start_loaded(self, entry):
        """
        An entry whose message was just loaded from the store (recovered, or
        paged out) lives until its own expiration says, counted from its
        publish time, or from when it was recovered if it kept none.
        """
        message = entry.message
        if message.properties.HasField("expiration"):
            ttl = self.ttl_of(message)
            if ttl is not None:
                counted_from = message.published_at
                if counted_from is None:
                    counted_from = self._restored_at or self.now()
                entry.expires_at = counted_from + ttl

    def track(self, entry):
        heapq.heappush(self._deadlines, (entry.expires_at, entry.sequence))
        if self._deadlines[0][1] == entry.sequence:
            self._schedule()

    def take_expired(self, ready):
        """
        Take out of C{ready} (the queue's L{brokerd.model.ready.ReadyList})
        every entry whose time has come: those at the head, and those behind
        it once a tracked deadline has passed. Returns them, in order.
        """
        now = self.now()
        expired = []
        while ready:
            entry = ready.popleft()
            if entry.expires_at is not None and entry.expires_at <= now:
                expired.append(entry)
                continue
            ready.appendleft(entry)
            break
        if self._deadline_passed(now):
            expired += ready.remove_where(
                lambda entry: entry.expires_at is not None and entry.expires_at <= now
            )
        return expired

    def _deadline_passed(self, now):
        """True if some tracked deadline has passed (entries behind the head may have expired)."""
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
