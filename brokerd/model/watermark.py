"""Back-pressure on publishers: how many message bytes the broker holds in memory.

Queues add a message's body size when they take it and release it when it
leaves (acked, dropped, purged, deleted). Connections add what they hold on the
way in and out: partial frames, unfinished content bodies, publishes of an
uncommitted transaction, and replies the client has not read yet; each is
released once, when it is published, committed, rolled back, written or
dropped, or when its channel or connection closes. Past the high watermark the
broker is "blocked": protocol adapters stop reading from connections that
publish (and tell AMQP clients with connection.blocked) until the total is back
under the low watermark. RabbitMQ's memory alarm works the same way.

How a connection's transport is paused for it is the wire's affair
(L{brokerd.wire.backpressure}).
"""

from twisted.logger import Logger

from brokerd.model.alarm_waiters import AlarmWaiters

log = Logger()

DEFAULT_HIGH_WATERMARK = 1024 * 1024 * 1024
LOW_WATERMARK_RATIO = 0.8


class MemoryWatermark:
    """
    @ivar queued_bytes: message bytes held in memory now: bodies in queues
        (ready and un-acked) and what connections hold on the way in and out.
    @ivar blocked: True from crossing C{high} until falling to C{low}.
    """

    def __init__(self, high=DEFAULT_HIGH_WATERMARK, low=None, on_unblocked=None):
        """
        C{on_unblocked()}, if given, is called each time the broker unblocks (a
        burst is over).
        """
        self.high = high
        self.low = int(high * LOW_WATERMARK_RATIO) if low is None else low
        self.queued_bytes = 0
        self.blocked = False
        self._waiting = AlarmWaiters()  # publishers held until it clears
        self._on_unblocked = on_unblocked

    def add(self, size):
        self.queued_bytes += size
        if not self.blocked and self.queued_bytes > self.high:
            self.blocked = True
            log.warn(
                "messages in memory hold {size} bytes, above the {high}-byte watermark:"
                " blocking publishers",
                size=self.queued_bytes,
                high=self.high,
            )

    def release(self, size):
        self.queued_bytes -= size
        if self.blocked and self.queued_bytes <= self.low:
            self.blocked = False
            log.info(
                "messages in memory down to {size} bytes: unblocking publishers",
                size=self.queued_bytes,
            )
            self._waiting.release()
            if self._on_unblocked is not None:
                self._on_unblocked()

    def when_unblocked(self, resume):
        """Call C{resume()} once the broker is unblocked (at once if it is not blocked)."""
        self._waiting.when_clear(self.blocked, resume)

    def forget(self, resume):
        """A connection closed: do not call its C{resume}."""
        self._waiting.forget(resume)


# What one connection may hold on its way in, as fractions of the high watermark
# (brokerd.wire.connection_memory): past its share it is blocked, at its limit closed. Four
# connections at their share reach the watermark; one alone, even at its limit, cannot.
DEFAULT_CONNECTION_SHARE = 0.25
DEFAULT_CONNECTION_LIMIT = 0.5


class ConnectionMemoryLimits:
    """
    The bytes one connection may hold on its way in (partial frames, unfinished
    bodies, publishes of uncommitted transactions) before it alone is blocked
    (C{share}) and before it is closed (C{limit}).
    """

    __slots__ = ("share", "limit")

    def __init__(self, share, limit):
        if not 0 < share < limit:
            raise ValueError(
                f"a connection's memory share ({share} bytes) must be above 0 and below its"
                f" limit ({limit} bytes)"
            )
        self.share = share
        self.limit = limit

    @classmethod
    def of_watermark(cls, high, share=DEFAULT_CONNECTION_SHARE, limit=DEFAULT_CONNECTION_LIMIT):
        """
        The limits for a high watermark of C{high} bytes; C{share} and C{limit}
        are each a fraction of it (a float) or a number of bytes (an int).
        """
        return cls(_bytes_of(share, high), _bytes_of(limit, high))


def _bytes_of(amount, high):
    return int(high * amount) if isinstance(amount, float) else amount
