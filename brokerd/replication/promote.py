"""A follower's stores made a leader's: read without replication's own records, tapped, and
streamed on from where the follower's stream stopped.

A promoted leader numbers its operations on from its stores' durable
sequence, and says in its history which epoch that sequence ended, so that
the other followers of the old leader resume from it without a copy (see
L{brokerd.replication.resume}). Its stores' state records then say they are
written as a leader's: messages the new leader appends carry no replication
id, so such a store, should its node follow again, always resyncs.
"""

from typing import NamedTuple

from twisted.internet import defer
from zope.interface import alsoProvides, providedBy

from brokerd.interfaces import DelayedMessage
from brokerd.replication import codec, replica
from brokerd.replication.applied import SYNTHETIC_IDS
from brokerd.replication.stream import OutboundStream
from brokerd.replication.tap import StoreTap


class Leadership(NamedTuple):
    """
    What a leader serves from: its stream, the tapped store of each store name
    (what the broker uses), its epoch and history (for L{ReplicationServer}).
    """

    stream: OutboundStream
    stores: dict
    epoch: int
    history: tuple


def delegate(wrapper, wrapped, name):
    """
    C{wrapped}'s attribute C{name}, for a wrapper's C{__getattr__}: a method is
    kept on the wrapper, so that later calls find it at once rather than through
    C{__getattr__} again (the broker calls the store once or more per message).
    """
    value = getattr(wrapped, name)
    if callable(value):
        setattr(wrapper, name, value)
    return value


class LeaderStore:
    """
    An opened store, last written as a follower's, read as a leader's: every
    read the broker makes (topology, recover, recovered_handles, load, read,
    delayed_after) gives records without the replication-id header and the
    topology without the state record; every write passes through.
    """

    def __init__(self, store):
        self._store = store
        alsoProvides(self, *providedBy(store))

    def __getattr__(self, name):
        return delegate(self, self._store, name)

    def topology(self):
        return [item for item in self._store.topology() if not replica.is_state(item)]

    def recover(self, queue):
        return [(handle, replica.split_replication_id(record)[1], redelivered)
                for handle, record, redelivered in self._store.recover(queue)]

    def recovered_handles(self, queue):
        return self._store.recovered_handles(queue)

    def load(self, handle):
        record = self._store.load(handle)
        if record.properties.HasField("replication_id"):  # stored while a follower
            return replica.split_replication_id(record)[1]
        return record

    def read(self, handle):
        return self._store.read(handle).addCallback(
            lambda record: replica.split_replication_id(record)[1])

    def delayed_after(self, cursor, until, limit):
        return self._store.delayed_after(cursor, until, limit).addCallback(lambda window: [
            DelayedMessage(item.due, item.handle, item.exchange,
                           replica.split_replication_id(item.record)[1]) for item in window])


@defer.inlineCallbacks
def leader_stores(applier, epoch, *, retain_bytes=64 * 1024 * 1024, reactor=None):
    """
    Make the stores of an opened L{StoreApplier} a leader's of C{epoch} (any
    applier: a follower's, or one opened over a node's own stores). Commits
    what the applier applied, marks each store as written by a leader from
    here on, and fires with a L{Leadership}: each store wrapped in a
    L{LeaderStore} and a L{StoreTap} whose maps hold every message's id (so
    acks of the messages held stream with the ids the followers know), and a
    stream numbered on from the stores' durable sequence.

    The history says the stream continues the applier's epoch up to that
    sequence, unless the stores could not resume a stream themselves (last
    written as a leader's, unfinished snapshot, data of unknown origin, or
    messages newer than their state record): then it is empty, and every
    follower resyncs. The applier is not to be used afterwards. With a C{reactor},
    the taps record a run of acks as one operation (L{StoreTap}) and the stream announces
    a turn's operations at once (L{OutboundStream}).
    """
    applier.on_durable = lambda sequence: None
    yield applier.flush()
    base = applier.durable_sequence
    newest = max((replication_id for name in applier.stores
                  for ids in applier.held.queues(name).values() for replication_id in ids
                  if replication_id < SYNTHETIC_IDS), default=0)
    newest = max([newest] + [replication_id for name in applier.stores
                             for replication_id in applier.held.delayed(name)
                             if replication_id < SYNTHETIC_IDS])
    history = ()
    if applier.resumable and newest <= base:
        history = (((applier.epoch, base),) + tuple(applier.history))[:codec.HISTORY_LIMIT]
    start = max(base, newest)
    stream = OutboundStream(retain_bytes, last_sequence=start, reactor=reactor)
    state = replica.state_record(replica.StoreState(
        applier.cluster_id, epoch, start, replica.LEADER, history))
    taps = {}
    for name, store in applier.stores.items():
        store.save_exchange(state)
        tap = taps[name] = StoreTap(LeaderStore(store), stream, name, reactor=reactor)
        queues = applier.held.queues(name)
        tap.seed(applier.held.topology(name),
                 {queue: {handle: replication_id for replication_id, handle in ids.items()}
                  for queue, ids in queues.items()},
                 {handle: replication_id
                  for replication_id, handle in applier.held.delayed(name).items()},
                 {queue: {ids[replication_id]: count
                          for replication_id, count in applier.held.counts(name, queue).items()
                          if replication_id in ids}
                  for queue, ids in queues.items()})
    yield defer.gatherResults([store.sync() for store in applier.stores.values()],
                              consumeErrors=True)
    return Leadership(stream, taps, epoch, history)
