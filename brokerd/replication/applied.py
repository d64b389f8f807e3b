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
    order), the delayed messages' map, and the exchanges and bindings held,
    so that acks by id find their handle and a wipe knows what to delete.
    """

    def __init__(self):
        self._ids = {}  # (store name, queue) -> {replication id: handle}
        self._delayed = {}  # store name -> {replication id: handle}
        self._exchanges = {}  # store name -> {(vhost, name): True}
        self._bindings = {}  # store name -> {binding key: BindingRecord}
        self._next_synthetic = SYNTHETIC_IDS

    def ids(self, name, queue):
        found = self._ids.get((name, queue))
        if found is None:
            found = self._ids[(name, queue)] = {}
        return found

    def queues(self, name):
        """C{{queue: {replication id: handle}}} of store C{name}."""
        return {queue: ids for (store, queue), ids in self._ids.items() if store == name}

    def delayed(self, name):
        return self._delayed.setdefault(name, {})

    def exchanges(self, name):
        return self._exchanges.setdefault(name, {})

    def bindings(self, name):
        return self._bindings.setdefault(name, {})

    def forget_queue(self, name, queue):
        self._ids.pop((name, queue), None)

    def clear(self):
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
                self.exchanges(name)[(item.vhost, item.name)] = True
            elif isinstance(item, messages_pb2.BindingRecord):
                self.bindings(name)[replica.binding_key(item)] = item
            elif isinstance(item, messages_pb2.QueueRecord):
                ids = self.ids(name, (item.vhost, item.name))
                for handle, _, _, replication_id in reader.recover((item.vhost, item.name)):
                    ids[self._synthetic() if replication_id is None else replication_id] = handle
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
