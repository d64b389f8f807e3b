"""What the chunked compaction tests share: parked messages spread over many chunks, and a store
(L{Compacting}) that compacts them."""

from twisted.internet import defer

from tests.support.chunked_files import ChunkedStores, sized
from tests.support.store_contract import JOBS, queue_record

PARKED = ("/", "parked")

EVERY = 12  # messages per chunk, about: 300-byte bodies in 4 KiB chunks

COUNT = 10 * EVERY  # ten chunks of them

BODY = 300


def published(number):
    return sized("p%03d" % number, BODY)


def parked_numbers():
    """The messages also routed to the parked queue: about one per chunk."""
    return list(range(0, COUNT, EVERY))


def slice_read(store):
    """A Deferred firing once the compaction slice the last commit named, if any, is read and placed."""
    reading = store._compaction.reading
    if reading is None:
        return defer.succeed(None)
    waiter = defer.Deferred()
    reading.addBoth(lambda result: waiter.callback(None))  # after the store's own callbacks
    return waiter


@defer.inlineCallbacks
def settle(store, limit=400):
    """Commit until a commit names no slice to copy: every sparse chunk is compacted."""
    for _ in range(limit):
        yield store.sync()
        if store._compaction.reading is None and not store._pending.batch.moves:
            return
        yield slice_read(store)
    raise AssertionError(f"compaction did not settle in {limit} commits")


class Compacting(ChunkedStores):
    """A store where a parked queue holds one message per chunk and JOBS held (then acked) them all."""

    options = {**ChunkedStores.options, "compact_below": "25", "compact_bytes": "1M", "compact_after_seconds": "0"}

    @defer.inlineCallbacks
    def parked_store(self, **options):
        store = yield self.open_store(**options)
        handles = yield self.park(store)
        return store, handles

    @defer.inlineCallbacks
    def park(self, store):
        """Declare the queues and publish the messages of L{parked_store} in an open store; their handles."""
        for vhost, name in (JOBS, PARKED):
            store.save_queue(queue_record(name, vhost=vhost))
        handles = [store.append(published(number), [JOBS, PARKED] if number in parked_numbers() else [JOBS])
                   for number in range(COUNT)]
        yield store.sync()
        return handles

    @defer.inlineCallbacks
    def consume_jobs(self, store, handles):
        for handle in handles:
            store.ack(JOBS, handle)
        yield settle(store)

    def assert_parked(self, store, expected, handles=None):
        """The parked queue holds the C{expected} message numbers, in order, by their first handles (if given)."""
        recovered = list(store.recovered_handles(PARKED))
        if handles is not None:
            self.assertEqual(recovered, [handles[number] for number in expected])
        self.assertEqual([store.load(handle).body for handle in recovered], [published(n).body for n in expected])
