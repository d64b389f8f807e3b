"""Queues: ready messages in order, consumers served by priority and round-robin
(one at a time with x-single-active-consumer; see L{brokerd.model.consumers}).

A queue holds the entries that wait for a consumer (ready) and knows its
consumers; entries delivered and not yet acked are tracked by the channel that
delivered them. Persistent entries of a persisted queue carry the store handle
that acking them releases.

Over a store that can load messages at once (L{IPagingStore}), a deep queue
keeps only the handle of each persistent message past the first
C{PAGE_OUT_DEPTH} ready ones, and so do the entries recovered at start (runs
of handles, see L{brokerd.model.ready}): the message is loaded from the store
when it reaches a consumer (L{brokerd.model.queue_paging}). A backlog then
costs 8 bytes a message, not its body and an object.

A queue counts the messages enqueued, delivered (or got) and acked since
start, one integer increment each, for the management API's message_stats.
"""

from operator import attrgetter

from twisted.logger import Logger
from zope.interface import implementer

from brokerd.errors import AccessRefused, NotFound, PreconditionFailed, ResourceLocked
from brokerd.interfaces import IExpiringQueue, IPagingStore, StoreCorrupted, UnreadableMessage
from brokerd.model.consumers import QueueConsumers
from brokerd.model.deadletter import DELIVERY_LIMIT, EXPIRED, MAXLEN, REJECTED, dead_letter
from brokerd.model.expiry import MessageExpiry, UnusedExpiry
from brokerd.model.message import Message, QueuedMessage
from brokerd.model.queue_arguments import QueueArguments, message_ttl_of
from brokerd.model.queue_paging import QueuePaging
from brokerd.model.queue_settings import QueueSettings
from brokerd.model.ready import PriorityReady, ReadyList

log = Logger()

PAGE_OUT_DEPTH = 2000  # ready messages a queue keeps in memory before it keeps handles only


