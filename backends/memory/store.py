"""L{MemoryStore}: the store contract kept in dicts, for one process lifetime."""

from itertools import islice

from twisted.internet import defer
from zope.interface import implementer

from backends.common.delayed_requests import check_cursor, check_due, check_exchange
from backends.common.message_record import record_of
from backends.memory.sortedkeys import SortedKeys
from brokerd.interfaces import DelayedMessage, IDelayedMessageStore, IMessageStore
from brokerd.proto.tables import freeze, table_to_dict


def _binding_key(record):
    """What makes two bindings the same; the queue is empty for one to an exchange, the
    exchange for one to a queue."""
    return (record.vhost, record.exchange, record.queue, record.routing_key,
            freeze(table_to_dict(record.arguments)), record.destination_exchange)


@implementer(IMessageStore, IDelayedMessageStore)
class MemoryStore:
    """
    Holds topology records and persistent messages in memory.

    Handles are integers in append order. A message stays until every queue it
    was appended for has acked it, purged it or been deleted. Delayed messages
    are kept as objects, their keys C{(due, handle)} in a L{SortedKeys}.
    """

    name = "memory"
    durable = False

    def __init__(self):
        self._exchanges = {}  # (vhost, name) -> ExchangeRecord
        self._queues = {}  # queue key -> QueueRecord
        self._bindings = {}  # binding key -> BindingRecord
        self._messages = {}  # handle -> [message, set of queue keys still holding it]
        self._queue_handles = {}  # queue key -> {handle: None}, in append order
        self._delivery_counts = {}  # queue key -> {handle: how often it came back unacked}
        self._next_handle = 1
        self._bytes = 0
        self._appends = 0
        self._acks = 0
        self._delayed = {}  # delayed handle -> (due, exchange key, message)
        self._delayed_keys = SortedKeys()  # (due, handle) of every kept delayed message
        self._next_delayed = 1

    def open(self):
        return defer.succeed(None)

    def topology(self):
        return [*self._exchanges.values(), *self._queues.values(), *self._bindings.values()]

    def recover(self, queue):
        return [
            (handle, record_of(self._messages[handle][0]), False)
            for handle in self._queue_handles.get(queue, ())
        ]

    def save_exchange(self, record):
        self._exchanges[(record.vhost, record.name)] = record

    def delete_exchange(self, vhost, name):
        self._exchanges.pop((vhost, name), None)
        for key in [key for key in self._bindings if key[0] == vhost and name in (key[1], key[5])]:
            del self._bindings[key]

    def save_queue(self, record):
        key = (record.vhost, record.name)
        self._queues[key] = record
        self._queue_handles.setdefault(key, {})

    def delete_queue(self, queue):
        self._queues.pop(queue, None)
        vhost, name = queue
        for key in [key for key in self._bindings if key[0] == vhost and key[2] == name]:
            del self._bindings[key]
        self._delivery_counts.pop(queue, None)
        for handle in self._queue_handles.pop(queue, ()):
            self._release(queue, handle)

    def save_binding(self, record):
        self._bindings[_binding_key(record)] = record

    def delete_binding(self, record):
        self._bindings.pop(_binding_key(record), None)

    def append(self, message, queues):
        handle = self._next_handle
        self._next_handle = handle + 1
        self._messages[handle] = [message, set(queues)]
        for queue in queues:
            self._queue_handles.setdefault(queue, {})[handle] = None
        self._bytes += len(message.body)
        self._appends += 1
        return handle

    def ack(self, queue, handle):
        handles = self._queue_handles.get(queue)
        if handles is not None and handle in handles:
            del handles[handle]
            self._acks += 1
            counts = self._delivery_counts.get(queue)
            if counts:
                counts.pop(handle, None)
            self._release(queue, handle)

    def read(self, handle):
        held = self._messages.get(handle)
        if held is None:
            return defer.fail(KeyError(f"memory store holds no message with handle {handle!r}"))
        return defer.succeed(record_of(held[0]))

    def purge(self, queue, handles):
        for handle in handles:
            self.ack(queue, handle)

    def returned(self, queue, handle, count):
        handles = self._queue_handles.get(queue)
        if handles is not None and handle in handles:
            self._delivery_counts.setdefault(queue, {})[handle] = count

    def delivery_counts(self, queue):
        return dict(self._delivery_counts.get(queue, ()))

    # -- delayed messages

    def delay(self, message, exchange, due):
        check_due(due)
        exchange = check_exchange(exchange)
        handle = self._next_delayed
        self._next_delayed = handle + 1
        self._delayed[handle] = (due, exchange, message)
        self._delayed_keys.add((due, handle))
        return handle

    def delayed_after(self, cursor, until, limit):
        try:
            cursor = check_cursor(cursor)
        except ValueError:
            return defer.fail()
        found = []
        if limit > 0:
            for due, handle in islice(self._delayed_keys.after(cursor), limit):
                if due > until:
                    break
                _, exchange, message = self._delayed[handle]
                found.append(DelayedMessage(due, handle, exchange, record_of(message)))
        return defer.succeed(found)

    def release(self, handle):
        held = self._delayed.pop(handle, None)
        if held is not None:
            self._delayed_keys.remove((held[0], handle))

    def sync(self):
        return defer.succeed(None)

    def close(self):
        return defer.succeed(None)

    def stats(self):
        return {
            "messages": len(self._messages),
            "bytes": self._bytes,
            "queues": len(self._queues),
            "exchanges": len(self._exchanges),
            "bindings": len(self._bindings),
            "appends": self._appends,
            "acks": self._acks,
            "delayed": len(self._delayed),
        }

    def _release(self, queue, handle):
        held = self._messages.get(handle)
        if held is None:
            return
        held[1].discard(queue)
        if not held[1]:
            del self._messages[handle]
            self._bytes -= len(held[0].body)
