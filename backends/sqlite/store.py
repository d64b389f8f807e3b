"""L{SqliteStore}: the store contract in one SQLite file (WAL), written in
batches by a L{brokerd.durability.GroupCommit} whose life (open, close, a
failed open) it shares with the file stores (L{WriterThreadStore}).

The reactor thread keeps what the broker needs at once (ids, which queue holds
which message, sizes, topology) and buffers every write in a L{Batch}; the
writer thread applies each batch in one transaction (see L{Database}).

A message is stored as its StoredMessage without the body, the body in a
column of its own (so an append never copies the body into a protobuf) and a
CRC-32 over both, computed at append on the reactor thread (zlib lets go of
the GIL for large buffers, so this runs alongside the writer thread) and
checked whenever the message is read back.

Delayed messages (L{IDelayedMessageStore}) are rows of a table indexed by
C{(due, handle)} (see L{backends.sqlite.delayed}); the reactor thread keeps
only which handles are kept, as a L{HandleMap}, and reads windows on the
writer thread.
"""

from google.protobuf.message import DecodeError
from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from backends.delayedshared.reactorside import check_due, check_exchange, delayed_window, readable_messages
from backends.handlemap import HandleMap
from backends.messagerecord import record_of_stored
from backends.sqlite.delayed import delayed_message
from backends.sqlite.database import Batch, Database, checksum
from backends.sqlite.schema import (
    ADD_QUEUE,
    DELETE_BINDING,
    DELETE_BINDINGS_OF_EXCHANGE,
    DELETE_EXCHANGE,
    DELETE_EXCHANGE_BINDING,
    DELETE_EXCHANGE_BINDINGS,
    DELETE_QUEUE,
    DELETE_QUEUE_BINDINGS,
    UPSERT_BINDING,
    UPSERT_EXCHANGE,
    UPSERT_EXCHANGE_BINDING,
    UPSERT_QUEUE,
    binding_key,
    binding_row,
    binding_statement,
    canonical_arguments,
)
from backends.writerstore import WriterThreadStore
from brokerd.durability import SyncPolicy
from backends.quarantine import unreadable_message
from brokerd.interfaces import IDelayedMessageStore, IMessageStore, StoreCorrupted, UnreadableMessage
from brokerd.proto import messages_pb2

log = Logger()