@implementer(IExpiringQueue)
class Queue(QueuePaging, QueueSettings):
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
    @ivar backlog_alarmed: True while more messages are ready than its
        backlog alarm (C{policy.backlog_alarm}) allows.
    """

    def __init__(self, vhost, name, durable=False, owner=None, auto_delete=False, arguments=None):
        self.vhost = vhost
        self.name = name
        self.key = (vhost.name, name)
        self.durable = durable
        self.owner = owner
        self.persisted = durable and owner is None
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.own_settings = self.policy = QueueArguments(self.arguments, name, vhost.name)
        self.applied_policy = None
        self.bindings = set()
        self.deleted = False
        self.unavailable = None  # why the store cannot serve this queue, if it cannot
        self._store = vhost.store
        self._pages = self.persisted and IPagingStore.providedBy(vhost.store) and not self.policy.needs_messages
        self._watermark = vhost.watermark
        self._ready = self._new_ready()
        self._ready_bytes = 0  # body bytes of the ready entries kept as objects (for x-max-length-bytes)
        self._consumers = QueueConsumers(self.policy.single_active_consumer)
        self._exclusive_consumer = None
        self._next_sequence = 0  # one per entry made: messages enqueued and recovered
        self._recovered_count = 0  # of those, the recovered ones (not counted as published)
        # Since start, for the management API's message_stats: messages delivered or got, acked.
        self.messages_delivered = self.messages_acked = 0
        self._checks_after_enqueue = False  # a length limit or a backlog alarm to check (set by watch_backlog)
        self._restored_at = None  # when recovered entries came back: their per-message TTLs count from then
        self._counts_before_restart = {}  # handle -> how often a recovered message had come back (x-delivery-count)
        self._clock = vhost.clock
        self._expiry = MessageExpiry(self, vhost.clock)
        self._unused = UnusedExpiry(self, vhost.clock, self.policy.expires) if self.policy.expires else None
        self.backlog_alarmed = False
        self.watch_backlog()

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
        """Body bytes of the ready messages in memory (paged-out ones not counted): the management API's C{memory}."""
        return self._ready_bytes

    def __repr__(self):
        return f"<Queue {self.name!r} in vhost {self.vhost.name!r}>"

    def check_available(self):
        """Raises NotFound (404, as RabbitMQ answers for a queue that is down) if the store lost it."""
        if self.unavailable is not None:
            raise NotFound(f"queue {self.name!r} in vhost {self.vhost.name!r} is unavailable: {self.unavailable}")

    def check_access(self, connection):
        """Raises ResourceLocked if C{connection} may not use this exclusive queue."""
        if self.owner is not None and self.owner is not connection:
            raise ResourceLocked(
                f"cannot obtain exclusive access to locked queue {self.name!r} in vhost {self.vhost.name!r}"
            )

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
        return policy.max_length_bytes is not None and self._ready_bytes + len(message.body) > policy.max_length_bytes

    def refused(self, message):
        """A message this queue refused: with reject-publish-dlx it is dead-lettered."""
        if self.policy.overflow == "reject-publish-dlx":
            dead_letter(self, message, MAXLEN, self._clock.seconds())

    def enqueue(self, message, handle=None, redelivered=False):
        """Add a message at the tail and hand it to a consumer if one has room."""
        sequence = self._next_sequence
        self._next_sequence = sequence + 1
        ttl = self._ttl_of(message)
        if handle is not None and self._pages and ttl is None and len(self._ready) >= PAGE_OUT_DEPTH:
            self._ready.append_paged((handle,), sequence, redelivered)
        else:
            entry = QueuedMessage(message, self, sequence, handle, redelivered)
            if self._counts_before_restart and handle is not None:
                entry.delivery_count = self._counts_before_restart.pop(handle, 0)
            size = len(message.body)
            self._ready.append(entry)
            self._ready_bytes += size
            self._watermark.add(size)
            if ttl is not None:
                published = message.published_at
                entry.expires_at = (self._expiry.now() if published is None else published) + ttl
                self._expiry.track(entry)
        if self._consumers.registered:
            self.dispatch()
        if self._checks_after_enqueue:  # one test on the common path for the two checks below
            self._check_after_enqueue(ttl)
        elif ttl == 0 and self._ready:
            self.expire_due()

    def _check_after_enqueue(self, ttl):
        """After an enqueue on a queue with a length limit or a backlog alarm: drop, expire, watch, in that order."""
        if self.policy.limited:
            self._drop_overflow()
        if ttl == 0 and self._ready:
            self.expire_due()
        if self._ready.count > self._alarm_above:
            self.watch_backlog()

    @property
    def messages_published(self):
        """Messages enqueued since start (recovered ones not counted), for the management API's message_stats."""
        return self._next_sequence - self._recovered_count

    def _ttl_of(self, message):
        """The message's time to live here: the smaller of its own and the queue's, or None."""
        try:
            own = message_ttl_of(message.properties)
        except PreconditionFailed:  # refused at publish; one kept by an older broker has no TTL of its own
            own = None
        queue_ttl = self.policy.message_ttl
        if own is None:
            return queue_ttl
        return own if queue_ttl is None else min(own, queue_ttl)

    def requeue(self, entries):
        """
        Put delivered entries back near the head, each where its arrival order
        puts it, marked redelivered; one returned more often than the queue's
        delivery limit allows dies instead.
        """
        if self.deleted:
            self._watermark.release(sum(map(_body_size, entries)))
            return
        returned = []
        now = self._expiry.now()
        for entry in sorted(entries, key=_by_sequence):
            entry.consumer = None
            if not self.returned(entry):
                continue
            if entry.expires_at is not None and entry.expires_at <= now:
                self._died(entry, EXPIRED)
            else:
                returned.append(entry)
        if returned:
            self._ready.put_back(returned)
            self._ready_bytes += sum(map(_body_size, returned))
            self.watch_backlog()
            self.dispatch()

    def returned(self, entry):
        """
        Count a return of a delivered entry (x-delivery-count); False if that
        was one more than the queue's delivery limit allows, and it died.
        """
        entry.redelivered = True
        entry.delivery_count += 1
        limit = self.policy.delivery_limit
        if limit is not None and entry.delivery_count > limit and not self.deleted:
            self._died(entry, DELIVERY_LIMIT)
            return False
        if entry.handle is not None and not self.deleted:
            self._store.returned(self.key, entry.handle, entry.delivery_count)
        return True

    # -- messages that die

    def reject(self, entry):
        """A delivered entry was rejected or nacked without requeue."""
        if self.deleted:
            self.forget(entry)
        else:
            self._died(entry, REJECTED)

    def _died(self, entry, reason):
        """Dead-letter the entry's message if the queue says where, then forget it."""
        if self.policy.dead_letter_exchange is not None:
            if entry.message is None and not self._load_for_death(entry):
                return
            try:
                dead_letter(self, entry.message, reason, self._clock.seconds())
            except Exception:  # the message is gone from here whatever happened there
                log.failure("queue {queue!r} in vhost {vhost!r}: dead-lettering a message failed",
                            queue=self.name, vhost=self.vhost.name)
        self.forget(entry)

    def _load_for_death(self, entry):
        try:
            entry.message = Message.from_record(self._store.load(entry.handle))
        except UnreadableMessage as problem:
            self._quarantine(entry.handle, problem)
            return False
        except (KeyError, StoreCorrupted) as problem:
            log.error("queue {queue!r}: a message to dead-letter cannot be read: {problem}; dropped",
                      queue=self.name, problem=problem)
            self.forget(entry)
            return False
        self._watermark.add(len(entry.message.body))
        return True

    def expire_due(self):
        """Take out every ready entry whose time has come, head first (and behind it if need be)."""
        now = self._expiry.now()
        expired = []
        ready = self._ready
        while ready:
            entry = ready.popleft()
            if entry.expires_at is not None and entry.expires_at <= now:
                expired.append(entry)
                continue
            ready.appendleft(entry)
            break
        if self._expiry.due(now):
            expired += ready.remove_where(lambda entry: entry.expires_at is not None and entry.expires_at <= now)
        for entry in expired:
            self._ready_bytes -= _body_size(entry)
            self._died(entry, EXPIRED)
        if self.backlog_alarmed and ready.count <= self._alarm_below:
            self.watch_backlog()

    def _drop_overflow(self):
        """x-overflow drop-head: a queue over its length limits loses its oldest messages."""
        policy, ready = self.policy, self._ready
        while ready and (
            (policy.max_length is not None and len(ready) > policy.max_length)
            or (policy.max_length_bytes is not None and self._ready_bytes > policy.max_length_bytes)
        ):
            entry = ready.popleft()  # the head, as RabbitMQ drops: in a priority queue, the highest priority
            self._ready_bytes -= _body_size(entry)
            self._died(entry, MAXLEN)

    # -- messages out

    def get(self):
        """Take the head entry for basic.get, or None if nothing is ready."""
        if self._unused is not None:
            self._unused.touch()
        if self.unavailable is None:
            entry = self._take()
            if self.backlog_alarmed and self._ready.count <= self._alarm_below:
                self.watch_backlog()
            return entry
        return None

    def _take(self):
        """The next entry to deliver, its message loaded; expired ones on the way die; None if there is none."""
        ready = self._ready
        while ready:
            entry = ready.popleft()
            if entry.message is None:
                loaded = self._page_in(entry)
                if loaded is None:
                    continue
                if not loaded:
                    return None
            self._ready_bytes -= len(entry.message.body)
            # Strictly past: a message with a TTL of 0 still goes to a consumer that can take it now.
            if entry.expires_at is not None and entry.expires_at < self._expiry.now():
                self._died(entry, EXPIRED)
                continue
            self.messages_delivered += 1
            return entry
        return None

    def forget(self, entry):
        """The entry is done with (acked, or delivered without ack)."""
        self._watermark.release(_body_size(entry))
        if entry.handle is not None and not self.deleted:
            self._store.ack(self.key, entry.handle)

    def acked(self, entry):
        """A delivered entry the client acked: counted, then done with as by L{forget} (inlined: the ack path)."""
        self.messages_acked += 1
        self._watermark.release(_body_size(entry))
        if entry.handle is not None and not self.deleted:
            self._store.ack(self.key, entry.handle)

    def purge(self):
        """Drop every ready message (delivered, un-acked ones stay); returns how many went."""
        purged, self._ready = self._ready, self._new_ready()
        self._ready_bytes = 0
        self.watch_backlog()
        self._watermark.release(sum(map(_body_size, purged.in_memory())))
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
        if self._exclusive_consumer is not None or (
            consumer.exclusive and (self._consumers or self.policy.single_active_consumer)
        ):
            raise AccessRefused(f"queue {self.name!r} in vhost {self.vhost.name!r} in exclusive use")
        if consumer.exclusive:
            self._exclusive_consumer = consumer
        self._consumers.add(consumer)  # the channel starts deliveries once the client knows the tag
        if self._unused is not None:
            self._unused.stop()

    def remove_consumer(self, consumer):
        """Unregister a consumer; an auto-delete queue goes with its last one."""
        if not self._consumers.remove(consumer):
            return
        if self._exclusive_consumer is consumer:
            self._exclusive_consumer = None
        if self._consumers.single_active and self._consumers and not consumer.unacked:
            # The next consumer takes over. One that went holding deliveries lets it start when they
            # are settled or come back (a closing channel puts them back just after), so they go to it
            # first, redelivered, as RabbitMQ 3.10 hands them on.
            self._clock.callLater(0, self.dispatch)
        if self.auto_delete and not self._consumers and not self.deleted:
            self.vhost.delete_queue(self.name)
        elif self._unused is not None and not self._consumers:
            self._unused.touch()

    def dispatch(self):
        """Deliver ready messages to the consumers that may take them, highest priority first, round-robin."""
        ready = self._ready
        next_with_room = self._consumers.next_with_room
        while ready:
            consumer = next_with_room()
            if consumer is None:
                break
            entry = self._take()
            if entry is None:
                break
            consumer.deliver(entry)
        if self.backlog_alarmed and ready.count <= self._alarm_below:
            self.watch_backlog()

    # -- lifecycle

    def check_delete(self, if_unused, if_empty):
        """Raises PreconditionFailed if delete's if-unused / if-empty forbid it."""
        if if_unused and self._consumers:
            raise PreconditionFailed(f"queue {self.name!r} in vhost {self.vhost.name!r} in use")
        if if_empty and self._ready:
            raise PreconditionFailed(f"queue {self.name!r} in vhost {self.vhost.name!r} not empty")

    def mark_deleted(self):
        """Called by the vhost on delete: cancels consumers, drops messages; returns how many ready ones it dropped."""
        self.deleted = True
        count = len(self._ready)
        self._watermark.release(sum(map(_body_size, self._ready.in_memory())))
        self._ready.clear()
        self._ready_bytes = 0
        self.stop_timers()
        self._cancel_consumers()
        return count

    def _cancel_consumers(self):
        """The queue can serve no one any more: every consumer is told it was cancelled."""
        consumers = self._consumers.clear()
        self._exclusive_consumer = None
        for consumer in consumers:
            consumer.cancelled_by_broker()


_by_sequence = attrgetter("sequence")


def _body_size(entry):
    """The body bytes an entry holds in memory: none while its message is paged out."""
    message = entry.message
    return 0 if message is None else len(message.body)
