"""Back-pressure on publishers for want of disk space: RabbitMQ's disk alarm.

The free space of the data directory's file system is measured now and then
(L{brokerd.process.disk_monitor}); below the limit (C{--disk-free-limit},
RabbitMQ's C{disk_free_limit}, 50 MB by default) the alarm is raised, and
publishing connections are held as the memory watermark holds them (AMQP
clients get connection.blocked, "low on disk"), while consumers and acks go
on; at or above the limit it clears. A store write refused for want of space
raises it at once, whatever the last measure said, and it then clears only once
the free space has also grown by L{WRITE_FAILURE_MARGIN} since that failure, so
that a limit set lower than a commit needs does not let publishers fill the
disk again and again.

The alarm only keeps state and computes when to measure next (more often as
the free space nears the limit, as RabbitMQ's disk monitor does); measuring and
timers belong to its monitor, so that tests drive it with a fake clock.
"""

from twisted.logger import Logger

from brokerd.model.alarm_waiters import AlarmWaiters

log = Logger()

DEFAULT_DISK_FREE_LIMIT = 50_000_000  # RabbitMQ's default, 50 MB
WRITE_FAILURE_MARGIN = 1 << 20
# How fast a disk may fill, as RabbitMQ's disk monitor assumes: the time to the limit at
# this rate, halved, is how long to wait before the next measure, within the bounds below.
FAST_FILL_RATE = 250_000_000  # bytes a second
MIN_CHECK_SECONDS = 0.1
MAX_CHECK_SECONDS = 10.0
# Raised, the alarm measures every second (RabbitMQ waits the longest interval), so that
# publishers resume soon after space is freed.
ALARMED_CHECK_SECONDS = 1.0


class DiskAlarm:
    """
    The disk alarm of the broker.

    @ivar limit: free bytes below which publishers are blocked.
    @ivar free: the free bytes last measured (None before the first measure).
    @ivar blocked: True while the alarm is raised.
    """

    def __init__(self, limit=DEFAULT_DISK_FREE_LIMIT):
        self.limit = limit
        self.free = None
        self.blocked = False
        self._clear_at = limit  # free bytes at which a raised alarm clears
        self._waiting = AlarmWaiters()  # publishers held until it clears

    def measured(self, free):
        """C{free} bytes are free now: raise the alarm below the limit, clear it at or above."""
        self.free = free
        if not self.blocked:
            if free < self.limit:
                self._raise(f"{free} bytes free, below the limit of {self.limit}")
        elif free >= self._clear_at:
            self._clear()

    def write_failed(self, free):
        """
        A store write was refused for want of space, with C{free} bytes free
        (None if they could not be measured): raise the alarm now.
        """
        if free is not None:
            self.free = free
        floor = self.free if self.free is not None else 0
        self._clear_at = max(self.limit, floor + WRITE_FAILURE_MARGIN)
        if not self.blocked:
            self._raise(f"a store write found the disk full ({floor} bytes free)")

    def next_check_in(self):
        """Seconds until the free space should be measured again."""
        if self.blocked:
            return ALARMED_CHECK_SECONDS
        if self.free is None:
            return MIN_CHECK_SECONDS
        ideal = 2 * (self.free - self.limit) / FAST_FILL_RATE
        return max(MIN_CHECK_SECONDS, min(MAX_CHECK_SECONDS, ideal))

    def when_unblocked(self, resume):
        """Call C{resume()} once the alarm clears (at once if it is not raised)."""
        self._waiting.when_clear(self.blocked, resume)

    def forget(self, resume):
        """A connection closed: do not call its C{resume}."""
        self._waiting.forget(resume)

    def _raise(self, why):
        self.blocked = True
        log.warn("free disk space is insufficient ({why}): blocking publishers", why=why)

    def _clear(self):
        self.blocked = False
        self._clear_at = self.limit
        log.info(
            "free disk space is sufficient again ({free} bytes free, limit {limit}):"
            " unblocking publishers", free=self.free, limit=self.limit,
        )
        self._waiting.release()