@implementer(IMessageStore, IDelayedMessageStore)
class SqliteStore(WriterThreadStore):
    """
    Durable topology and persistent messages in one SQLite database.

    A message routed to several queues is one row of C{messages} plus one row
    of C{entries} per queue; its handle is its integer id, given out in append
    order on the reactor thread (so a queue's entries in id order are its
    queue order). The row goes in the commit after its last entry goes.
    Everything C{open} finds comes back from C{recover} marked redelivered.

    @ivar path: the database file.
    """

    name = "sqlite"
    durable = True

    def __init__(self, path, sync_policy=None, *, reactor):
        self.path = path
        self.sync_policy = sync_policy or SyncPolicy()
        self._reactor = reactor
        self._db = Database(path, self.sync_policy.mode)
        self._batch = Batch()
        self._exchanges = {}  # (vhost, name) -> ExchangeRecord
        self._queues = {}  # queue key -> QueueRecord
        self._bindings = {}  # see binding_key -> BindingRecord
        self._queue_ids = {}  # queue key -> queue id, for every queue with a row in the file
        self._queue_handles = {}  # queue id -> {message id: None} held for it, in queue order
        self._held = {}  # message id -> [number of queues holding it, body size]
        self._recovered = {}  # message id -> (crc, record, body) of messages found at open
        self._recovered_counts = {}  # queue id -> {message id: delivery count} found at open
        self._last_recovered = 0  # the highest message id found at open
        self._next_id = self._next_queue_id = 1
        self._bytes = self._appends = self._acks = 0
        self._delayed = HandleMap()  # the kept delayed handles
        self._next_delayed = 1

    @property
    def policy(self):
        """The L{SyncPolicy} (C{sync_policy})."""
        return self.sync_policy

    # -- open, commits, close

    def open(self):
        """Start the writer thread, open (creating if need be) and load the database on it."""
        return self._open(self._db.open, self._db.write, self._loaded)

    def _loaded(self, loaded):
        """Keep what the writer thread's open found (its L{Loaded})."""
        for record in loaded.exchanges:
            self._exchanges[(record.vhost, record.name)] = record
        for queue_id, vhost, name, record in loaded.queues:
            self._queue_ids[(vhost, name)] = queue_id
            self._queue_handles[queue_id] = {}
            if record is not None:
                self._queues[(vhost, name)] = record
        for arguments, record in loaded.bindings:
            self._bindings[binding_key(record, arguments)] = record
        for queue_id, message_id in loaded.entries:
            self._queue_handles[queue_id][message_id] = None
            held = self._held.get(message_id)
            if held is None:
                size = loaded.messages[message_id][0] if message_id in loaded.messages else 0
                self._held[message_id] = [1, size]
                self._bytes += size
            else:
                held[0] += 1
        self._recovered = {message_id: stored[1:] for message_id, stored in loaded.messages.items()}
        self._recovered_counts = loaded.delivery_counts
        self._last_recovered = loaded.next_message_id - 1
        self._next_id = loaded.next_message_id
        self._next_queue_id = loaded.next_queue_id
        self._delayed = loaded.delayed
        self._next_delayed = loaded.next_delayed
        self._quarantined = {(record.kind, record.vhost, record.name): record for record in loaded.quarantined}

    def _take_batch(self):
        """Called by GroupCommit on the reactor thread: hand over what is buffered; the one taken at close is final."""
        batch = self._batch
        final = self._state == "closing"
        if not batch and not final:
            return None
        self._batch = Batch()
        batch.final = final
        return batch

    def _close_files(self):
        """The final batch closed the connection, unless the writer thread died before it; its failure is close's."""
        self._db.close()
        if self._db.final_error is not None:
            raise self._db.final_error

    def pragmas(self):
        """A Deferred firing with the connection's journal mode, synchronous setting and the like."""
        return self._commit.call(self._db.pragmas)

    # -- topology

    def topology(self):
        """The records, with a QuarantinedRecord in place of each row whose record does not parse (kept as it is)."""
        return [*self._exchanges.values(), *self._queues.values(), *self._quarantined.values(),
                *self._bindings.values()]

    def save_exchange(self, record):
        self._writable()
        self._exchanges[(record.vhost, record.name)] = record
        self._quarantined.pop(("exchange", record.vhost, record.name), None)
        self._batch.topology.append((UPSERT_EXCHANGE, (record.vhost, record.name, record.SerializeToString())))

    def delete_exchange(self, vhost, name):
        self._writable()
        self._exchanges.pop((vhost, name), None)
        for key in [key for key in self._bindings if key[0] == vhost and name in (key[1], key[5])]:
            del self._bindings[key]
        self._forget_quarantined(vhost, exchange=name)
        self._batch.topology += [(DELETE_EXCHANGE, (vhost, name)), (DELETE_EXCHANGE_BINDINGS, (vhost, name)),
                                 (DELETE_BINDINGS_OF_EXCHANGE, (vhost, name, name))]

    def save_queue(self, record):
        self._writable()
        key = (record.vhost, record.name)
        queue_id = self._queue_ids.get(key)
        if queue_id is None:
            queue_id = self._new_queue_id(key)
        self._queues[key] = record
        self._quarantined.pop(("queue", *key), None)
        self._batch.topology.append((UPSERT_QUEUE, (queue_id, record.vhost, record.name, record.SerializeToString())))

    def delete_queue(self, queue):
        self._writable()
        vhost, name = queue
        self._queues.pop(queue, None)
        for key in [key for key in self._bindings if key[0] == vhost and key[2] == name]:
            del self._bindings[key]
        self._forget_quarantined(vhost, queue=name)
        batch = self._batch
        batch.topology.append((DELETE_QUEUE_BINDINGS, (vhost, name)))
        queue_id = self._queue_ids.pop(queue, None)
        if queue_id is None:
            return
        batch.topology.append((DELETE_QUEUE, (queue_id,)))
        batch.dropped_queues.append(queue_id)
        for handle in self._queue_handles.pop(queue_id):
            batch.entries.pop((queue_id, handle), None)
            self._release(handle)

    def save_binding(self, record):
        self._writable()
        key = binding_key(record, canonical_arguments(record.arguments))
        self._bindings[key] = record
        self._batch.topology.append((binding_statement(record, UPSERT_BINDING, UPSERT_EXCHANGE_BINDING),
                                     (*binding_row(key), record.SerializeToString())))

    def delete_binding(self, record):
        self._writable()
        key = binding_key(record, canonical_arguments(record.arguments))
        self._bindings.pop(key, None)
        self._batch.topology.append((binding_statement(record, DELETE_BINDING, DELETE_EXCHANGE_BINDING),
                                     binding_row(key)))

    def _forget_quarantined(self, vhost, exchange=None, queue=None):
        """The exchange or queue is deleted: so are its quarantined rows and those of its bindings."""
        if not self._quarantined:
            return
        kind, name = ("exchange", exchange) if exchange is not None else ("queue", queue)
        for key in list(self._quarantined):
            record_kind, record_vhost, record_name = key
            if record_vhost != vhost:
                continue
            if record_kind == "binding":
                # (source, queue, routing key), or (source, "", routing key, destination exchange)
                ends = (record_name[0], *record_name[3:]) if exchange is not None else record_name[1:2]
                if name in ends:
                    del self._quarantined[key]
            elif record_kind == kind and record_name == name:
                del self._quarantined[key]

    # -- messages

    def append(self, message, queues):
        self._writable()
        if not queues:
            raise ValueError("append needs at least one queue")
        handle = self._next_id
        self._next_id = handle + 1
        body = bytes(message.body)
        stored = messages_pb2.StoredMessage(
            valid=True,
            exchange=message.exchange,
            routing_key=message.routing_key,
            properties=message.properties,
        )
        if message.published_at is not None:
            stored.published_at = message.published_at
        record = stored.SerializeToString()
        batch = self._batch
        batch.messages[handle] = (checksum(record, body), record, body)
        count = 0
        for queue in queues:
            queue_id = self._queue_ids.get(queue)
            if queue_id is None:
                queue_id = self._new_queue_id(queue)
                batch.topology.append((ADD_QUEUE, (queue_id, *queue)))
            handles = self._queue_handles[queue_id]
            if handle not in handles:
                handles[handle] = None
                batch.entries[(queue_id, handle)] = None
                count += 1
        self._held[handle] = [count, len(body)]
        self._bytes += len(body)
        self._appends += 1
        return handle

    def ack(self, queue, handle):
        self._writable()
        queue_id = self._queue_ids.get(queue)
        handles = self._queue_handles.get(queue_id)
        if handles is None or handle not in handles:
            return
        del handles[handle]
        self._acks += 1
        entry = (queue_id, handle)
        batch = self._batch
        batch.returns.pop(entry, None)
        if entry in batch.entries:
            del batch.entries[entry]
        else:
            batch.acks.append(entry)
        self._release(handle)

    def purge(self, queue, handles):
        for handle in handles:
            self.ack(queue, handle)

    def returned(self, queue, handle, count):
        """Keep the entry's delivery count: one UPDATE in the next commit, the latest count winning."""
        self._writable()
        queue_id = self._queue_ids.get(queue)
        handles = self._queue_handles.get(queue_id)
        if handles is not None and handle in handles:
            self._batch.returns[(queue_id, handle)] = count

    def delivery_counts(self, queue):
        return dict(self._recovered_counts.get(self._queue_ids.get(queue), ()))

    def read(self, handle):
        pending = self._batch.messages.get(handle)
        if pending is not None:
            return defer.maybeDeferred(self._parse, handle, *pending)
        if self._state != "open" or handle not in self._held:
            return defer.fail(KeyError(f"sqlite store {self.path} holds no message with handle {handle!r}"))
        recovered = self._recovered.get(handle)
        if recovered is not None:
            return defer.maybeDeferred(self._parse, handle, *recovered)
        reading = self._commit.call(self._db.read, handle)
        reading.addCallback(self._read, handle)
        return reading

    def _read(self, row, handle):
        if row is None:
            raise KeyError(f"sqlite store {self.path} holds no message with handle {handle!r}")
        return self._parse(handle, *row)

    def recover(self, queue):
        queue_id = self._queue_ids.get(queue)
        recovered = []
        for handle in self._queue_handles.get(queue_id, ()):
            if handle > self._last_recovered:
                break  # appended since open: not something open found
            stored = self._recovered.get(handle)
            if stored is None:
                raise StoreCorrupted(
                    f"sqlite store {self.path}: message {handle} of queue {queue[1]!r} in vhost {queue[0]!r}"
                    " is missing from the messages table",
                    path=self.path,
                )
            try:
                recovered.append((handle, self._parse(handle, *stored), True))
            except UnreadableMessage as problem:
                log.error("queue {queue!r} in vhost {vhost!r}: quarantined stored message {handle}, not delivered:"
                          " {problem}; its row is kept as it is", queue=queue[1], vhost=queue[0], handle=handle,
                          problem=problem)
        return recovered

    # -- delayed messages

    def delay(self, message, exchange, due):
        self._writable()
        check_due(due)
        vhost, name = check_exchange(exchange)
        handle = self._next_delayed
        self._next_delayed = handle + 1
        body = bytes(message.body)
        record = messages_pb2.StoredMessage(
            exchange=message.exchange, routing_key=message.routing_key, properties=message.properties
        ).SerializeToString()
        batch = self._batch
        batch.delays[handle] = (due, handle, vhost, name, checksum(record, body), record, body)
        batch.next_delayed = self._next_delayed
        self._delayed.add(handle)
        return handle

    def release(self, handle):
        self._writable()
        if type(handle) is not int or handle < 0 or self._delayed.pop(handle) is None:
            return
        batch = self._batch
        if handle in batch.delays:
            del batch.delays[handle]  # never written
        else:
            batch.delay_releases.append(handle)

    def delayed_after(self, cursor, until, limit):
        if self._state != "open":
            return defer.fail(RuntimeError(f"sqlite store {self.path} is not open"))

        def fetch(position, bound, count):
            return self._commit.call(self._db.delayed_after, position, bound, count)

        kept = self._delayed.__contains__
        rows = delayed_window(fetch, list(self._batch.delays.values()), kept, cursor, until, limit)
        return rows.addCallback(self._delayed_messages, cursor, until, limit)

    def _delayed_messages(self, rows, cursor, until, limit):
        """
        The window's DelayedMessages. One whose record does not parse is
        quarantined: logged, no longer counted as kept (so the window asked
        for again leaves it out), and its row kept as it is.
        """
        found, quarantined = readable_messages(
            rows, lambda row: delayed_message(row, self.path, checksum), self._quarantine_delayed)
        if quarantined:
            return self.delayed_after(cursor, until, limit)
        return found

    def _quarantine_delayed(self, row, problem):
        due, handle, vhost, exchange = row[:4]
        log.error("delayed message {handle} for exchange {exchange!r} in vhost {vhost!r} (due {due}) is quarantined,"
                  " not routed, and its row kept as it is: {problem}",
                  handle=handle, exchange=exchange, vhost=vhost, due=due, problem=problem)
        self._delayed.pop(handle)

    def stats(self):
        return {
            "messages": len(self._held),
            "bytes": self._bytes,
            "queues": len(self._queues),
            "exchanges": len(self._exchanges),
            "bindings": len(self._bindings),
            "appends": self._appends,
            "acks": self._acks,
            **self._commit_stats(),
            "delayed": len(self._delayed),
        }

    # -- inside

    def _writable(self):
        if self._state != "open":
            raise RuntimeError(f"sqlite store {self.path} is not open")

    def _new_queue_id(self, key):
        queue_id = self._next_queue_id
        self._next_queue_id = queue_id + 1
        self._queue_ids[key] = queue_id
        self._queue_handles[queue_id] = {}
        return queue_id

    def _release(self, handle):
        """One queue fewer holds C{handle}; the last one out drops the message."""
        held = self._held[handle]
        held[0] -= 1
        if held[0] > 0:
            return
        del self._held[handle]
        self._bytes -= held[1]
        self._recovered.pop(handle, None)
        batch = self._batch
        if handle in batch.messages:
            del batch.messages[handle]
        else:
            batch.released.append(handle)

    def _parse(self, handle, crc, record, body):
        """The MessageRecord of a row, its body put back; L{StoreCorrupted} if its checksum or record is bad."""
        if checksum(record, body) != crc:
            raise StoreCorrupted(
                f"sqlite store {self.path}: message {handle} is damaged (its checksum does not match)", path=self.path
            )
        try:
            stored = messages_pb2.StoredMessage.FromString(record)
        except DecodeError as error:
            raise unreadable_message(f"sqlite store {self.path}, messages row {handle}", error) from None
        except Exception as error:
            raise StoreCorrupted(
                f"sqlite store {self.path}: message {handle} cannot be read as a StoredMessage ({error})",
                path=self.path,
            ) from None
        return record_of_stored(stored, body)
