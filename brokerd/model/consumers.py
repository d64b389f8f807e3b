"""The consumers of one queue, which of them gets the next message, and the
arguments a consumer may carry.

A queue knows its consumers only as L{brokerd.interfaces.IConsumer}s: it asks
one for room, hands it entries and tells it when it is cancelled. The
provider is the channel's (L{brokerd.session.consumer.Consumer}).

As RabbitMQ 3.10 serves a classic queue: consumers of a higher priority
(``x-priority`` on basic.consume, 0 if not given) get messages first,
round-robin among those of the same priority that have prefetch room; a lower
priority gets messages only while every higher one is blocked. A queue with
``x-single-active-consumer`` delivers to one consumer only, the earliest
registered still there (priorities play no part, as in RabbitMQ 3.10); when it
goes, the next in registration order takes over.

The consumer arguments basic.consume may carry are checked here too, with
RabbitMQ's replies.
"""

from collections import deque

from brokerd.errors import PreconditionFailed
from brokerd.model.queue_arguments import amqp_type_name

CONSUMER_PRIORITY = "x-priority"
CANCEL_ON_HA_FAILOVER = "x-cancel-on-ha-failover"  # accepted: a single node never fails over
STREAM_OFFSET = "x-stream-offset"  # for stream queues only, which brokerd does not have
CREDIT = "x-credit"  # RabbitMQ's credit flow for its AMQP 1.0 plugin: not implemented


class QueueConsumers:
    """
    The consumers of a queue in the order they registered, grouped by priority.

    A queue without priorities keeps one group, so picking a consumer costs
    what a single round-robin list costs.

    @ivar exclusive: the consumer that registered exclusive (basic.consume's
        exclusive flag), while it is there; else None.
    """

    __slots__ = ("single_active", "registered", "exclusive", "_groups", "_ordered")

    def __init__(self, single_active=False):
        self.single_active = single_active
        self.registered = {}  # consumer -> None, in registration order (read it, do not change it)
        self.exclusive = None
        self._groups = {}  # priority -> deque of consumers, rotated as they are served
        self._ordered = []  # the groups, highest priority first: what a delivery walks

    def __len__(self):
        return len(self.registered)

    def __bool__(self):
        return bool(self.registered)

    @property
    def active(self):
        """The consumer a single-active-consumer queue delivers to, else None."""
        if self.single_active and self.registered:
            return next(iter(self.registered))
        return None

    def admits(self, consumer):
        """
        False if an exclusive consumer is in the way, or if C{consumer} would
        be exclusive where others consume or a single active consumer is the
        rule (RabbitMQ refuses both alike).
        """
        return self.exclusive is None and not (
            consumer.exclusive and (self.registered or self.single_active)
        )

    def add(self, consumer):
        """Register C{consumer} (that L{admits} it is the caller's to check)."""
        self.registered[consumer] = None
        if consumer.exclusive:
            self.exclusive = consumer
        priority = consumer.priority
        group = self._groups.get(priority)
        if group is None:
            group = self._groups[priority] = deque()
            self._order_groups()
        group.append(consumer)

    def remove(self, consumer):
        """Forget C{consumer}; False if it was not here."""
        if consumer not in self.registered:
            return False
        del self.registered[consumer]
        if self.exclusive is consumer:
            self.exclusive = None
        group = self._groups[consumer.priority]
        group.remove(consumer)
        if not group:
            del self._groups[consumer.priority]
            self._order_groups()
        return True

    def _order_groups(self):
        self._ordered = [self._groups[priority] for priority in sorted(self._groups, reverse=True)]

    def clear(self):
        """Forget every consumer; returns them in registration order."""
        consumers = list(self.registered)
        self.registered.clear()
        self.exclusive = None
        self._groups.clear()
        self._ordered = []
        return consumers

    def sole(self):
        """
        The consumer that alone may take the next messages, or None if
        several share them: the single active one, or the only one there is.
        """
        if self.single_active:
            return self.active
        if len(self.registered) == 1:
            return next(iter(self.registered))
        return None

    def next_with_room(self):
        """
        The consumer the next message goes to, or None if every one that may
        get it is blocked.
        """
        if self.single_active:
            active = self.active
            return active if active is not None and active.has_room() else None
        for group in self._ordered:
            for _ in range(len(group)):
                consumer = group[0]
                group.rotate(-1)
                if consumer.has_room():
                    return consumer
        return None


def consumer_priority(arguments, queue):
    """
    The priority basic.consume's C{arguments} give a consumer of C{queue}
    (0 without ``x-priority``), after checking every consumer argument
    RabbitMQ knows; others are ignored, as RabbitMQ ignores them.

    @raise PreconditionFailed: with RabbitMQ's text, naming the argument.
    """
    if not arguments:
        return 0
    where = f"queue {queue.name!r} in vhost {queue.vhost.name!r}"
    priority = arguments.get(CONSUMER_PRIORITY, 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PreconditionFailed(
            f"invalid arg {CONSUMER_PRIORITY!r} for {where}:"
            f" \"expected integer, got {amqp_type_name(priority)}\""
        )
    failover = arguments.get(CANCEL_ON_HA_FAILOVER, False)
    if not isinstance(failover, bool):
        raise PreconditionFailed(
            f"invalid arg {CANCEL_ON_HA_FAILOVER!r} for {where}:"
            f" {{unacceptable_type,{amqp_type_name(failover)}}}"
        )
    if STREAM_OFFSET in arguments:
        raise PreconditionFailed(
            f"invalid arg {STREAM_OFFSET!r} for {where}"
            f" of queue type {queue.policy.rabbitmq_type_module}"
        )
    if CREDIT in arguments:
        raise PreconditionFailed(
            f"invalid arg {CREDIT!r} for {where}: credit flow control is not implemented"
        )
    return priority
