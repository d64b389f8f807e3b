"""Queues: ready messages in order, consumers served by priority and round-robin
(one at a time with x-single-active-consumer; see L{brokerd.model.consumers}).

A queue holds the entries that wait for a consumer (ready, see
L{brokerd.model.ready}) and knows its consumers; entries delivered and not yet
acked are tracked by the channel that delivered them. Persistent entries of a
persisted queue carry the store handle that acking them releases.

The queue runs its message paths and calls parts that each keep their own state:
  - its L{MessagePager} loads the messages it keeps as store handles only (a
    deep backlog, the messages recovered at start: see L{brokerd.model.paging});
  - its L{MessageExpiry} knows each message's time to live and runs the timer
    that takes out expired ones; its L{UnusedExpiry} deletes it after
    x-expires without use;
  - its L{BacklogAlarm} logs the ready count crossing x-backlog-alarm;
  - its L{QueueConsumers} pick the consumer each message goes to;
  - its L{QueueDeadLetters} send the messages it gives up on to its dead-letter
    exchange;
  - its L{QueueReturns} count the deliveries that come back and put them back
    in order, or let them die;
  - its L{QueueRecovery} takes its stored messages back at start.
When its effective settings change (a policy starts or stops applying, see
L{brokerd.model.policy_effects}), L{Queue.change_settings} gives each part its
new setting at once, so the message paths only read plain attributes.

A queue counts the messages enqueued, delivered (or got) and acked since
start, one integer increment each, for the management API's message_stats.
"""

from twisted.logger import Logger
from zope.interface import implementer

from brokerd.errors import AccessRefused, NotFound, PreconditionFailed
from brokerd.interfaces import IExpiringQueue
from brokerd.model.backlog_alarm import BacklogAlarm
from brokerd.model.consumers import QueueConsumers
from brokerd.model.deadletter import EXPIRED, REJECTED, QueueDeadLetters
from brokerd.model.expiry import MessageExpiry, UnusedExpiry
from brokerd.model.message import QueuedMessage
from brokerd.model.paging import PAGE_OUT_DEPTH, STORE_FAILURES, MessagePager
from brokerd.model.queue_arguments import QueueArguments
from brokerd.model.queue_types import locked_queue
from brokerd.model.ready import PriorityReady, ReadyList, body_size
from brokerd.model.recovery import QueueRecovery
from brokerd.model.returns import QueueReturns

log = Logger()


