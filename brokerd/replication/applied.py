"""What a follower's stores hold of the leader's, by replication id: rebuilt at open, kept
as operations are applied, and emptied through the store contract for a snapshot."""

from twisted.internet import defer

from brokerd.proto import messages_pb2
from brokerd.replication import replica

# Ids given to messages found without one (a store last written as a leader's): far
# above any stream sequence, and unique within one opening of the stores.
SYNTHETIC_IDS = 2 ** 61


class AppliedState:
    """
    Per store name: each queue's map of replication id to handle (in queue
    order), the delayed messages' map, the topology records held and the
    delivery counts of messages returned at least once, so that acks by id
    find their handle, a wipe knows what to delete, and a promotion knows
    what the stores hold now (C{topology()} and C{recover} tell what they held
    when opened).

    @ivar generation: counts the times a queue's map was dropped (a queue forgotten, all
        cleared), so that a caller holding maps knows when to look them up again.
    """

    def __init__(self):
        self.generation = 0
        self._ids = {}  # (store name, queue) -> {replication id: handle}
        self._delayed = {}  # store name -> {replication id: handle}
        self._exchanges = {}  # store name -> {(vhost, name): ExchangeRecord}
        self._queues = {}  # store name -> {queue: QueueRecord}
        self._bindings = {}  # store name -> {binding key: BindingRecord}
        self._counts = {}  # (store name, queue) -> {replication id: delivery count}
        self._next_synthetic = SYNTHETIC_IDS

    def ids(self, name, queue):
        found = self._ids.get((name, queue))
        if found is None:
            found = self._ids[(name, queue)] = {}
        return found

    def queues(self, name):
        """C{{queue: {replication id: handle}}} of store C{name}."""
        return {queue: ids for (store, queue), ids in self._ids.items() if store == name}

    def queue_records(self, name):
        return self._queues.setdefault(name, {})

    def counts(self, name, queue):
        """C{{replication id: delivery count}} of the messages of C{queue} returned before."""
        return self._counts.setdefault((name, queue), {})

    def topology(self, name):
        """The topology records store C{name} holds now: exchanges, queues, then bindings."""
        return [*self.exchanges(name).values(), *self.queue_records(name).values(),
                *self.bindings(name).values()]

    def delayed(self, name):
        return self._delayed.setdefault(name, {})

    def exchanges(self, name):
        return self._exchanges.setdefault(name, {})

    def bindings(self, name):
        return self._bindings.setdefault(name, {})

    def forget_queue(self, name, queue):
        self.generation += 1
        self._ids.pop((name, queue), None)
        self._counts.pop((name, queue), None)
        self.queue_records(name).pop(queue, None)

    def clear(self):
        self.generation += 1
        self._counts.clear()
        self._queues.clear()
        self._ids.clear()
        self._delayed.clear()
        self._exchanges.clear()
        self._bindings.clear()

    def _synthetic(self):
        self._next_synthetic += 1
        return self._next_synthetic

    @defer.inlineCallbacks
    def load(self, name, store):
        """
        Read an opened store: fires with C{(StoreState or None, whether it
        holds any data besides the state record)}. Messages without an id get
        one of L{SYNTHETIC_IDS}.
        """
        reader = replica.ReplicaReader(store)
        state, had_data = None, False
        for item in store.topology():
            if replica.is_state(item):
                state = replica.read_state(item)
                continue
            had_data = True
            if isinstance(item, messages_pb2.ExchangeRecord):
                self.exchanges(name)[(item.vhost, item.name)] = item
            elif isinstance(item, messages_pb2.BindingRecord):
                self.bindings(name)[replica.binding_key(item)] = item
            elif isinstance(item, messages_pb2.QueueRecord):
                queue = (item.vhost, item.name)
                self.queue_records(name)[queue] = item
                ids, returned = self.ids(name, queue), store.delivery_counts(queue)
                counts = self.counts(name, queue)
                for handle, _, _, replication_id in reader.recover(queue):
                    if replication_id is None:
                        replication_id = self._synthetic()
                    ids[replication_id] = handle
                    if returned.get(handle):
                        counts[replication_id] = returned[handle]
        delayed = self.delayed(name)
        for item, replication_id in (yield reader.delayed()):
            had_data = True
            delayed[self._synthetic() if replication_id is None else replication_id] = item.handle
        return state, had_data

    def wipe(self, name, store):
        """Delete everything store C{name} holds through the store contract."""
        for binding in self.bindings(name).values():
            store.delete_binding(binding)
        for queue in self.queues(name):
            store.delete_queue(queue)
        for vhost, exchange in self.exchanges(name):
            store.delete_exchange(vhost, exchange)
        for handle in self.delayed(name).values():
            store.release(handle)
