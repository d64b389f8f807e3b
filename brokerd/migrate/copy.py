"""Reading a store through its own backend and writing another through its own.

L{SourceReader} walks an opened source store: topology, each durable queue's
messages (handles first, then one message at a time, so the migration holds
no more of the store than the store itself holds), delivery counts, delayed
messages. L{copy_store} writes what it reads into an opened, empty target,
storing a message shared by several queues once where the source says so
(the same handle in several queues), and tallies what it copied for the
final check.
"""

import heapq
import time

from twisted.internet import defer
from twisted.python.failure import Failure

from brokerd.interfaces import (
    IDelayedMessageStore,
    IPagingStore,
    QuarantinedRecord,
    StoreCorrupted,
    UnreadableMessage,
)
from brokerd.migrate.digest import message_digest
from brokerd.proto import messages_pb2

FOREVER = (1 << 63) - 1  # the latest due time a delayed message can have
READ_BATCH = 512  # messages read (their Deferreds outstanding) before they are appended
# Appends between two syncs of the target, which bound what it buffers ...
SYNC_EVERY_MESSAGES = 20_000
SYNC_EVERY_BYTES = 32 << 20  # ... and body bytes between them
DELAYED_WINDOW = 1000  # delayed messages per delayed_after call
MEASURED_ENTRIES = 1000  # messages done before the progress lines give a time left
_END = object()


class MigrationError(Exception):
    """An expected failure, said in one line."""


class SourceReader:
    """
    What an opened store holds, read through the store contract.

    @ivar records: the readable topology records, in the store's order.
    @ivar quarantined: the L{QuarantinedRecord}s the store handed out instead of records.
    @ivar queues: queue key -> list of its message handles, in queue order.
    @ivar flags: queue key -> list of redelivered flags parallel to its handles,
        or None where every message is flagged (a paging store's handles).
    @ivar damaged: queue key -> the L{StoreCorrupted} its recovery raised.
    """

    def __init__(self, store):
        self.store = store
        self.paging = IPagingStore.providedBy(store)
        self.records, self.quarantined = [], []
        self.queues, self.flags, self.damaged = {}, {}, {}
        for record in store.topology():
            if isinstance(record, QuarantinedRecord):
                self.quarantined.append(record)
            else:
                self.records.append(record)
        for record in self.records:
            if isinstance(record, messages_pb2.QueueRecord):
                self._scan((record.vhost, record.name))

    def _scan(self, queue):
        try:
            if self.paging:
                self.queues[queue], self.flags[queue] = self.store.recovered_handles(queue), None
                return
            handles, flags = [], []
            # Each record is dropped at once.
            for handle, _, redelivered in self.store.recover(queue):
                handles.append(handle)
                flags.append(redelivered)
            self.queues[queue], self.flags[queue] = handles, flags
        except StoreCorrupted as damage:
            self.damaged[queue] = damage

    def entries(self):
        return sum(len(handles) for handles in self.queues.values())

    @defer.inlineCallbacks
    def read(self, handles):
        """
        A Deferred firing with C{(True, message)} or C{(False, Failure)} for
        each of C{handles}: a paging store's loads are made at once, other
        stores' reads all asked for before the first is waited on.
        """
        if self.paging:
            load, found = self.store.load, []
            for handle in handles:
                try:
                    found.append((True, load(handle)))
                except Exception:
                    found.append((False, Failure()))
            return found
        reads = [self.store.read(handle) for handle in handles]
        found = yield defer.DeferredList(reads, consumeErrors=True)
        return found

    def groups(self):
        """
        C{(handle, [(queue, redelivered), ...])} for every stored message, so
        that each queue gets its messages in its order: the queues' handle
        lists are merged by handle, and a handle at the head of several lists
        at once is one message stored for them all. Handles of the durable
        stores grow in append order within a queue, so a shared message is
        always at every head at once; were they not to, each queue would
        still get its own order, and a shared message would be copied once
        per queue.
        """
        queues = list(self.queues)
        if any(handles and type(handles[0]) is not int for handles in self.queues.values()):
            for queue in queues:  # handles that do not order: queue by queue, nothing shared
                for position, handle in enumerate(self.queues[queue]):
                    yield handle, [(queue, self._flag(queue, position))]
            return
        streams = [enumerate(self.queues[queue]) for queue in queues]
        heap = []
        for number, stream in enumerate(streams):
            position, handle = next(stream, (None, _END))
            if handle is not _END:
                heap.append((handle, number, position))
        heapq.heapify(heap)
        while heap:
            handle = heap[0][0]
            holders = []
            while heap and heap[0][0] == handle:
                _, number, position = heapq.heappop(heap)
                queue = queues[number]
                holders.append((queue, self._flag(queue, position)))
                following, after = next(streams[number], (None, _END))
                if after is not _END:
                    heapq.heappush(heap, (after, number, following))
            yield handle, holders

    def _flag(self, queue, position):
        flags = self.flags[queue]
        return True if flags is None else flags[position]

class Progress:
    """
    Lines on stderr, at most one per C{every} seconds: queue entries copied,
    rate, MB/s, time left.
    """

    def __init__(self, total, write=None, every=1.0, clock=time.monotonic, verb="copied"):
        self.total, self.write, self.every, self.clock, self.verb = total, write, every, clock, verb
        self.entries = self.bytes = 0
        self.started = self._last = clock()

    def advance(self, entries, size):
        self.entries += entries
        self.bytes += size
        now = self.clock()
        if self.write is not None and now - self._last >= self.every:
            self._last = now
            self.write(self.line(now))

    def line(self, now=None):
        elapsed = max((now or self.clock()) - self.started, 1e-9)
        rate = self.entries / elapsed
        if self.entries >= MEASURED_ENTRIES:
            left = f"{(self.total - self.entries) / rate:.0f} s"
        else:
            left = "unknown yet"
        share = 100.0 * self.entries / self.total if self.total else 100.0
        return (
            f"{self.verb} {self.entries}/{self.total} messages ({share:.0f}%), {rate:,.0f} msg/s,"
            f" {self.bytes / elapsed / 1e6:.1f} MB/s, {elapsed:.0f} s elapsed, ETA {left}"
        )


