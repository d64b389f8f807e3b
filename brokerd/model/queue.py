"""Queues: ready messages in order, consumers served round-robin.

A queue holds the entries that wait for a consumer (ready) and knows its
consumers; entries delivered and not yet acked are tracked by the channel that
delivered them. Persistent entries of a persisted queue carry the store handle
that acking them releases.

Over a store that can load messages at once (L{IPagingStore}), a deep queue
keeps only the handle of each persistent message past the first
C{PAGE_OUT_DEPTH} ready ones, and so do the entries recovered at start (runs
of handles, see L{brokerd.model.ready}): the message is loaded from the store
when it reaches a consumer. A backlog then costs 8 bytes a message, not its
body and an object.
"""

from collections import deque

from twisted.logger import Logger

from brokerd.errors import AccessRefused, NotFound, PreconditionFailed, ResourceLocked
from brokerd.interfaces import IPagingStore, StoreCorrupted
from brokerd.model.message import QueuedMessage
from brokerd.model.ready import ReadyList

log = Logger()

PAGE_OUT_DEPTH = 2000  # ready messages a queue keeps in memory before it keeps handles only


class Queue:
    """
    One queue of a virtual host.

    @ivar owner: the connection an exclusive queue belongs to, else None.
    @ivar persisted: True if the store keeps this queue and its persistent
        messages: durable and not exclusive (an exclusive queue dies with its
        connection, so it never outlives a restart).
    @ivar deleted: set once the queue is deleted; late acks and requeues of its
        messages are then ignored.
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
        self.bindings = set()
        self.deleted = False
        self.unavailable = None  # why the store cannot serve this queue, if it cannot
        self._store = vhost.store
        self._pages = self.persisted and IPagingStore.providedBy(vhost.store)
        self._watermark = vhost.watermark
        self._ready = ReadyList(self)
        self._consumers = deque()
        self._exclusive_consumer = None
        self._next_sequence = 0

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

    def enqueue(self, message, handle=None, redelivered=False):
        """Add a message at the tail and hand it to a consumer if one has room."""
        sequence = self._next_sequence
        self._next_sequence = sequence + 1
        if handle is not None and self._pages and len(self._ready) >= PAGE_OUT_DEPTH:
            self._ready.append_paged((handle,), sequence, redelivered)
        else:
            self._ready.append(QueuedMessage(message, self, sequence, handle, redelivered))
            self._watermark.add(len(message.body))
        if self._consumers:
            self.dispatch()

    def restore_paged(self, handles):
        """Add stored messages recovered at start, by handle only (each loaded when delivered), as redelivered."""
        sequence = self._next_sequence
        self._ready.append_paged(handles, sequence, True)
        self._next_sequence = sequence + len(handles)

    def _page_in(self, entry):
        """Load a paged-out entry's message; on failure the queue becomes unavailable and False is returned."""
        try:
            message = self._store.load(entry.handle)
        except (KeyError, StoreCorrupted) as problem:
            log.error("queue {queue!r} in vhost {vhost!r} is unavailable: a stored message cannot be read: {problem}",
                      queue=self.name, vhost=self.vhost.name, problem=problem)
            self._ready.appendleft(entry)
            self.vhost.mark_unavailable(self, f"a stored message cannot be read: {problem}")
            self._cancel_consumers()
            return False
        entry.message = message
        self._watermark.add(len(message.body))
        return True

    def requeue(self, entries):
        """
        Put delivered entries back near the head, each where its arrival order
        puts it, marked redelivered.
        """
        if self.deleted:
            self._watermark.release(sum(map(_body_size, entries)))
            return
        returned = sorted(entries, key=_by_sequence)
        for entry in returned:
            entry.redelivered = True
            entry.delivery_count += 1
            entry.consumer = None
        ready = self._ready
        last = returned[-1].sequence
        overtaken = []
        while ready and ready.head_sequence() < last:
            overtaken.append(ready.popleft())
        if overtaken:
            returned = sorted(returned + overtaken, key=_by_sequence)
        ready.extendleft(reversed(returned))
        self.dispatch()

    # -- messages out

    def get(self):
        """Take the head entry for basic.get, or None if nothing is ready."""
        if self._ready and self.unavailable is None:
            entry = self._ready.popleft()
            if entry.message is None and not self._page_in(entry):
                return None
            return entry
        return None

    def forget(self, entry):
        """The entry is done with (acked, or delivered without ack)."""
        self._watermark.release(_body_size(entry))
        if entry.handle is not None and not self.deleted:
            self._store.ack(self.key, entry.handle)

    def purge(self):
        """Drop every ready message (delivered, un-acked ones stay); returns how many went."""
        purged, self._ready = self._ready, ReadyList(self)
        self._watermark.release(sum(map(_body_size, purged.in_memory())))
        if self.persisted:
            handles = [handle for handle in purged.handles() if handle is not None]
            if handles:
                self._store.purge(self.key, handles)
        return len(purged)

    # -- consumers

    def add_consumer(self, consumer):
        """Register a consumer; raises if an exclusive consumer is in the way."""
        if self._exclusive_consumer is not None:
            raise AccessRefused(f"queue {self.name!r} in vhost {self.vhost.name!r} in exclusive use")
        if consumer.exclusive and self._consumers:
            raise AccessRefused(
                f"queue {self.name!r} in vhost {self.vhost.name!r} has consumers; cannot consume exclusively"
            )
        if consumer.exclusive:
            self._exclusive_consumer = consumer
        self._consumers.append(consumer)  # the channel starts deliveries once the client knows the tag

    def remove_consumer(self, consumer):
        """Unregister a consumer; an auto-delete queue goes with its last one."""
        try:
            self._consumers.remove(consumer)
        except ValueError:
            return
        if self._exclusive_consumer is consumer:
            self._exclusive_consumer = None
        if self.auto_delete and not self._consumers and not self.deleted:
            self.vhost.delete_queue(self.name)

    def dispatch(self):
        """Deliver ready messages to consumers with room, round-robin."""
        ready = self._ready
        consumers = self._consumers
        while ready and consumers:
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.has_room():
                    break
            else:
                return
            entry = ready.popleft()
            if entry.message is None and not self._page_in(entry):
                return
            consumer.channel.deliver(consumer, entry)

    # -- lifecycle

    def check_delete(self, if_unused, if_empty):
        """Raises PreconditionFailed if delete's if-unused / if-empty forbid it."""
        if if_unused and self._consumers:
            raise PreconditionFailed(f"queue {self.name!r} in vhost {self.vhost.name!r} in use")
        if if_empty and self._ready:
            raise PreconditionFailed(f"queue {self.name!r} in vhost {self.vhost.name!r} not empty")

    def mark_deleted(self):
        """Called by the vhost on delete: cancels consumers, drops messages.

        @return: the number of ready messages dropped.
        """
        self.deleted = True
        count = len(self._ready)
        self._watermark.release(sum(map(_body_size, self._ready.in_memory())))
        self._ready.clear()
        self._cancel_consumers()
        return count

    def _cancel_consumers(self):
        """The queue can serve no one any more: every consumer is told it was cancelled."""
        consumers, self._consumers = list(self._consumers), deque()
        self._exclusive_consumer = None
        for consumer in consumers:
            consumer.channel.consumer_cancelled_by_broker(consumer)


def _by_sequence(entry):
    return entry.sequence


def _body_size(entry):
    """The body bytes an entry holds in memory: none while its message is paged out."""
    message = entry.message
    return 0 if message is None else len(message.body)
