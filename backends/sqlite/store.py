"""L{SqliteStore}: the store contract in one SQLite file (WAL), written in
batches by a L{brokerd.storage.durability.GroupCommit} whose life (open, close, a
failed open) is a L{WriterThread} it owns, as the file stores do.

The reactor thread keeps what the broker needs at once (topology, queue ids,
the message ids of each queue that open found) and buffers every write in a
L{Batch}; the writer thread applies each batch in one transaction (see
L{Database}). Nothing is kept per message on the reactor side beyond the
arrays of recovered ids: an ack is buffered, and the file's own books (see
L{backends.sqlite.schema}) drop a message with its last entry and count what
is held.

The store pages (L{IPagingStore}): the broker keeps handles (message ids) of a
queue's backlog and loads each message when it is delivered, from the batches
not yet committed or through the L{MessageReader}'s read-only connection and
its cache of rows read ahead, within C{cache_size} bytes.

A message is stored as its StoredMessage without the body, the body in a
column of its own (so an append never copies the body into a protobuf) and a
CRC-32 over both, computed on the writer thread and checked whenever the
message is read back. A row whose record does not parse is quarantined where
it is: loads raise L{UnreadableMessage}, the acks the broker then makes are
not written, and the next open finds it again.

Delayed messages (L{IDelayedMessageStore}) are rows of a table indexed by
C{(due, handle)} (see L{backends.sqlite.delayed}); the reactor thread keeps
only which handles are kept, as a L{HandleMap<backends.common.handle_map.HandleMap>}
(L{backends.sqlite.delayedrows.DelayedRows}), and reads windows on the writer
thread.
"""

from twisted.internet import defer
from zope.interface import implementer

from backends.common.message_heads import MessageHeads
from backends.common.message_record import loaded_records, record_of
from backends.common.writer_thread import WriterThread
from backends.sqlite.database import Batch, Database
from backends.sqlite.delayedrows import DelayedRows
from backends.sqlite.reads import MessageReader
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
from brokerd.interfaces import (
    ICommitFailures,
    IDelayedMessageStore,
    IPagingStore,
    ITimedCommits,
    StoreCorrupted,
    UnreadableMessage,
)
from brokerd.storage.durability import SyncPolicy

DEFAULT_CACHE_SIZE = 16 << 20


