"""L{MemoryStore}: the store contract kept in dicts, for one process lifetime."""

from twisted.internet import defer
from zope.interface import implementer

from brokerd.interfaces import IMessageStore
from brokerd.proto import messages_pb2
from brokerd.proto.tables import freeze, table_to_dict


def _binding_key(record):
    return (record.vhost, record.exchange, record.queue, record.routing_key, freeze(table_to_dict(record.arguments)))


@implementer(IMessageStore)
class MemoryStore:
    """
    Holds topology records and persistent messages in memory.

    Handles are integers in append order. A message stays until every queue it
    was appended for has acked it, purged it or been deleted.
    """

    name = "memory"
    durable = False

    def __init__(self):
        self._exchanges = {}  # (vhost, name) -> ExchangeRecord
        self._queues = {}  # queue key -> QueueRecord
        self._bindings = {}  # binding key -> BindingRecord
        self._messages = {}  # handle -> [message, set of queue keys still holding it]
        self._queue_handles = {}  # queue key -> {handle: None}, in append order
        self._next_handle = 1
        self._bytes = 0
        self._appends = 0
        self._acks = 0

    def open(self):
        return defer.succeed(None)

    def topology(self):
        return [*self._exchanges.values(), *self._queues.values(), *self._bindings.values()]

    def recover(self, queue):
        return [
            (handle, self._record(self._messages[handle][0]), False)
            for handle in self._queue_handles.get(queue, ())
        ]

    def save_exchange(self, record):
        self._exchanges[(record.vhost, record.name)] = record

    def delete_exchange(self, vhost, name):
        self._exchanges.pop((vhost, name), None)
        for key in [key for key in self._bindings if key[0] == vhost and key[1] == name]:
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
            self._release(queue, handle)

    def read(self, handle):
        held = self._messages.get(handle)
        if held is None:
            return defer.fail(KeyError(f"memory store holds no message with handle {handle!r}"))
        return defer.succeed(self._record(held[0]))

    def purge(self, queue, handles):
        for handle in handles:
            self.ack(queue, handle)

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
        }

    def _release(self, queue, handle):
        held = self._messages.get(handle)
        if held is None:
            return
        held[1].discard(queue)
        if not held[1]:
            del self._messages[handle]
            self._bytes -= len(held[0].body)

    @staticmethod
    def _record(message):
        return messages_pb2.StoredMessage(
            valid=True,
            exchange=message.exchange,
            routing_key=message.routing_key,
            properties=message.properties,
            body=bytes(message.body),
        )
