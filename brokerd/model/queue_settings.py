"""The parts of a queue that follow its effective settings when they change: x-expires and the backlog alarm.

A queue's settings change when a policy starts or stops applying to it
(L{brokerd.model.policy_effects}); L{QueueSettings.change_settings} then
applies them at once, so the message paths only read plain attributes.

The backlog alarm (brokerd's own, as EQueue has one) goes off when more
messages are ready than C{x-backlog-alarm} or the policy key
C{backlog-alarm} allows: a warning is logged once, and an info line once
the ready count is back at or below the threshold. The queue's message
paths compare the ready count with C{_alarm_above} (while the alarm is
off) or C{_alarm_below} (while it is on) and call L{watch_backlog} only
when it crosses.
"""

import sys

from twisted.logger import Logger

from brokerd.interfaces import IPagingStore
from brokerd.model.expiry import UnusedExpiry

log = Logger()

NEVER = sys.maxsize  # a ready count no queue reaches


class QueueSettings:
    """
    Mixed into L{brokerd.model.queue.Queue}: settings changes, the x-expires
    countdown and the backlog alarm.
    """

    def change_settings(self, settings):
        """
        New effective settings (its policy changed), applied as RabbitMQ
        applies a policy to a queue that exists: a TTL to the messages that
        come from now on, a length limit at once (a drop-head queue over it
        loses its oldest messages, dead-lettered if it says where), a new
        x-expires countdown from now.
        """
        previous, self.policy = self.policy, settings
        paged, self._pages = self._pages, (self.persisted and IPagingStore.providedBy(self._store)
                                           and not settings.needs_messages)
        if paged and settings.max_length_bytes is not None and previous.max_length_bytes is None:
            self._load_backlog()
        if settings.expires != previous.expires:
            if self._unused is not None:
                self._unused.stop()
            self._unused = UnusedExpiry(self, self._clock, settings.expires) if settings.expires else None
        if settings.limited and settings.overflow == "drop-head":
            self._drop_overflow()
        self.watch_backlog()

    def _load_backlog(self):
        """Load the messages kept as handles only (a paging queue's backlog), so that a new byte limit counts
        them: as a queue that must see its messages loads them when recovered."""
        ready, loaded = self._ready, []
        while ready:
            entry = ready.popleft()
            if entry.message is None:
                outcome = self._page_in(entry)
                if outcome is None:  # unreadable: quarantined, and gone from here
                    continue
                if outcome is False:  # the store failed: the entry is back at the head and the queue unavailable
                    break
            loaded.append(entry)
        ready.extendleft(reversed(loaded))

    def touch(self):
        """The queue was declared again: it counts as used (x-expires)."""
        if self._unused is not None:
            self._unused.touch()

    @property
    def backlog_alarm(self):
        """Ready messages above which the backlog alarm goes off, or None."""
        return self.policy.backlog_alarm

    def watch_backlog(self):
        """Log the ready count crossing the backlog alarm's threshold, once each way; watch for the next crossing."""
        threshold, count = self.policy.backlog_alarm, self._ready.count
        alarmed = threshold is not None and count > threshold
        if alarmed != self.backlog_alarmed:
            self.backlog_alarmed = alarmed
            if alarmed:
                log.warn("queue {queue!r} in vhost {vhost!r} has {count} messages ready, above its backlog alarm of"
                         " {threshold}", queue=self.name, vhost=self.vhost.name, count=count, threshold=threshold)
            else:
                log.info("queue {queue!r} in vhost {vhost!r} has {count} messages ready, no longer above its backlog"
                         " alarm{of}", queue=self.name, vhost=self.vhost.name, count=count,
                         of="" if threshold is None else f" of {threshold}")
        if alarmed:
            self._alarm_above, self._alarm_below = NEVER, threshold
        else:
            self._alarm_above, self._alarm_below = NEVER if threshold is None else threshold, -1
        self._checks_after_enqueue = self.policy.limited or threshold is not None
