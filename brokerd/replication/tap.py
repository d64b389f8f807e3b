"""The leader's side of replication: a store that records what it is asked to change."""

from typing import NamedTuple

from zope.interface import alsoProvides, implementer, providedBy

from brokerd.interfaces import IDelayedMessageStore, IMessageStore, ITimedCommits
from brokerd.proto import messages_pb2
from brokerd.replication import codec
from brokerd.replication.operations import OperationEncoder, queue_key


class SnapshotView(NamedTuple):
    """A tap's state at one stream position (L{StoreTap.snapshot_view})."""

    exchanges: list
    queues: list
    bindings: list
    messages: list  # (queue, live {handle: id}, copy of it, {handle: delivery count})
    delayed: dict  # {handle: id}


@implementer(IMessageStore, IDelayedMessageStore)
class StoreTap:
    """
    Wraps one of the leader's stores (any backend) and records each mutating
    call into an L{OutboundStream} after making it, so that followers can make
    the same calls on stores of their own. It provides every interface the
    wrapped store provides (paging, timed commits), passing reads through.

    A message stored through the tap gets a I{replication id}: the sequence
    number of the append (or delay) that stored it. Handles are the backend's
    own and mean nothing to a follower, so acks, returns, purges and releases
    travel by replication id; the tap keeps a handle-to-id map per queue (and
    one for delayed messages) for the messages stored through it. A call on a
    handle the tap never stored nor was given by L{seed} is made but not
    streamed, and counted in C{unreplicated}.

    It also keeps what a snapshot needs (L{snapshot_view}): the current
    topology and the delivery counts of messages returned at least once.
    """

    def __init__(self, store, stream, store_name="", reactor=None):
        """
        @param store: the wrapped L{IMessageStore} (opened or not).
        @param stream: the leader's L{OutboundStream}.
        @param store_name: the vhost whose own store this is, or C{""} for the shared store.
        @param reactor: with one, acks of one queue made in a row travel as one
            operation, recorded before the tap's next other operation, its next
            C{sync()}, or the end of the reactor's turn, whichever comes first
            (a consumer's C{multiple} ack of a hundred messages is one operation,
            not a hundred); without, each ack is recorded at once.
        """
        self._store = store
        self._stream = stream
        self._name = store_name
        self._ids = {}  # queue -> {handle: replication id}
        self._delayed = {}  # delay handle -> replication id
        self.operations = OperationEncoder(store_name)
        self._exchanges = {}  # (vhost, name) -> ExchangeRecord
        self._queues = {}  # queue -> QueueRecord
        self._bindings = {}  # binding key -> BindingRecord
        self._counts = {}  # queue -> {handle: delivery count}, of messages returned at least once
        self.unreplicated = 0
        self._reactor = reactor
        self._acks = None  # (queue, [replication ids]) acked and not yet recorded
        self._acks_call = None
        alsoProvides(self, *providedBy(store))
        if getattr(store, "load", None) is not None:
            self.load = store.load  # read once per message paged in: no frame of the tap's
        commit_starts = ITimedCommits.providedBy(store) and reactor is not None
        if commit_starts:
            # The acks held for the turn's end are recorded first, so that they go too.
            store.watch_commit_starts(self._commit_starting)
        stream.add_tap(store_name, self, commit_starts)

    @property
    def store(self):
        """The wrapped store."""
        return self._store

    @property
    def store_name(self):
        return self._name

    def seed(self, topology=(), ids=None, delayed=None, counts=None):
        """
        What the store held before the tap recorded anything, so that acks of
        those messages stream and a snapshot holds them: C{topology} records,
        C{ids} C{{queue: {handle: replication id}}} in queue order, C{delayed}
        C{{handle: replication id}}, C{counts} C{{queue: {handle: count}}}.
        """
        for item in topology:
            self._remember(item)
        for queue, found in (ids or {}).items():
            self._ids.setdefault(queue, {}).update(found)
        self._delayed.update(delayed or {})
        for queue, found in (counts or {}).items():
            if found:
                self._counts.setdefault(queue, {}).update(found)

    def _remember(self, item):
        if isinstance(item, messages_pb2.ExchangeRecord):
            self._exchanges[(item.vhost, item.name)] = item
        elif isinstance(item, messages_pb2.QueueRecord):
            self._queues[(item.vhost, item.name)] = item
            self._ids.setdefault((item.vhost, item.name), {})
        elif isinstance(item, messages_pb2.BindingRecord):
            self._bindings[item.SerializeToString(deterministic=True)] = item

    def snapshot_view(self):
        """
        The tap's state now, for a snapshot, in one call (no reactor turn
        between): topology records, per queue C{(queue, live map, copy of
        {handle: id}, copy of counts)}, and a copy of the delayed map.
        """
        self.record_acks()
        return SnapshotView(
            list(self._exchanges.values()), list(self._queues.values()),
            list(self._bindings.values()),
            [(queue, ids, ids.copy(), dict(self._counts.get(queue, ())))
             for queue, ids in self._ids.items() if queue in self._queues],
            self._delayed.copy())

    def holds(self, queue, live, handle, replication_id):
        """Whether message C{replication_id} is still in C{queue} as it was in a view."""
        return self._ids.get(queue) is live and live.get(handle) == replication_id

    def holds_delayed(self, handle, replication_id):
        return self._delayed.get(handle) == replication_id

    @property
    def name(self):
        return self._store.name

    @property
    def durable(self):
        return self._store.durable

    def _record(self, operation, record, body=b""):
        if self._acks is not None:
            self.record_acks()
        return self._stream.record(operation, record.SerializeToString(), body)

    def record_acks(self):
        """Record the acks not yet recorded, as one operation (see C{reactor} above)."""
        if self._acks_call is not None and self._acks_call.active():
            self._acks_call.cancel()
        self._acks_call = None
        if self._acks is None:
            return
        queue, ids = self._acks
        self._acks = None
        self._stream.record(codec.ACK_MESSAGE, self.operations.operation(
            queues=[queue_key(queue)], messages=ids).SerializeToString())

    # Reads and lifecycle pass through.

    def open(self):
        """Open the store, and take its topology and delivery counts as the tap's."""
        def opened(result):
            items = self._store.topology()
            self.seed(items, counts={
                (item.vhost, item.name): self._store.delivery_counts((item.vhost, item.name))
                for item in items if isinstance(item, messages_pb2.QueueRecord)})
            return result
        return self._store.open().addCallback(opened)

    def topology(self):
        return self._store.topology()

    def recover(self, queue):
        return self._store.recover(queue)

    def delivery_counts(self, queue):
        return self._store.delivery_counts(queue)

    def read(self, handle):
        return self._store.read(handle)

    def sync(self):
        self.record_acks()
        return self._store.sync()

    def close(self):
        self.record_acks()
        return self._store.close()

    def watch_commit_failures(self, listener):
        self._store.watch_commit_failures(listener)

    def commit_ledger(self):
        return self._store.commit_ledger()

    def stats(self):
        return self._store.stats()

    def recovered_handles(self, queue):
        return self._store.recovered_handles(queue)

    def load(self, handle):
        return self._store.load(handle)  # once per message paged in: see __init__

    def commit_times(self):
        return self._store.commit_times()

    def watch_commit_starts(self, listener):
        self._store.watch_commit_starts(listener)

    def _commit_starting(self):
        self.record_acks()
        self._stream.commit_starting()

    def delayed_after(self, cursor, until, limit):
        return self._store.delayed_after(cursor, until, limit)

    # Topology.

    def save_exchange(self, record):
        self._store.save_exchange(record)
        self._exchanges[(record.vhost, record.name)] = record
        self._record(codec.SAVE_EXCHANGE, self.operations.operation(exchange=record))

    def delete_exchange(self, vhost, name):
        self._store.delete_exchange(vhost, name)
        self._exchanges.pop((vhost, name), None)
        self._record(codec.DELETE_EXCHANGE,
                     self.operations.operation(target=queue_key((vhost, name))))

    def save_queue(self, record):
        self._store.save_queue(record)
        self._queues[(record.vhost, record.name)] = record
        self._ids.setdefault((record.vhost, record.name), {})
        self._record(codec.SAVE_QUEUE, self.operations.operation(queue_record=record))

    def delete_queue(self, queue):
        self._store.delete_queue(queue)
        self._queues.pop(queue, None)
        self._ids.pop(queue, None)
        self._counts.pop(queue, None)
        self._record(codec.DELETE_QUEUE, self.operations.operation(queues=[queue_key(queue)]))

    def save_binding(self, record):
        self._store.save_binding(record)
        self._bindings[record.SerializeToString(deterministic=True)] = record
        self._record(codec.SAVE_BINDING, self.operations.operation(binding=record))

    def delete_binding(self, record):
        self._store.delete_binding(record)
        self._bindings.pop(record.SerializeToString(deterministic=True), None)
        self._record(codec.DELETE_BINDING, self.operations.operation(binding=record))

    # Messages.

    def append(self, message, queues):
        handle = self._store.append(message, queues)
        if self._acks is not None:
            self.record_acks()
        replication_id = self._stream.record_append(self.operations.append(message, queues),
                                                    message.body)
        ids = self._ids
        for queue in queues:
            held = ids.get(queue)
            if held is None:
                held = ids[queue] = {}
            held[handle] = replication_id
        return handle

    def ack(self, queue, handle):
        self._store.ack(queue, handle)
        held = self._ids.get(queue)
        replication_id = None if held is None else held.pop(handle, None)
        counts = self._counts.get(queue)
        if counts:
            counts.pop(handle, None)
        if replication_id is None:
            self.unreplicated += 1
            return
        acks = self._acks
        if acks is None or acks[0] != queue:
            if acks is not None:
                self.record_acks()
            acks = self._acks = (queue, [])
            if self._reactor is not None:
                self._acks_call = self._reactor.callLater(0, self.record_acks)
        acks[1].append(replication_id)
        if self._reactor is None:
            self.record_acks()

    def returned(self, queue, handle, count):
        self._store.returned(queue, handle, count)
        self._counts.setdefault(queue, {})[handle] = count
        replication_id = self._ids.get(queue, {}).get(handle)
        if replication_id is None:
            self.unreplicated += 1
            return
        self._record(codec.RETURNED, self.operations.operation(
            queues=[queue_key(queue)], messages=[replication_id], count=count))

    def purge(self, queue, handles):
        handles = list(handles)
        self._store.purge(queue, handles)
        known = self._ids.get(queue, {})
        found = [known.pop(handle, None) for handle in handles]
        counts = self._counts.get(queue)
        if counts:
            for handle in handles:
                counts.pop(handle, None)
        ids = [replication_id for replication_id in found if replication_id is not None]
        self.unreplicated += len(found) - len(ids)
        if ids:
            self._record(codec.PURGE,
                         self.operations.operation(queues=[queue_key(queue)], messages=ids))

    def delay(self, message, exchange, due):
        handle = self._store.delay(message, exchange, due)
        operation = self.operations.message(message, target=queue_key(exchange), due=due)
        self._delayed[handle] = self._record(codec.DELAY, operation, message.body)
        return handle

    def release(self, handle):
        self._store.release(handle)
        replication_id = self._delayed.pop(handle, None)
        if replication_id is None:
            self.unreplicated += 1
            return
        self._record(codec.RELEASE, self.operations.operation(messages=[replication_id]))
