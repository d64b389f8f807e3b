"""The follower's side of replication: the leader's store operations made on its own stores."""

import time

from twisted.internet import defer
from twisted.logger import Logger

from brokerd.replication import codec, replica
from brokerd.replication.applied import AppliedState
from brokerd.replication.codec import StreamError

# How many distinct append records (L{StoreApplier.apply_payload}) are kept parsed.
APPENDS_KEPT = 256


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

    A follower that cannot resume (L{resumable} false) is given a snapshot:
    L{wipe} empties its stores, L{apply_snapshot} stores the leader's state
    and L{finish_snapshot} sets the stream position it stands for.

    @ivar applied_sequence: the last operation applied.
    @ivar durable_sequence: the last operation a finished commit covers.
    @ivar cluster_id: the cluster the stores' data belongs to, C{""} while unknown.
    @ivar epoch: the epoch of the leader whose stream the stores hold (0: none).
    @ivar history: that leader's history, C{((epoch, end sequence), ...)}, newest first.
    @ivar role: what the state records say (L{replica.FOLLOWER}, L{replica.PARTIAL},
        L{replica.LEADER}).
    @ivar on_durable: called with C{durable_sequence} after each commit.
    """

    log = Logger()

    def __init__(self, stores, *, access_sink=None, wipe=None, state_seconds=None):
        """
        @param stores: a dict of store name to opened L{IMessageStore}.
        @param access_sink: called with the bytes of each access database
            document the leader streams (its JSON), in sequence order; checking
            them is the sink's affair.
        @param wipe: called with the stores to empty them for a snapshot; returns
            a Deferred. By default every queue, exchange, binding and delayed
            message is deleted through the store contract.
        """
        self.stores = dict(stores)
        self.access_sink = access_sink
        self._wipe = wipe
        self.applied_sequence = 0
        self.durable_sequence = 0
        self.cluster_id = ""
        self.epoch = 0
        self.history = ()
        self.role = replica.FOLLOWER
        self.foreign_data = False  # data found without any state record: a leader's
        self.commits = 0
        self.on_durable = lambda sequence: None
        self.on_failure = lambda failure: None
        self.held = AppliedState()
        self._changes = 0  # operations applied since the last commit started
        self._committing = False
        self._flush_waiters = []
        self._in_snapshot = False
        self._appends = {}  # serialised append record -> replica.Append
        self._state_seconds = state_seconds
        self._running = False
        self._written = None  # the last state record written, and when
        self._written_at = 0.0
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
            state, had_data = yield self.held.load(name, store)
            states[name] = state
            if state is None and had_data:
                self.foreign_data = True
        found = [state for state in states.values() if state is not None]
        clusters = {state.cluster for state in found if state.cluster}
        if len(clusters) > 1:
            raise StreamError(f"the stores hold data of several clusters: {sorted(clusters)}")
        self.cluster_id = clusters.pop() if clusters else ""
        if found:
            self.applied_sequence = self.durable_sequence = min(s.sequence for s in found)
            newest = max(found, key=lambda state: state.epoch)
            self.epoch, self.history = newest.epoch, newest.history
            roles = {state.role for state in found}
            self.role = next((role for role in (replica.LEADER, replica.PARTIAL, replica.RUNNING)
                              if role in roles), replica.FOLLOWER)
            if len({(state.epoch, state.history) for state in found}) > 1:
                self.role = replica.PARTIAL  # a crash between two stores' commits
            if len(found) < len(self.stores):
                self.role = replica.PARTIAL

    @property
    def resumable(self):
        """Whether the stores may resume a stream (else only a snapshot can fill them)."""
        return self.role == replica.FOLLOWER and not self.foreign_data

    def adopt(self, cluster_id, epoch, history):
        """The leader's cluster id, epoch and history, kept from the next commit on."""
        self.cluster_id, self.epoch, self.history = cluster_id, epoch, tuple(history)

    def adopt_cluster(self, cluster_id):
        self.cluster_id = cluster_id

    def start_running(self):
        """
        Mark the stores as running (a crash from here on leaves them to resync, their
        data perhaps ahead of their state), so that the state record may be written
        only now and then; fires once that mark is durable. L{stop_running} undoes it.
        """
        self._running = True
        return self.flush()

    def stop_running(self):
        """Write the exact state, marked as ended cleanly; fires once it is durable."""
        self._running = False
        return self.flush()

    def state(self, sequence=None):
        role = replica.PARTIAL if self._in_snapshot else self.role
        if role == replica.FOLLOWER and self._running:
            role = replica.RUNNING
        return replica.StoreState(self.cluster_id, self.epoch,
                                  self.applied_sequence if sequence is None else sequence, role,
                                  self.history)

    def apply(self, sequence, operation, record, body):
        """
        Make one decoded operation (an append's record may be given as a
        L{replica.Append}; a run's appends are made as one); raises
        L{StreamError} naming what is wrong with it.
        """
        if self._in_snapshot:
            raise StreamError(f"operation {sequence} in the middle of a snapshot")
        if sequence != self.applied_sequence + 1:
            raise StreamError(f"operation {sequence} out of order: expected"
                              f" {self.applied_sequence + 1}")
        if operation == codec.APPEND_RUN:
            bodies = codec.split_run(body, sequence)
            for offset, each in enumerate(bodies):
                self._make(sequence + offset, codec.APPEND, record, each, sequence + offset)
            self.applied_sequence = sequence + len(bodies) - 1
            return
        self._make(sequence, operation, record, body, sequence)
        self.applied_sequence = sequence

    def apply_payload(self, payload):
        """
        Make the operation of one operation frame's payload, as L{apply} does.
        An append's record is parsed once for all the appends that stream the
        same record bytes (messages published alike), which is most of them.
        """
        sequence, operation, data, body = codec.split_operation(payload)
        if operation == codec.APPEND:
            bodies = (body,)
        elif operation == codec.APPEND_RUN:
            bodies = codec.split_run(body, sequence)
        else:
            self.apply(sequence, operation, codec.parse_record(data, operation, sequence), body)
            return
        kept = self._appends.get(data)
        if kept is None:
            append = replica.Append.of(codec.parse_record(data, codec.APPEND, sequence), sequence)
            if len(self._appends) >= APPENDS_KEPT:
                self._appends.clear()
            kept = self._appends[data] = [append, None, -1]
        append, maps, generation = kept
        if self._in_snapshot or sequence != self.applied_sequence + 1:
            self.apply(sequence, operation, append, body)  # refused there, naming why
            return
        # What apply, _make and _append do, inline: most operations are appends.
        store = self.stores.get(append.store)
        if store is None:
            store = self._store(append.store, sequence)
        held = self.held
        if generation != held.generation:
            maps = kept[1] = [held.ids(append.store, queue) for queue in append.queues]
            kept[2] = held.generation
        message, queues = append.message, append.queues
        for body in bodies:
            for ids in maps:
                if sequence in ids:
                    break  # replayed after a crash: the store has it already
            else:
                try:
                    handle = store.append(message(sequence, body), queues)
                except (ValueError, TypeError, KeyError, IndexError) as problem:
                    raise StreamError(f"append at {sequence} failed: {problem!r}") from None
                for ids in maps:
                    ids[sequence] = handle
            sequence += 1
        self._changes += len(bodies)
        self.applied_sequence = sequence - 1

    def apply_snapshot(self, replication_id, operation, record, body):
        """Make one operation of a snapshot (an append's or delay's C{replication_id} given)."""
        if not self._in_snapshot:
            raise StreamError("a snapshot operation while no snapshot was asked for")
        if operation not in codec.SNAPSHOT_OPERATIONS:
            raise StreamError(f"a snapshot cannot hold {codec.OPERATIONS[operation]}")
        self._make(replication_id, operation, record, body, f"snapshot id {replication_id}")

    def finish_snapshot(self, position):
        """The snapshot is whole: the stores now hold the leader's stream up to C{position}."""
        if not self._in_snapshot:
            raise StreamError("a snapshot end while no snapshot was asked for")
        self._in_snapshot = False
        self.role = replica.FOLLOWER
        self.applied_sequence = position
        self._changes += 1

    def _make(self, sequence, operation, record, body, where):
        if operation == codec.ACCESS_DOCUMENT:
            if self.access_sink is not None:
                self.access_sink(body)
            self._changes += 1
            return
        store = self._store(record.store, where)
        try:
            self._dispatch[operation](store, record.store, sequence, record, body)
        except StreamError:
            raise
        except (ValueError, TypeError, KeyError, IndexError) as problem:
            raise StreamError(f"{codec.OPERATIONS[operation]} at {where} failed:"
                              f" {problem!r}") from None
        self._changes += 1

    def _store(self, name, where):
        store = self.stores.get(name)
        if store is None:
            raise StreamError(f"operation {where} is for the store of vhost {name!r},"
                              f" which this node does not have")
        return store

    def commit(self):
        """Start a commit of what is applied, unless one runs (then the next one covers it)."""
        if self._committing:
            return
        target = self.applied_sequence
        state = self.state(target)
        if not self._changes and (not self._flush_waiters or state == self._written):
            return
        self._committing, self._changes = True, 0
        if self._state_due(state):
            record = replica.state_record(state)
            self._written, self._written_at = state, time.monotonic()
            for store in self.stores.values():
                store.save_exchange(record)
        synced = defer.gatherResults([store.sync() for store in self.stores.values()],
                                     consumeErrors=True)
        synced.addCallbacks(self._committed, self._failed, callbackArgs=(target,))

    def _state_due(self, state):
        if self._state_seconds is None or not self._running or self._flush_waiters:
            return True
        written = self._written
        return (written is None or state._replace(sequence=0) != written._replace(sequence=0)
                or time.monotonic() - self._written_at >= self._state_seconds)

    def flush(self):
        """A Deferred firing (with C{durable_sequence}) once a commit covers all applied so far."""
        waiter = defer.Deferred()
        self._flush_waiters.append(waiter)
        self.commit()
        self._check_flushed()
        return waiter

    def _check_flushed(self):
        if not self._changes and not self._committing:
            waiters, self._flush_waiters = self._flush_waiters, []
            for waiter in waiters:
                waiter.callback(self.durable_sequence)

    def _committed(self, _, target):
        self._committing = False
        self.durable_sequence = target
        self.commits += 1
        self.on_durable(target)
        self.commit()
        self._check_flushed()

    def _failed(self, failure):
        self._committing = False
        self.log.failure("replicated operations could not be committed", failure)
        waiters, self._flush_waiters = self._flush_waiters, []
        for waiter in waiters:
            waiter.errback(failure)
        self.on_failure(failure)

    @defer.inlineCallbacks
    def wipe(self):
        """
        Empty the stores for a snapshot and commit that (state: unfinished
        snapshot, sequence 0), so that a crash before the snapshot ends
        resyncs again; fires with None once durable.
        """
        if self._wipe is not None:
            yield self._wipe(self.stores)
        else:
            for name, store in self.stores.items():
                self.held.wipe(name, store)
        self.held.clear()
        self.applied_sequence = self.durable_sequence = 0
        self.foreign_data = False
        self._in_snapshot = True
        self._changes += 1
        yield self.flush()

    # One method per operation: (store, store name, replication id, record, body).

    def _save_exchange(self, store, name, sequence, record, body):
        store.save_exchange(record.exchange)
        self.held.exchanges(name)[(record.exchange.vhost, record.exchange.name)] = record.exchange

    def _delete_exchange(self, store, name, sequence, record, body):
        store.delete_exchange(record.target.vhost, record.target.name)
        self.held.exchanges(name).pop((record.target.vhost, record.target.name), None)

    def _save_queue(self, store, name, sequence, record, body):
        store.save_queue(record.queue_record)
        queue = (record.queue_record.vhost, record.queue_record.name)
        self.held.ids(name, queue)
        self.held.queue_records(name)[queue] = record.queue_record

    def _delete_queue(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        store.delete_queue(queue)
        self.held.forget_queue(name, queue)

    def _save_binding(self, store, name, sequence, record, body):
        store.save_binding(record.binding)
        self.held.bindings(name)[replica.binding_key(record.binding)] = record.binding

    def _delete_binding(self, store, name, sequence, record, body):
        store.delete_binding(record.binding)
        self.held.bindings(name).pop(replica.binding_key(record.binding), None)

    def _append(self, store, name, sequence, record, body):
        append = record if type(record) is replica.Append else replica.Append.of(record, sequence)
        held = self.held
        maps = [held.ids(name, queue) for queue in append.queues]
        for ids in maps:
            if sequence in ids:
                return  # replayed after a crash: the store has it already
        handle = store.append(append.message(sequence, body), append.queues)
        for ids in maps:
            ids[sequence] = handle

    def _ack(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        ids, counts = self.held.ids(name, queue), self.held.counts(name, queue)
        for replication_id in record.messages:
            handle = ids.pop(replication_id, None)
            if handle is not None:
                store.ack(queue, handle)
                counts.pop(replication_id, None)

    def _returned(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        ids = self.held.ids(name, queue)
        for replication_id in record.messages:
            handle = ids.get(replication_id)
            if handle is not None:
                store.returned(queue, handle, record.count)
                self.held.counts(name, queue)[replication_id] = record.count

    def _purge(self, store, name, sequence, record, body):
        queue = _one_queue(record, sequence)
        ids, counts = self.held.ids(name, queue), self.held.counts(name, queue)
        for replication_id in record.messages:
            counts.pop(replication_id, None)
        handles = [ids.pop(replication_id, None) for replication_id in record.messages]
        handles = [handle for handle in handles if handle is not None]
        if handles:
            store.purge(queue, handles)

    def _delay(self, store, name, sequence, record, body):
        delayed = self.held.delayed(name)
        if sequence in delayed:
            return
        exchange = (record.target.vhost, record.target.name)
        delayed[sequence] = store.delay(replica.message(record, sequence, body), exchange,
                                        record.due)

    def _release(self, store, name, sequence, record, body):
        delayed = self.held.delayed(name)
        for replication_id in record.messages:
            handle = delayed.pop(replication_id, None)
            if handle is not None:
                store.release(handle)


def _one_queue(record, sequence):
    if len(record.queues) != 1:
        raise StreamError(f"operation at sequence {sequence} names {len(record.queues)} queues,"
                          f" not one")
    return record.queues[0].vhost, record.queues[0].name
