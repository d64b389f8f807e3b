"""A queue's backlog alarm (brokerd's own, as EQueue has one).

It goes off when more messages are ready than C{x-backlog-alarm} or the
policy key C{backlog-alarm} allows: a warning is logged once, and an info
line once the ready count is back at or below the threshold. The queue's
message paths compare the ready count with L{BacklogAlarm.above} (while the
alarm is off) or L{BacklogAlarm.below} (while it is on), plain attributes,
and call L{BacklogAlarm.watch} only when it crosses.
"""

import sys

from twisted.logger import Logger

log = Logger()

NEVER = sys.maxsize  # a ready count no queue reaches


class BacklogAlarm:
    """
    The backlog alarm of one queue: its threshold, whether it is on, and the
    ready counts at which it must be looked at again.

    @ivar threshold: ready messages above which it goes off, or None (no alarm).
    @ivar alarmed: True while more messages are ready than the threshold allows.
    @ivar above: a ready count above this turns the alarm on (C{NEVER}, one no
        queue reaches, while it is on or without threshold).
    @ivar below: a ready count at or below this turns it off (-1 while it is off).
    """

    __slots__ = ("_queue", "threshold", "alarmed", "above", "below")

    def __init__(self, queue, threshold, count):
        self._queue = queue
        self.alarmed = False
        self.follow(threshold, count)

    def follow(self, threshold, count):
        """
        A new threshold (the queue's effective settings changed), C{count}
        messages being ready.
        """
        self.threshold = threshold
        self.watch(count)

    def fell_to(self, count):
        """The ready count fell to C{count}: an alarm that is on goes off if it is low enough."""
        if count <= self.below:  # -1 while the alarm is off
            self.watch(count)

    def watch(self, count):
        """
        Log the ready count C{count} crossing the threshold, once each way;
        watch for the next crossing.
        """
        threshold = self.threshold
        alarmed = threshold is not None and count > threshold
        if alarmed != self.alarmed:
            self.alarmed = alarmed
            queue = self._queue
            if alarmed:
                log.warn(
                    "queue {queue!r} in vhost {vhost!r} has {count} messages ready,"
                    " above its backlog alarm of {threshold}",
                    queue=queue.name, vhost=queue.vhost.name, count=count, threshold=threshold,
                )
            else:
                log.info(
                    "queue {queue!r} in vhost {vhost!r} has {count} messages ready,"
                    " no longer above its backlog alarm{of}",
                    queue=queue.name, vhost=queue.vhost.name, count=count,
                    of="" if threshold is None else f" of {threshold}",
                )
        if alarmed:
            self.above, self.below = NEVER, threshold
        else:
            self.above, self.below = NEVER if threshold is None else threshold, -1