@implementer(IExpiringQueue)
class Queue:
    """
    One queue of a virtual host. Above the model it calls only its consumers,
    as L{brokerd.interfaces.IConsumer}s.

    @ivar owner: the L{brokerd.interfaces.IQueueOwner} (a connection) an
        exclusive queue belongs to, else None.
    @ivar persisted: True if the store keeps this queue and its persistent
        messages: durable and not exclusive (an exclusive queue dies with its
        connection, so it never outlives a restart).
    @ivar deleted: set once the queue is deleted; late acks and requeues of its
        messages are then ignored.
    @ivar own_settings: what its declare arguments ask (L{QueueArguments}).
    @ivar policy: its effective settings: C{own_settings} merged with the
        applied policy's keys (see L{brokerd.model.policy_effects}).
    @ivar applied_policy: the vhost's L{brokerd.model.policy_effects.Policy} that
        applies to it, or None.
    """

    def __init__(self, vhost, name, durable=False, owner=None, auto_delete=False, arguments=None):
        # 29 attributes: CPython 3.11 keeps up to 30 in an instance's compact
        # shared-key table, where the message paths read them faster; with 34 a
        # message published, delivered and acked cost ~1,900 more instructions.
        self.vhost = vhost
        self.name = name
        self.key = (vhost.name, name)
        self.durable = durable
        self.owner = owner
        self.persisted = durable and owner is None
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.own_settings = self.policy = settings = QueueArguments(
            self.arguments, name, vhost.name
        )
        self.applied_policy = None
        self.bindings = set()
        self.deleted = False
        self.unavailable = None  # why the store cannot serve this queue, if it cannot
        self._store = vhost.store
        self._watermark = vhost.watermark
        self._ready = self._new_ready()
        self._next_sequence = 0  # one per entry made: messages enqueued and recovered
        # Since start, for the management API's message_stats: messages delivered or got, acked.
        self.messages_delivered = self.messages_acked = 0
        self._consumers = QueueConsumers(settings.single_active_consumer)
        self._expiry = MessageExpiry(self, vhost.clock, settings.message_ttl)
        self._pager = MessagePager(self, vhost.store, vhost.watermark, self._expiry, settings)
        self._dead_letters = QueueDeadLetters(self, self._pager, vhost.clock)
        self._returns = QueueReturns(self, vhost.store, self._expiry, self._dead_letters)
        # Of the entries made, the recovered ones (not counted as published):
        self.recovery = QueueRecovery(self, self._pager, self._expiry)
        self._unused = (
            UnusedExpiry(self, vhost.clock, settings.expires) if settings.expires else None
        )
        self._alarm = BacklogAlarm(self, settings.backlog_alarm, 0)
        self._checks_after_enqueue = (  # see enqueue
            settings.limited or settings.backlog_alarm is not None
        )

    def _new_ready(self):
        if self.policy.max_priority is not None:
            return PriorityReady(self, self.policy.max_priority)
        return ReadyList(self)

    @property
    def exclusive(self):
        return self.owner is not None

    @property
    def message_count(self):
        """Messages waiting for a consumer (delivered, un-acked ones not counted)."""
        return len(self._ready)

    @property
    def consumer_count(self):
        return len(self._consumers)

    @property
    def ready_bytes(self):
        """
        Body bytes of the ready messages in memory (paged-out ones not
        counted): the management API's C{memory}.
        """
        return self._ready.bytes

    @property
    def messages_published(self):
        """
        Messages enqueued since start (recovered ones not counted), for the
        management API's message_stats.
        """
        return self._next_sequence - self.recovery.count

    @property
    def backlog_alarm(self):
        """Ready messages above which the backlog alarm goes off, or None."""
        return self.policy.backlog_alarm

    @property
    def backlog_alarmed(self):
        """True while more messages are ready than its backlog alarm allows."""
        return self._alarm.alarmed

    def __repr__(self):
        return f"<Queue {self.name!r} in vhost {self.vhost.name!r}>"

    def check_available(self):
        """
        Raises NotFound (404, as RabbitMQ answers for a queue that is down) if
        the store lost it.
        """
        if self.unavailable is not None:
            raise NotFound(
                f"queue {self.name!r} in vhost {self.vhost.name!r} is unavailable:"
                f" {self.unavailable}"
            )

    def check_access(self, connection):
        """Raises ResourceLocked if C{connection} may not use this exclusive queue."""
        if self.owner is not None and self.owner is not connection:
            raise locked_queue(self.name, self.vhost.name)

    # -- messages in

    def refuses(self, message):
        """
        True if a full queue with x-overflow reject-publish(-dlx) would refuse
        C{message} (the publisher then gets a nack); a drop-head queue never does.
        """
        policy = self.policy
        if policy.overflow == "drop-head" or not policy.limited:
            return False
        if policy.max_length is not None and len(self._ready) >= policy.max_length:
            return True
        return (
            policy.max_length_bytes is not None
            and self._ready.bytes + len(message.body) > policy.max_length_bytes
        )

    def refused(self, message):
        """A message this queue refused: with reject-publish-dlx it is dead-lettered."""
        self._dead_letters.refused(message)

    def enqueue(self, message, handle=None, redelivered=False):
        """Add a message at the tail and hand it to a consumer if one has room."""
        sequence = self._next_sequence
        self._next_sequence = sequence + 1
        ttl = self._expiry.ttl_of(message)
        ready = self._ready
        if (
            handle is not None
            and ttl is None
            and ready.count >= PAGE_OUT_DEPTH
            and self._pager.pages
        ):
            ready.append_paged((handle,), sequence, redelivered)
        else:
            entry = QueuedMessage(message, self, sequence, handle, redelivered)
            if handle is not None and self._pager.restored_counts:
                entry.delivery_count = self._pager.delivery_count(handle)
            ready.append(entry)
            self._watermark.add(len(message.body))
            if ttl is not None:
                self._expiry.start(entry, ttl)
        if self._consumers.registered:
            self.vhost.dispatches.dispatch(self)  # at once, or after a burst being read
        if self._checks_after_enqueue:  # one test on the common path for the two checks below
            self._check_after_enqueue(ttl)
        elif ttl == 0 and self._ready:
            self.expire_due()

    def _check_after_enqueue(self, ttl):
        """
        After an enqueue on a queue with a length limit or a backlog alarm:
        drop, expire, watch, in that order.
        """
        if self.policy.limited:
            self._dead_letters.drop_overflow(self._ready)
        if ttl == 0 and self._ready:
            self.expire_due()
        count = self._ready.count
        if count > self._alarm.above:
            self._alarm.watch(count)

    def requeue(self, entries):
        """
        Put delivered entries back near the head, each where its arrival order
        puts it, marked redelivered; one returned more often than the queue's
        delivery limit allows dies instead (see L{QueueReturns.requeue}).
        """
        if self.deleted:
            self._watermark.release(sum(map(body_size, entries)))
            return
        if self._returns.requeue(entries, self._ready):
            self._alarm.watch(self._ready.count)
            self.dispatch()

    def returned(self, entry):
        """
        Count a return of a delivered entry (x-delivery-count); False if that
        was one more than the queue's delivery limit allows, and it died.
        """
        return self._returns.returned(entry)

    # -- messages that die

    def reject(self, entry):
        """A delivered entry was rejected or nacked without requeue."""
        if self.deleted:
            self.forget(entry)
        else:
            self._dead_letters.died(entry, REJECTED)

    def expire_due(self):
        """Take out every ready entry whose time has come, head first (and behind it if need be)."""
        ready = self._ready
        for entry in self._expiry.take_expired(ready):
            self._dead_letters.died(entry, EXPIRED)
        self._alarm.fell_to(ready.count)

    # -- messages out

    def get(self):
        """Take the head entry for basic.get, or None if nothing is ready."""
        if self._unused is not None:
            self._unused.touch()
        if self.unavailable is None:
            entry = self._take()
            self._alarm.fell_to(self._ready.count)
            return entry
        return None

    def _take(self):
        """
        The next entry to deliver, its message loaded; expired ones on the way
        die; None if there is none.
        """
        ready = self._ready
        while ready:
            entry = ready.popleft()
            if entry.message is None:
                try:
                    if not self._pager.page_in(entry):
                        continue  # unreadable: quarantined
                except STORE_FAILURES as problem:
                    ready.appendleft(entry)
                    self.store_failed(problem)
                    return None
            # Strictly past: a message with a TTL of 0 still goes to a consumer
            # that can take it now.
            if entry.expires_at is not None and entry.expires_at < self._expiry.now():
                self._dead_letters.died(entry, EXPIRED)
                continue
            self.messages_delivered += 1
            return entry
        return None

    def store_failed(self, problem):
        """
        The store cannot give a message of this queue back: the queue is
        unavailable and its consumers go.
        """
        log.error(
            "queue {queue!r} in vhost {vhost!r} is unavailable:"
            " a stored message cannot be read: {problem}",
            queue=self.name, vhost=self.vhost.name, problem=problem,
        )
        self.vhost.mark_unavailable(self, f"a stored message cannot be read: {problem}")
        self._cancel_consumers()

    def drop_unstored(self, handles):
        """A failed commit lost the appends of C{handles} (a set): their publishes were nacked,
        and those still ready leave unseen."""
        bytes_before = self._ready.bytes
        taken = self._ready.remove_handles(handles)
        self._watermark.release(bytes_before - self._ready.bytes)
        for handle in taken:
            self._store.ack(self.key, handle)

    def forget(self, entry):
        """The entry is done with (acked, or delivered without ack)."""
        self._watermark.release(body_size(entry))
        if entry.handle is not None and not self.deleted:
            self._store.ack(self.key, entry.handle)

    def acked(self, entry):
        """
        A delivered entry the client acked: counted, then done with as by
        L{forget} (inlined: the ack path).
        """
        self.messages_acked += 1
        self._watermark.release(body_size(entry))
        if entry.handle is not None and not self.deleted:
            self._store.ack(self.key, entry.handle)

    def purge(self):
        """Drop every ready message (delivered, un-acked ones stay); returns how many went."""
        purged, self._ready = self._ready, self._new_ready()
        self._alarm.watch(0)
        self._watermark.release(purged.bytes)
        if self.persisted:
            handles = [handle for handle in purged.handles() if handle is not None]
            if handles:
                self._store.purge(self.key, handles)
        return len(purged)

    def stop_timers(self):
        self._expiry.stop()
        if self._unused is not None:
            self._unused.stop()

    # -- consumers

    def add_consumer(self, consumer):
        """
        Register a consumer; raises if an exclusive consumer is in the way, or
        if it would be exclusive where others consume or a single active
        consumer is the rule (as RabbitMQ, which refuses both alike).
        """
        if not self._consumers.admits(consumer):
            raise AccessRefused(
                f"queue {self.name!r} in vhost {self.vhost.name!r} in exclusive use"
            )
        self._consumers.add(consumer)  # the channel starts deliveries once the client knows the tag
        if self._unused is not None:
            self._unused.stop()

    def remove_consumer(self, consumer):
        """Unregister a consumer; an auto-delete queue goes with its last one."""
        consumers = self._consumers
        if not consumers.remove(consumer):
            return
        if consumers.single_active and consumers and not consumer.unacked:
            # The next consumer takes over. One that went holding deliveries lets it start
            # when they are settled or come back (a closing channel puts them back just
            # after), so they go to it first, redelivered, as RabbitMQ 3.10 hands them on.
            self.vhost.clock.callLater(0, self.dispatch)
        if self.auto_delete and not consumers and not self.deleted:
            self.vhost.delete_queue(self.name)
        elif self._unused is not None and not consumers:
            self._unused.touch()

    def dispatch(self):
        """
        Deliver ready messages to the consumers that may take them, highest
        priority first, round-robin. A consumer that takes them all (the only or
        single active one) gets them as a run (L{brokerd.interfaces.IConsumer.start_run}).
        """
        ready = self._ready
        consumers = self._consumers
        if ready.count > 1 and (sole := consumers.sole()) is not None:
            has_room = sole.has_room
            sole.start_run()
            try:
                while ready and has_room():
                    entry = self._take()
                    if entry is None:
                        break
                    sole.deliver(entry)
            finally:
                sole.end_run()
        else:
            next_with_room = consumers.next_with_room
            while ready:
                consumer = next_with_room()
                if consumer is None:
                    break
                entry = self._take()
                if entry is None:
                    break
                consumer.deliver(entry)
        if ready.count <= self._alarm.below:  # -1 while the alarm is off: no call on this path
            self._alarm.watch(ready.count)

    def _cancel_consumers(self):
        """The queue can serve no one any more: every consumer is told it was cancelled."""
        for consumer in self._consumers.clear():
            consumer.cancelled_by_broker()

    # -- recovery

    def append_handles(self, handles):
        """
        Add entries kept as store handles only (recovered at start, see
        L{QueueRecovery}) at the tail, flagged redelivered.
        """
        sequence = self._next_sequence
        self._ready.append_paged(handles, sequence, True)
        self._next_sequence = sequence + len(handles)
        self._alarm.watch(self._ready.count)

    # -- settings

    def change_settings(self, settings):
        """
        New effective settings (its policy changed), applied as RabbitMQ
        applies a policy to a queue that exists: a TTL to the messages that
        come from now on, a length limit at once (a drop-head queue over it
        loses its oldest messages, dead-lettered if it says where), a new
        x-expires countdown from now.
        """
        previous, self.policy = self.policy, settings
        paged = self._pager.pages
        self._pager.follow(settings)
        self._expiry.follow(settings)
        if paged and settings.max_length_bytes is not None and previous.max_length_bytes is None:
            # A byte limit counts the messages kept as handles only: they are
            # loaded, as when recovered.
            try:
                self._pager.load_backlog(self._ready)
            except STORE_FAILURES as problem:
                self.store_failed(problem)
        if settings.expires != previous.expires:
            if self._unused is not None:
                self._unused.stop()
            self._unused = (
                UnusedExpiry(self, self.vhost.clock, settings.expires) if settings.expires else None
            )
        if settings.limited and settings.overflow == "drop-head":
            self._dead_letters.drop_overflow(self._ready)
        self._alarm.follow(settings.backlog_alarm, self._ready.count)
        self._checks_after_enqueue = settings.limited or settings.backlog_alarm is not None

    def touch(self):
        """The queue was declared again: it counts as used (x-expires)."""
        if self._unused is not None:
            self._unused.touch()

    # -- lifecycle

    def check_delete(self, if_unused, if_empty):
        """Raises PreconditionFailed if delete's if-unused / if-empty forbid it."""
        if if_unused and self._consumers:
            raise PreconditionFailed(f"queue {self.name!r} in vhost {self.vhost.name!r} in use")
        if if_empty and self._ready:
            raise PreconditionFailed(f"queue {self.name!r} in vhost {self.vhost.name!r} not empty")

    def mark_deleted(self):
        """
        Called by the vhost on delete: cancels consumers, drops messages;
        returns how many ready ones it dropped.
        """
        self.deleted = True
        count = len(self._ready)
        self._watermark.release(self._ready.bytes)
        self._ready.clear()
        self.stop_timers()
        self._cancel_consumers()
        return count