@defer.inlineCallbacks
def copy_store(reader, target, tallies, progress, skip_unreadable):
    """
    Write what C{reader} reads into C{target} (opened and empty) and tally it.

    @return: a Deferred firing with a dict of figures (messages stored,
        queue entries, delayed messages, unreadable messages left out).
    """
    figures = {"messages": 0, "entries": 0, "delayed": 0, "unreadable": []}
    store = reader.store
    for record in reader.records:
        if _belongs_to(record, reader.damaged):
            continue
        tallies.add_record(record)
        if isinstance(record, messages_pb2.ExchangeRecord):
            target.save_exchange(record)
        elif isinstance(record, messages_pb2.QueueRecord):
            target.save_queue(record)
        else:
            target.save_binding(record)
    counts = {queue: store.delivery_counts(queue) for queue in reader.queues}
    syncing = target.sync()
    since_sync = unsynced_bytes = 0
    groups = reader.groups()
    while True:
        batch = [group for _, group in zip(range(READ_BATCH), groups)]
        if not batch:
            break
        reads = yield reader.read([handle for handle, _ in batch])
        batch_entries = batch_bytes = 0
        for (handle, holders), (ok, result) in zip(batch, reads):
            if not ok:
                if not result.check(UnreadableMessage) or not skip_unreadable:
                    what = ", ".join(f"{queue[1]!r} in vhost {queue[0]!r}" for queue, _ in holders)
                    raise MigrationError(
                        f"the source's message {handle} of queue {what} cannot be read:"
                        f" {result.getErrorMessage()}"
                    )
                figures["unreadable"].append(
                    (handle, [queue for queue, _ in holders], result.getErrorMessage())
                )
                continue
            message = result
            stored = target.append(message, [queue for queue, _ in holders])
            digest = message_digest(message)
            for queue, redelivered in holders:
                count = counts[queue].get(handle, 0)
                if count:
                    target.returned(queue, stored, count)
                tallies.queue(queue).add(digest, redelivered, count)
            figures["messages"] += 1
            figures["entries"] += len(holders)
            batch_entries += len(holders)
            batch_bytes += len(message.body)
        progress.advance(batch_entries, batch_bytes)
        since_sync += len(batch)
        unsynced_bytes += batch_bytes
        if since_sync >= SYNC_EVERY_MESSAGES or unsynced_bytes >= SYNC_EVERY_BYTES:
            yield syncing  # one commit runs while the next batch is read
            syncing = target.sync()
            since_sync = unsynced_bytes = 0
    cursor = None
    while True:
        window = yield delayed_window(store, cursor)
        if not window:
            break
        if not IDelayedMessageStore.providedBy(target):
            raise MigrationError(
                f"the source holds delayed messages and the {target.name} store cannot keep them"
            )
        for delayed in window:
            target.delay(delayed.record, delayed.exchange, delayed.due)
            tallies.add_delayed(delayed, delayed.record)
            figures["delayed"] += 1
        cursor = (window[-1].due, window[-1].handle)
        yield syncing
        syncing = target.sync()
    yield syncing
    yield target.sync()
    return figures


def _belongs_to(record, damaged):
    """
    True for the record of a damaged queue, and for bindings to it: they stay
    behind with its messages.
    """
    if isinstance(record, messages_pb2.QueueRecord):
        return (record.vhost, record.name) in damaged
    if isinstance(record, messages_pb2.BindingRecord):
        return (record.vhost, record.queue) in damaged
    return False


@defer.inlineCallbacks
def tally_store(store, tallies, progress):
    """
    Tally what an opened store holds (the target, reopened), the way
    L{copy_store} tallied the source.
    """
    paging = IPagingStore.providedBy(store)
    for record in store.topology():
        if isinstance(record, QuarantinedRecord):
            raise MigrationError(
                f"the target hands back a quarantined {record.kind} {record.name!r}:"
                f" {record.reason}"
            )
        tallies.add_record(record)
        if not isinstance(record, messages_pb2.QueueRecord):
            continue
        queue = (record.vhost, record.name)
        counts = store.delivery_counts(queue)
        tally = tallies.queue(queue)
        if paging:
            recovered = (
                (handle, store.load(handle), True) for handle in store.recovered_handles(queue)
            )
        else:
            recovered = store.recover(queue)
        for handle, message, redelivered in recovered:
            tally.add(message_digest(message), redelivered, counts.get(handle, 0))
            progress.advance(1, len(message.body))
    cursor = None
    while True:
        window = yield delayed_window(store, cursor)
        if not window:
            return
        for delayed in window:
            tallies.add_delayed(delayed, delayed.record)
        cursor = (window[-1].due, window[-1].handle)


def delayed_window(store, cursor):
    """A Deferred firing with the next L{DELAYED_WINDOW} delayed messages after
    C{cursor} (none for a store that keeps none)."""
    if not IDelayedMessageStore.providedBy(store):
        return defer.succeed([])
    return store.delayed_after(cursor, FOREVER, DELAYED_WINDOW)
