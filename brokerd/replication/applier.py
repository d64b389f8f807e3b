"""The follower's side of replication: the leader's store operations made on its own stores."""

from twisted.internet import defer
from twisted.logger import Logger

from brokerd.interfaces import MessageRecord
from brokerd.proto import messages_pb2
from brokerd.replication import codec, replica
from brokerd.replication.codec import StreamError


class StoreApplier:
    """
    Makes the leader's operations, in sequence order, on a follower's opened
    stores (any backend: one per store name the leader streams, C{""} the
    shared store), and commits them in groups: after a batch of operations
    L{commit} writes each store's state record and calls every store's
    C{sync()}; while one commit runs, operations that arrive wait for the
    next, so there is one commit, and one C{on_durable} call, per group.

    Applying is idempotent by replication id: an append or delay whose id
    the store already holds is skipped, an ack, return, purge or release of
    an id it does not hold is dropped, topology calls replace or forget. So
    when a crash leaves a store's data ahead of its state record, replaying
    from the record duplicates nothing.

    @ivar applied_sequence: the last operation applied.
    @ivar durable_sequence: the last operation a finished commit covers.
    @ivar cluster_id: the cluster the stores' data belongs to, C{""} while unknown.
    @ivar on_durable: called with C{durable_sequence} after each commit.
    """

    log = Logger()

    def __init__(self, stores):
        """@param stores: a dict of store name to opened L{IMessageStore}."""
        self.stores = dict(stores)
        self.applied_sequence = 0
        self.durable_sequence = 0
        self.cluster_id = ""
        self.commits = 0
        self.on_durable = lambda sequence: None
        self.on_failure = lambda failure: None
        self._ids = {}  # (store name, queue) -> {replication id: handle}
        self._delayed = {}  # store name -> {replication id: handle}
        self._committing = False
        self._dispatch = {
            codec.SAVE_EXCHANGE: self._save_exchange, codec.DELETE_EXCHANGE: self._delete_exchange,
            codec.SAVE_QUEUE: self._save_queue, codec.DELETE_QUEUE: self._delete_queue,
            codec.SAVE_BINDING: self._save_binding, codec.DELETE_BINDING: self._delete_binding,
            codec.APPEND: self._append, codec.ACK_MESSAGE: self._ack,
            codec.RETURNED: self._returned, codec.PURGE: self._purge,
            codec.DELAY: self._delay, codec.RELEASE: self._release,
        }

    @defer.inlineCallbacks
    def open(self):
        """
        Read back the stores' state records and rebuild the id maps from the
        messages they hold; fires with None, or fails naming a store whose
        state belongs to another cluster than another store's.
        """
        states = {}
        for name, store in self.stores.items():
            reader = replica.ReplicaReader(store)
            states[name] = ("", 0)
            for item in store.topology():
                if replica.is_state(item):
                    states[name] = replica.read_state(item)
                elif isinstance(item, messages_pb2.QueueRecord):
                    queue = (item.vhost, item.name)
                    ids = self._ids.setdefault((name, queue), {})
                    for handle, _, _, replication_id in reader.recover(queue):
                        if replication_id is not None:
                            ids[replication_id] = handle
            delayed = self._delayed.setdefault(name, {})
            for item, replication_id in (yield reader.delayed()):
                if replication_id is not None:
                    delayed[replication_id] = item.handle
        clusters = {cluster for cluster, _ in states.values() if cluster}
        if len(clusters) > 1:
            raise StreamError(f"the stores hold data of several clusters: {sorted(clusters)}")
        self.cluster_id = clusters.pop() if clusters else ""
        self.applied_sequence = self.durable_sequence = min(
            (sequence for _, sequence in states.values()), default=0)

    def adopt_cluster(self, cluster_id):
        """The leader's cluster id, kept from the next commit on."""
        self.cluster_id = cluster_id

    def apply(self, sequence, operation, record, body):
        """Make one decoded operation; raises L{StreamError} naming what is wrong with it."""
        if sequence != self.applied_sequence + 1:
            raise StreamError(f"operation {sequence} out of order: expected"
                              f" {self.applied_sequence + 1}")
        store = self.stores.get(record.store)
        if store is None:
            raise StreamError(f"operation {sequence} is for the store of vhost {record.store!r},"
                              f" which this node does not have")
        try:
            self._dispatch[operation](store, record.store, sequence, record, body)
        except StreamError:
            raise
        except (ValueError, TypeError, KeyError, IndexError) as problem:
            raise StreamError(f"{codec.OPERATIONS[operation]} at sequence {sequence} failed:"
                              f" {problem!r}") from None
        self.applied_sequence = sequence

    def commit(self):
        """Start a commit of what is applied, unless one runs (then the next one covers it)."""
        if self._committing or self.applied_sequence == self.durable_sequence:
            return
        self._committing = True
        target = self.applied_sequence
        state = replica.state_record(self.cluster_id, target)
        for store in self.stores.values():
            store.save_exchange(state)
        synced = defer.gatherResults([store.sync() for store in self.stores.values()],
                                     consumeErrors=True)
        synced.addCallbacks(self._committed, self._failed, callbackArgs=(target,))

    def _committed(self, _, target):
        self._committing = False
        self.durable_sequence = target
        self.commits += 1
        self.on_durable(target)
        self.commit()

    def _failed(self, failure):
        self._committing = False
        self.log.failure("replicated operations could not be committed", failure)
        self.on_failure(failure)

    # One method per operation: (store, store name, sequence, record, body).

    def _save_exchange(self, store, name, sequence, record, body):
        store.save_exchange(record.exchange)

    def _delete_exchange(self, store, name, sequence, record, body):
        store.delete_exchange(record.target.vhost, record.target.name)

    def _save_queue(self, store, name, sequence, record, body):
        store.save_queue(record.queue_record)
        self._ids.setdefault((name, (record.queue_record.vhost, record.queue_record.name)), {})

    def _delete_queue(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        store.delete_queue(queue)
        self._ids.pop((name, queue), None)

    def _save_binding(self, store, name, sequence, record, body):
        store.save_binding(record.binding)

    def _delete_binding(self, store, name, sequence, record, body):
        store.delete_binding(record.binding)

    def _message(self, record, sequence, body):
        published_at = record.published_at if record.HasField("published_at") else None
        try:
            properties = replica.with_replication_id(record.properties, sequence)
        except Exception as problem:  # protobuf's DecodeError
            raise StreamError(f"undecodable properties at sequence {sequence}: {problem}") from None
        return MessageRecord(record.message_exchange, record.routing_key, properties, body,
                             published_at)

    def _append(self, store, name, sequence, record, body):
        queues = [(key.vhost, key.name) for key in record.queues]
        if not queues:
            raise StreamError(f"append at sequence {sequence} names no queue")
        maps = [self._ids.setdefault((name, queue), {}) for queue in queues]
        if any(sequence in ids for ids in maps):
            return  # replayed after a crash: the store has it already
        handle = store.append(self._message(record, sequence, body), queues)
        for ids in maps:
            ids[sequence] = handle

    def _ack(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        ids = self._ids.get((name, queue), {})
        for replication_id in record.messages:
            handle = ids.pop(replication_id, None)
            if handle is not None:
                store.ack(queue, handle)

    def _returned(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        ids = self._ids.get((name, queue), {})
        for replication_id in record.messages:
            handle = ids.get(replication_id)
            if handle is not None:
                store.returned(queue, handle, record.count)

    def _purge(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        ids = self._ids.get((name, queue), {})
        handles = [ids.pop(replication_id, None) for replication_id in record.messages]
        handles = [handle for handle in handles if handle is not None]
        if handles:
            store.purge(queue, handles)

    def _delay(self, store, name, sequence, record, body):
        delayed = self._delayed.setdefault(name, {})
        if sequence in delayed:
            return
        exchange = (record.target.vhost, record.target.name)
        delayed[sequence] = store.delay(self._message(record, sequence, body), exchange,
                                        record.due)

    def _release(self, store, name, sequence, record, body):
        delayed = self._delayed.setdefault(name, {})
        for replication_id in record.messages:
            handle = delayed.pop(replication_id, None)
            if handle is not None:
                store.release(handle)


def _one_queue(record, sequence):
    if len(record.queues) != 1:
        raise StreamError(f"operation at sequence {sequence} names {len(record.queues)} queues,"
                          f" not one")
    return record.queues[0].vhost, record.queues[0].name
