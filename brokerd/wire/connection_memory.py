"""What one connection holds on its way in, and the share of the memory watermark it may hold.

A client that holds bytes the broker cannot hand on (a transaction it never
commits, message bodies it never finishes, the start of a frame it never
completes) would otherwise take the broker to its memory watermark alone, and
the global alarm would then block every publisher. Each connection therefore
counts what it holds on its way in (L{ConnectionMemory}, given to its read
buffer, its channels' content assembly and its transactions in place of the
watermark, whose count it keeps too) against limits of its own
(L{brokerd.model.watermark.ConnectionMemoryLimits}):

  - past its share, that connection alone is blocked: it is told (AMQP's
    connection.blocked) and its socket is not read. Only its own next frames
    (a commit, a rollback, the rest of a body, a channel's close) can lower
    what it holds, so it is read again one step a second, each step letting it
    take a quarter of the way from its share to its limit: a client that
    commits or finishes gets under its share again and is unblocked, one that
    only takes more reaches its limit within a few seconds;
  - past its limit, it is closed with a reply that names the limit (530
    NOT_ALLOWED, RabbitMQ's code for a limit reached); what it sends after that
    is dropped, but for its close-ok.

Replies a client does not read are not counted here: reading from such a client
stops anyway (L{brokerd.wire.backpressure.SLOW_READER}) and deliveries to it wait.
"""

from twisted.logger import Logger

from brokerd.errors import NotAllowed

log = Logger()

# Why reading from a client is paused (see brokerd.wire.backpressure.ReadingPauses).
OVER_SHARE = "connection over its memory share"
OVER_LIMIT = "connection over its memory limit"

STEP_SECONDS = 1.0  # how often a connection blocked on its share is read again, a step at a time
STEPS_TO_LIMIT = 4  # steps from the share to the limit
UNBLOCK_RATIO = 0.8  # a connection blocked on its share is unblocked below this part of it


class ConnectionMemory:
    """
    The bytes one connection holds on its way in, counted against the broker's
    watermark and against the connection's own limits.

    It takes the watermark's C{add} and C{release}, so that a read buffer, a
    L{brokerd.wire.backpressure.HeldBytes} or a transaction counts through it
    unchanged. A protocol gives it the transport's
    L{brokerd.wire.backpressure.ReadingPauses} once connected (L{attach}), and
    may set C{on_blocked(blocked)} (tell the client) and C{on_limit(error)}
    (close the connection with C{error}).

    @ivar size: the bytes held now.
    @ivar blocked: True from passing the share until back under L{UNBLOCK_RATIO} of it.
    """

    __slots__ = (
        "size", "blocked", "on_blocked", "on_limit", "_watermark", "_limits", "_clock",
        "_pauses", "_pause_above", "_paused", "_step_call", "_closing",
    )

    def __init__(self, watermark, limits, clock):
        """
        @param watermark: the broker's L{brokerd.model.watermark.MemoryWatermark}.
        @param limits: the broker's L{brokerd.model.watermark.ConnectionMemoryLimits}.
        @param clock: the C{IReactorTime} of the steps and of the close.
        """
        self.size = 0
        self.blocked = False
        self.on_blocked = None
        self.on_limit = None
        self._watermark = watermark
        self._limits = limits
        self._clock = clock
        self._pauses = None
        self._pause_above = limits.share  # reading pauses past this (the share, or a step past it)
        self._paused = False
        self._step_call = None
        self._closing = False

    @property
    def share(self):
        return self._limits.share

    @property
    def limit(self):
        return self._limits.limit

    def attach(self, pauses):
        """Pause and resume reading through C{pauses}, the transport's ReadingPauses."""
        self._pauses = pauses

    def add(self, size):
        self.size += size
        self._watermark.add(size)
        if self.size > self._pause_above:
            self._over()

    def release(self, size):
        self.size -= size
        if size:
            self._watermark.release(size)
        if self.blocked and self.size <= self._limits.share * UNBLOCK_RATIO:
            self._unblock()

    def close(self):
        """The connection is gone: no more steps, nothing more to tell, and its transport is
        not to be paused or resumed any more (what it held is still released through here)."""
        if self._step_call is not None and self._step_call.active():
            self._step_call.cancel()
        self._step_call = None
        self.on_blocked = self.on_limit = None
        self._pauses = None
        self.blocked = False

    def _over(self):
        limits = self._limits
        if self.size > limits.limit:
            if not self._closing:
                self._closing = True
                self._pause(OVER_LIMIT)
                # On the next turn: a frame being parsed finishes first.
                self._clock.callLater(0, self._close)
            return
        if not self.blocked:
            self.blocked = True
            log.warn(
                "a connection holds {size} bytes on its way in, above its {share}-byte share"
                " of memory: blocking it",
                size=self.size, share=limits.share,
            )
            if self.on_blocked is not None:
                self.on_blocked(True)
        if not self._paused:
            self._paused = True
            self._pause(OVER_SHARE)
            self._step_call = self._clock.callLater(STEP_SECONDS, self._step)

    def _step(self):
        """Read the blocked connection again until it takes one more step towards its limit."""
        self._step_call = None
        if self._paused and not self._closing:
            limits = self._limits
            self._pause_above = self.size + max(1, (limits.limit - limits.share) // STEPS_TO_LIMIT)
            self._paused = False
            self._resume(OVER_SHARE)

    def _unblock(self):
        self.blocked = False
        self._pause_above = self._limits.share
        if self._step_call is not None and self._step_call.active():
            self._step_call.cancel()
        self._step_call = None
        if self._paused:
            self._paused = False
            self._resume(OVER_SHARE)
        log.info(
            "a connection is down to {size} bytes on its way in: unblocking it", size=self.size
        )
        if self.on_blocked is not None:
            self.on_blocked(False)

    def _close(self):
        """Close the connection; then read it again, for the client's close-ok (a closing
        connection drops what else it reads). What it releases meanwhile unblocks nothing."""
        self.on_blocked = None
        self.blocked = False
        if self._step_call is not None and self._step_call.active():
            self._step_call.cancel()
        self._step_call = None
        if self.on_limit is not None:
            self.on_limit(
                NotAllowed(
                    f"connection holds {self.size} bytes of unfinished messages and uncommitted"
                    f" transactions, above its limit of {self._limits.limit} bytes"
                    " (connection memory limit)"
                )
            )
        if self._paused:
            self._paused = False
            self._resume(OVER_SHARE)
        self._resume(OVER_LIMIT)

    def _pause(self, reason):
        if self._pauses is not None:
            self._pauses.pause(reason)

    def _resume(self, reason):
        if self._pauses is not None:
            self._pauses.resume(reason)
