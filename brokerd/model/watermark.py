"""Back-pressure on publishers: how many body bytes the queues hold in memory.

Queues add a message's body size when they take it and release it when it
leaves (acked, dropped, purged, deleted). Past the high watermark the broker
is "blocked": protocol adapters stop reading from connections that publish
(and tell AMQP clients with connection.blocked) until consumers bring the
total back under the low watermark. RabbitMQ's memory alarm works the same way.
"""

from twisted.logger import Logger

log = Logger()

DEFAULT_HIGH_WATERMARK = 1024 * 1024 * 1024
LOW_WATERMARK_RATIO = 0.8


class MemoryWatermark:
    """
    @ivar queued_bytes: body bytes held by queues now (ready and un-acked).
    @ivar blocked: True from crossing C{high} until falling to C{low}.
    """

    def __init__(self, high=DEFAULT_HIGH_WATERMARK, low=None):
        self.high = high
        self.low = int(high * LOW_WATERMARK_RATIO) if low is None else low
        self.queued_bytes = 0
        self.blocked = False
        self._waiting = {}  # callable -> None, in subscription order; called once on unblock

    def add(self, size):
        self.queued_bytes += size
        if not self.blocked and self.queued_bytes > self.high:
            self.blocked = True
            log.warn(
                "queued messages hold {size} bytes, above the {high}-byte watermark: blocking publishers",
                size=self.queued_bytes,
                high=self.high,
            )

    def release(self, size):
        self.queued_bytes -= size
        if self.blocked and self.queued_bytes <= self.low:
            self.blocked = False
            log.info("queued messages down to {size} bytes: unblocking publishers", size=self.queued_bytes)
            waiting, self._waiting = self._waiting, {}
            for resume in waiting:
                resume()

    def when_unblocked(self, resume):
        """Call C{resume()} once the broker is unblocked (at once if it is not blocked)."""
        if self.blocked:
            self._waiting[resume] = None
        else:
            resume()

    def forget(self, resume):
        """A connection closed: do not call its C{resume}."""
        self._waiting.pop(resume, None)


class PublisherGate:
    """
    Pauses reading from one publishing connection while the broker is blocked.

    C{notify(blocked)} is called on each change so a protocol can tell its
    client (AMQP's connection.blocked / unblocked).
    """

    def __init__(self, watermark, transport, notify=None):
        self._watermark = watermark
        self._transport = transport
        self._notify = notify
        self.paused = False

    def check(self):
        """After a publish: stop reading from this connection if the broker is blocked."""
        if self._watermark.blocked and not self.paused:
            self.paused = True
            self._transport.pauseProducing()
            if self._notify is not None:
                self._notify(True)
            self._watermark.when_unblocked(self._resume)

    def _resume(self):
        if not self.paused:
            return
        self.paused = False
        if self._notify is not None:
            self._notify(False)
        self._transport.resumeProducing()

    def close(self):
        self._watermark.forget(self._resume)
        self.paused = False