@implementer(IPagingStore, IDelayedMessageStore, ITimedCommits, ICommitFailures)
class SqliteStore:
    """
    Durable topology and persistent messages in one SQLite database.

    A message routed to several queues is one row of C{messages} plus one row
    of C{entries} per queue; its handle is its integer id, given out in append
    order on the reactor thread (so a queue's entries in id order are its
    queue order). The row goes in the commit that deletes its last entry.
    Everything C{open} finds comes back from C{recover} marked redelivered.

    @ivar path: the database file.
    """

    name = "sqlite"
    durable = True

    def __init__(self, path, sync_policy=None, *, reactor, cache_size=DEFAULT_CACHE_SIZE):
        self.path = path
        self.sync_policy = sync_policy or SyncPolicy()
        self._writer_thread = WriterThread(self.name, self.sync_policy, reactor, self._take_batch,
                                           self._close_files, self._batch_written,
                                           self._lost_appends)
        self._db = Database(path, self.sync_policy.mode)
        self._reader = MessageReader(path, cache_size)
        self._batch = Batch()
        self._in_flight = []  # batches handed to the writer thread and not committed yet
        self._heads = MessageHeads(valid=True)
        self._exchanges = {}  # (vhost, name) -> ExchangeRecord
        self._queues = {}  # queue key -> QueueRecord
        self._bindings = {}  # see binding_key -> BindingRecord
        self._queue_ids = {}  # queue key -> queue id, for every queue with a row in the file
        self._recovered = {}  # queue id -> its message ids open found (an array), in queue order
        self._recovered_counts = {}  # queue id -> {message id: delivery count} found at open
        # Messages whose records do not parse: kept in place, acks not written.
        self._quarantined_handles = set()
        self._held = (0, 0)  # messages held and their bytes, as the last commit counted them
        self._next_id = self._next_queue_id = 1
        self._appends = self._acks = 0
        self._delays = DelayedRows(path, self._writer_thread, self._db)

    @property
    def policy(self):
        """The L{SyncPolicy} (C{sync_policy})."""
        return self.sync_policy

    # -- open, commits, close

    def open(self):
        """Start the writer thread, open (creating if need be) and load the database on it."""
        return self._writer_thread.open(self._db.open, self._db.write, self._loaded)

    def watch_commit_failures(self, listener):
        self._writer_thread.failures.watch(listener)

    def commit_ledger(self):
        return self._writer_thread.ledger

    def _lost_appends(self, batch):
        """The C{(queue, handle)} of the entries a failed commit's batch adds."""
        keys = {queue_id: key for key, queue_id in self._queue_ids.items()}
        return [(keys[queue_id], handle) for queue_id, handle in batch.entries
                if queue_id in keys]

    def sync(self):
        return self._writer_thread.sync()

    def close(self):
        """Commit what is buffered (the final batch closes the database) and stop the writer
        thread."""
        return self._writer_thread.close()

    def commit_times(self):
        return self._writer_thread.commit_times()

    def watch_commit_starts(self, listener):
        self._writer_thread.start_listeners.append(listener)

    def _loaded(self, loaded):
        """Keep what the writer thread's open found (its L{backends.sqlite.loading.Loaded}), and
        open the reader's connection."""
        self._reader.open(*loaded.held)
        for record in loaded.exchanges:
            self._exchanges[(record.vhost, record.name)] = record
        for queue_id, vhost, name, record in loaded.queues:
            self._queue_ids[(vhost, name)] = queue_id
            if record is not None:
                self._queues[(vhost, name)] = record
        for arguments, record in loaded.bindings:
            self._bindings[binding_key(record, arguments)] = record
        self._recovered = loaded.handles
        self._recovered_counts = loaded.delivery_counts
        self._held = loaded.held
        self._next_id = loaded.next_message_id
        self._next_queue_id = loaded.next_queue_id
        self._delays.loaded(loaded.delayed, loaded.next_delayed)
        self._quarantined = {(record.kind, record.vhost, record.name): record
                             for record in loaded.quarantined}

    def _take_batch(self):
        """Called by GroupCommit on the reactor thread: hand over what is buffered;
        the one taken at close is final."""
        batch = self._batch
        final = self._writer_thread.state == "closing"
        if not batch and not final:
            return None
        if self._quarantined_handles and batch.acks:
            kept = self._quarantined_handles
            batch.acks = [entry for entry in batch.acks if entry[1] not in kept]
        self._batch = Batch()
        batch.final = final
        if final:
            # The writer's connection closes last, so that it can fold the log into the file and
            # remove it.
            self._reader.close()
        if batch.messages:
            self._in_flight.append(batch)
        return batch

    def _batch_written(self, held):
        """A commit succeeded: what the batches taken so far hold, the reader's connection now
        sees."""
        self._held = held
        self._in_flight = []

    def _close_files(self):
        """The final batch closed the connection, unless the writer thread died before it;
        its failure is close's."""
        self._reader.close()
        self._in_flight = []
        self._db.close()
        if self._db.final_error is not None:
            raise self._db.final_error

    def pragmas(self):
        """A Deferred firing with the connection's journal mode, synchronous setting and the
        like."""
        return self._writer_thread.call(self._db.pragmas)

    # -- topology

    def topology(self):
        """The records, with a QuarantinedRecord in place of each row whose record does not
        parse (kept as it is)."""
        return [*self._exchanges.values(), *self._queues.values(), *self._quarantined.values(),
                *self._bindings.values()]

    def save_exchange(self, record):
        self._writable()
        self._exchanges[(record.vhost, record.name)] = record
        self._quarantined.pop(("exchange", record.vhost, record.name), None)
        self._batch.topology.append(
            (UPSERT_EXCHANGE, (record.vhost, record.name, record.SerializeToString())))

    def delete_exchange(self, vhost, name):
        self._writable()
        self._exchanges.pop((vhost, name), None)
        for key in [key for key in self._bindings if key[0] == vhost and name in (key[1], key[5])]:
            del self._bindings[key]
        self._forget_quarantined(vhost, exchange=name)
        self._batch.topology += [(DELETE_EXCHANGE, (vhost, name)),
                                 (DELETE_EXCHANGE_BINDINGS, (vhost, name)),
                                 (DELETE_BINDINGS_OF_EXCHANGE, (vhost, name, name))]

    def save_queue(self, record):
        self._writable()
        key = (record.vhost, record.name)
        queue_id = self._queue_ids.get(key)
        if queue_id is None:
            queue_id = self._new_queue_id(key)
        self._queues[key] = record
        self._quarantined.pop(("queue", *key), None)
        self._batch.topology.append(
            (UPSERT_QUEUE, (queue_id, record.vhost, record.name, record.SerializeToString())))

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
        self._recovered.pop(queue_id, None)
        self._recovered_counts.pop(queue_id, None)
        for entry in [entry for entry in batch.entries if entry[0] == queue_id]:
            self._cancel_entry(batch, entry)

    def save_binding(self, record):
        self._writable()
        key = binding_key(record, canonical_arguments(record.arguments))
        self._bindings[key] = record
        statement = binding_statement(record, UPSERT_BINDING, UPSERT_EXCHANGE_BINDING)
        self._batch.topology.append((statement, (*binding_row(key), record.SerializeToString())))

    def delete_binding(self, record):
        self._writable()
        key = binding_key(record, canonical_arguments(record.arguments))
        self._bindings.pop(key, None)
        statement = binding_statement(record, DELETE_BINDING, DELETE_EXCHANGE_BINDING)
        self._batch.topology.append((statement, binding_row(key)))

    def _forget_quarantined(self, vhost, exchange=None, queue=None):
        """The exchange or queue is deleted: so are its quarantined rows and those of its
        bindings."""
        if not self._quarantined:
            return
        kind, name = ("exchange", exchange) if exchange is not None else ("queue", queue)
        for key in list(self._quarantined):
            record_kind, record_vhost, record_name = key
            if record_vhost != vhost:
                continue
            if record_kind == "binding":
                # (source, queue, routing key), or (source, "", routing key, destination exchange)
                if exchange is not None:
                    ends = (record_name[0], *record_name[3:])
                else:
                    ends = record_name[1:2]
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
        body = message.body
        if type(body) is not bytes:
            body = bytes(body)
        batch = self._batch
        entries = batch.entries
        holders = 0
        for queue in queues:
            queue_id = self._queue_ids.get(queue)
            if queue_id is None:
                queue_id = self._new_queue_id(queue)
                batch.topology.append((ADD_QUEUE, (queue_id, *queue)))
            entry = (queue_id, handle)
            if entry not in entries:
                entries[entry] = None
                holders += 1
        batch.messages[handle] = (message, self._heads.encode(message), body, holders)
        self._appends += 1
        return handle

    def ack(self, queue, handle):
        self._writable()
        queue_id = self._queue_ids.get(queue)
        if queue_id is None:
            return
        self._acks += 1
        entry = (queue_id, handle)
        batch = self._batch
        if batch.returns:
            batch.returns.pop(entry, None)
        if entry in batch.entries:
            self._cancel_entry(batch, entry)
        else:
            batch.acks.append(entry)

    def purge(self, queue, handles):
        for handle in handles:
            self.ack(queue, handle)

    def returned(self, queue, handle, count):
        """Keep the entry's delivery count: one UPDATE in the next commit, the latest count
        winning."""
        self._writable()
        queue_id = self._queue_ids.get(queue)
        if queue_id is not None:
            self._batch.returns[(queue_id, handle)] = count

    def delivery_counts(self, queue):
        return dict(self._recovered_counts.get(self._queue_ids.get(queue), ()))

    def recovered_handles(self, queue):
        """The message ids open found for C{queue}, in queue order (an array), all possibly
        delivered before."""
        return self._recovered.get(self._queue_ids.get(queue), ())

    def load(self, handle):
        """
        The message of C{handle}, at once: the message appended while its
        batch is not committed, else a MessageRecord read back (see
        L{MessageReader.load} for what it raises).
        """
        pending = self._batch.messages.get(handle)
        if pending is None:
            for batch in self._in_flight:
                pending = batch.messages.get(handle)
                if pending is not None:
                    return pending[0]
            try:
                return self._reader.load(handle)
            except UnreadableMessage:
                self._quarantined_handles.add(handle)
                raise
        return pending[0]

    def read(self, handle):
        try:
            return defer.succeed(record_of(self.load(handle)))
        except (KeyError, StoreCorrupted):
            return defer.fail()

    def recover(self, queue):
        """
        The messages open found for C{queue} that it still holds, read now;
        one whose record does not parse is quarantined: logged, left out, and
        its row kept as it is.

        @raise StoreCorrupted: if one is damaged or missing.
        """
        return list(loaded_records(self.load, queue, self.recovered_handles(queue),
                                   "its row is kept as it is", skip_missing=True))

    # -- delayed messages

    def delay(self, message, exchange, due):
        self._writable()
        return self._delays.delay(self._batch, message, exchange, due)

    def release(self, handle):
        self._writable()
        self._delays.release(self._batch, handle)

    def delayed_after(self, cursor, until, limit):
        window = self._delays.window(list(self._batch.delays.values()), cursor, until, limit)
        return window.addCallback(self._delayed_window_read, cursor, until, limit)

    def _delayed_window_read(self, found, cursor, until, limit):
        """A window's DelayedMessages; the window again if a row of it was quarantined."""
        if found is None:
            return self.delayed_after(cursor, until, limit)
        return found

    def stats(self):
        messages, held_bytes = self._held
        reader = self._reader
        return {
            "messages": messages,
            "bytes": held_bytes,
            "queues": len(self._queues),
            "exchanges": len(self._exchanges),
            "bindings": len(self._bindings),
            "appends": self._appends,
            "acks": self._acks,
            **self._writer_thread.figures(),
            "delayed": len(self._delays),
            "message_reads": reader.rows_read,
            "read_queries": reader.queries,
            "cache_hits": reader.hits,
            "cache_misses": reader.misses,
            "cache_bytes": reader.size,
        }

    # -- inside

    def _writable(self):
        if self._writer_thread.state != "open":
            raise RuntimeError(f"sqlite store {self.path} is not open")

    def _new_queue_id(self, key):
        queue_id = self._next_queue_id
        self._next_queue_id = queue_id + 1
        self._queue_ids[key] = queue_id
        return queue_id

    @staticmethod
    def _cancel_entry(batch, entry):
        """Take an entry out of the batch that would write it; its message too, if no other entry
        holds it."""
        del batch.entries[entry]
        handle = entry[1]
        message, record, body, holders = batch.messages[handle]
        if holders > 1:
            batch.messages[handle] = (message, record, body, holders - 1)
        else:
            del batch.messages[handle]
