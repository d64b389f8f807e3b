"""L{FilelogStore}: the store contract over one append-only file per durable queue.

The reactor thread buffers every change in a L{Batch}; the store's
L{WriterThread} hands each batch to the L{FilelogWriter} on the writer
thread, its group commit deciding when it is fsynced. The store pages
(L{IPagingStore}): the broker keeps only handles for recovered messages and
deep queues' backlogs, and L{load} gives each message at once, from the
batches not yet written or from the files (L{backends.filelog.reads}: the
reactor thread reads them through descriptors of its own, by an index of each
file that every commit's result extends).
The reactor thread keeps nothing per message but those indexes: an ack is
buffered, and the writer thread, which indexes its files too, flips the flag.

Delayed messages go to one more log (L{backends.filelog.delayedlog}); the
writer thread indexes it by due time, and the reactor thread keeps only which
handles are kept (a L{HandleMap}) and the delays not yet handed over.
"""

import os

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from backends.common.delayed_requests import (
    HandleLease,
    check_due,
    check_exchange,
    delayed_window,
    readable_messages,
)
from backends.common.handle_map import HandleMap
from backends.common.message_heads import MessageHeads
from backends.common.message_record import loaded_records, record_of
from backends.common.topology_file import DurableTopology
from backends.common.writer_thread import WriterThread, appends_in
from backends.filelog.delayedlog import decode_delayed, encode_delayed
from backends.filelog.figures import FiguresNow
from backends.filelog.reads import FileReads, Routes
from backends.filelog.records import encode
from backends.filelog.writer import ROUTE_BITS, FilelogWriter
from brokerd.interfaces import (
    DelayedMessage,
    ICommitFailures,
    IDelayedMessageStore,
    IPagingStore,
    ITimedCommits,
    StoreCorrupted,
    UnreadableMessage,
)
from brokerd.storage.durability import SyncPolicy

log = Logger()


class Batch:
    """
    What the reactor thread buffered since the last commit, shaped for the
    writer: an append acked before its commit is simply never written, and a
    deleted queue takes its buffered appends and acks with it, so the writer
    can apply removals, then appends, then acks.
    """

    __slots__ = ("records", "appends", "acks", "returns", "deleted", "damaged", "topology",
                 "delays", "delay_releases", "delay_lease")

    def __init__(self):
        # handle -> (head, body, message): the StoredMessage encoded, and what was appended
        self.records = {}
        self.appends = {}  # queue key -> {handle: None}, in append order
        self.acks = {}  # queue key -> [handle], of records already handed to the writer
        self.returns = {}  # queue key -> {handle: delivery count}, the latest count of each
        self.deleted = []  # queue keys whose files go before this batch's appends
        # queue key -> StoreCorrupted found reading its file: the writer leaves it alone
        self.damaged = {}
        self.topology = None  # the new topology file's contents, if it changed
        self.delays = {}  # delayed handle -> (due, exchange key, head, body), in handle order
        self.delay_releases = []  # delayed handles handed to the writer before, released since
        self.delay_lease = None  # the handle limit to persist, if it moved

    def is_empty(self):
        return not (self.records or self.acks or self.returns or self.deleted or self.damaged
                    or self.delays or self.delay_releases or self.delay_lease is not None)


@implementer(IPagingStore, IDelayedMessageStore, ITimedCommits, ICommitFailures)
class FilelogStore:
    """
    Keeps each durable queue's persistent messages in its own file, an ack
    being a one-byte flip of the record's valid flag, and the topology in a
    small file replaced whole on change.

    Handles are integers: a sequence number shifted left by C{ROUTE_BITS},
    and in the low bits the number of the set of queues the message was
    appended to (L{Routes}). One handle serves every queue a message was
    appended for, though each queue's file has its own copy of the record.
    After a restart each recovered copy has a handle of its own.
    """

    name = "filelog"
    durable = True

    def __init__(self, directory, sync_policy=None, compact_min_records=2000,
                 compact_valid_ratio=0.5, *, reactor, delayed_bucket_ms=60_000,
                 cache_size=64 << 20):
        self.directory = directory
        self.sync_policy = sync_policy or SyncPolicy()
        self.compact_min_records = compact_min_records
        self.compact_valid_ratio = compact_valid_ratio
        self._writer_thread = WriterThread(self.name, self.sync_policy, reactor, self._take_batch,
                                           self._close_files, self._batch_written, appends_in)
        self._writer = FilelogWriter(directory, compact_min_records, compact_valid_ratio,
                                     delayed_bucket_ms)
        # the sets of queues messages are appended to, numbered for their handles
        self._routes = Routes()
        self._reads = FileReads(self._writer.path_of, cache_size, self._routes)
        self._topology = DurableTopology()
        self._batch = Batch()
        # batches handed to the writer whose records the reads do not know of yet
        self._in_flight = []
        self._recovered = {}  # queue key -> range of the handles open found
        self._recovered_counts = {}  # queue key -> {handle: delivery count} that open found
        self._damaged = {}  # queue key -> StoreCorrupted found at open or reading its file
        # handles of unparsable records: kept valid in their files, acks ignored
        self._kept_in_place = set()
        self._next_sequence = 1
        self._appends = 0
        self._acks = 0
        self._delayed = HandleMap()  # kept delayed handles
        self._lease = HandleLease()
        self._delayed_damage = None  # StoreCorrupted that open found in the delayed files
        self._figures = FiguresNow(0, 0, 0, 0)  # the files' figures as of the last commit
        self._heads = MessageHeads(valid=True)

    @property
    def cache_size(self):
        return self._reads.cache_size

    def open(self):
        """
        Start the writer thread and index the files on it, reading no message.
        Fails with StoreCorrupted if the topology file is damaged, or
        DirectoryInUse if another open store has the directory; a damaged
        queue file only makes that queue unavailable.
        """
        return self._writer_thread.open(self._writer.open, self._writer.write_batch, self._take_in)

    def _take_in(self, recovery):
        """Keep what the writer thread's open found (its L{Recovery})."""
        self._topology.recovered(recovery.topology)
        self._damaged = dict(recovery.damaged)
        self._routes.number_recovered(recovery.queues)
        step = 1 << ROUTE_BITS
        self._recovered = {queue: range(first, first + count * step, step)
                           for queue, (first, count) in recovery.recovered.items()}
        for queue, update in recovery.files.items():
            self._reads.take(queue, update)
        self._recovered_counts = dict(recovery.delivery_counts)
        self._next_sequence = recovery.next_sequence
        self._delayed = recovery.delayed.kept
        self._lease = HandleLease(recovery.delayed.next_handle)
        self._delayed_damage = recovery.delayed.damage
        self._figures = recovery.figures

    def _check_available(self, queue):
        damage = self._damaged.get(queue)
        if damage is not None:
            raise StoreCorrupted(f"queue {queue!r} is unavailable: {damage}", damage.path,
                                 damage.offset)

    def recovered_handles(self, queue):
        """The handles of the messages open found for C{queue}, in queue order, all
        possibly delivered before."""
        damage = self._damaged.get(queue)
        if damage is not None:
            raise StoreCorrupted(str(damage), damage.path, damage.offset)
        return self._recovered.get(queue, range(0))

    def recover(self, queue):
        """
        The messages open found for C{queue}, read one at a time as the result
        is iterated; one that cannot be parsed is quarantined (logged, kept
        in the file as it is) and left out.
        """
        return loaded_records(self.load, queue, self.recovered_handles(queue),
                              "it is kept in the file as it is")

    def delivery_counts(self, queue):
        return dict(self._recovered_counts.get(queue, ()))

    def watch_commit_failures(self, listener):
        self._writer_thread.failures.watch(listener)

    def commit_ledger(self):
        return self._writer_thread.ledger

    def sync(self):
        return self._writer_thread.sync()

    def close(self):
        """Commit what is buffered (fsynced unless the policy is none), stop the writer
        thread and close the files."""
        return self._writer_thread.close()

    def commit_times(self):
        return self._writer_thread.commit_times()

    def watch_commit_starts(self, listener):
        self._writer_thread.start_listeners.append(listener)

    # -- topology

    def topology(self):
        return self._topology.records()

    def save_exchange(self, record):
        self._topology.save_exchange(record)

    def delete_exchange(self, vhost, name):
        self._topology.delete_exchange(vhost, name)

    def save_binding(self, record):
        self._topology.save_binding(record)

    def delete_binding(self, record):
        self._topology.delete_binding(record)

    def save_queue(self, record):
        self._topology.save_queue(record)

    def delete_queue(self, queue):
        """Forget a queue, its bindings and messages; its file (damaged or not) is removed."""
        self._topology.delete_queue(queue)
        batch = self._batch
        unwritten = batch.appends.pop(queue, ())
        batch.acks.pop(queue, None)
        batch.returns.pop(queue, None)
        batch.damaged.pop(queue, None)
        batch.deleted.append(queue)
        for handle in unwritten:
            self._drop_if_unwritten(handle)
        self._damaged.pop(queue, None)
        self._recovered.pop(queue, None)
        self._recovered_counts.pop(queue, None)
        self._reads.forget(queue)

    # -- messages

    def append(self, message, queues):
        damaged = self._damaged
        if len(queues) == 1:
            queue = queues[0]
            if damaged and queue in damaged:
                self._check_available(queue)
            route = self._routes.single(queue)
        else:
            if damaged:
                for queue in queues:
                    if queue in damaged:
                        self._check_available(queue)
            route = self._routes.number(tuple(queues))
        handle = self._next_sequence << ROUTE_BITS | route
        self._next_sequence += 1
        batch = self._batch
        head, body = encode(message, self._heads)
        batch.records[handle] = (head, body, message)
        appends = batch.appends
        for queue in queues:
            pending = appends.get(queue)
            if pending is None:
                appends[queue] = {handle: None}
            else:
                pending[handle] = None
        self._appends += 1
        return handle

    def ack(self, queue, handle):
        if self._kept_in_place and handle in self._kept_in_place:
            return  # an unparsable record stays in its file, to be found again
        self._acks += 1
        batch = self._batch
        if batch.returns:
            returns = batch.returns.get(queue)
            if returns:
                returns.pop(handle, None)
        pending = batch.appends.get(queue)
        if pending is not None and handle in pending:
            del pending[handle]  # never written to this queue's file
            self._drop_if_unwritten(handle)
            return
        acks = batch.acks.get(queue)
        if acks is None:
            batch.acks[queue] = [handle]
        else:
            acks.append(handle)

    def _drop_if_unwritten(self, handle):
        """Forget the buffered record of C{handle} once no queue's buffered appends hold it."""
        appends = self._batch.appends
        queues = self._routes.queues(handle)
        candidates = appends if queues is None else queues
        if any(handle in appends.get(queue, ()) for queue in candidates):
            return
        self._batch.records.pop(handle, None)

    def purge(self, queue, handles):
        for handle in handles:
            self.ack(queue, handle)

    def returned(self, queue, handle, count):
        """Buffered: the writer appends one record of the queue's new counts to its file."""
        returns = self._batch.returns.get(queue)
        if returns is None:
            self._batch.returns[queue] = {handle: count}
        else:
            returns[handle] = count

    def load(self, handle):
        """
        The message of C{handle}, at once: the object appended while it is
        not written yet, else read back from a file that holds it.

        @raise KeyError: if the handle names no stored message.
        @raise StoreCorrupted: if its record is damaged; its queue is then
            unavailable (appends refused, its file left as it is).
        @raise UnreadableMessage: if its record is whole but does not parse;
            the record stays in its file (acks of it are ignored), so a
            restart finds it again.
        """
        record = self._batch.records.get(handle)
        if record is None:
            for batch in self._in_flight:
                record = batch.records.get(handle)
                if record is not None:
                    return record[2]
            if self._writer_thread.state != "open":
                raise KeyError(f"the filelog store is not open; cannot read {handle!r}")
            try:
                return self._reads.load(handle)
            except UnreadableMessage:
                self._kept_in_place.add(handle)
                raise
            except StoreCorrupted as damage:
                self._found_damage(damage.queue, damage)
                raise
        return record[2]

    def _found_damage(self, queue, damage):
        """A record of C{queue}'s file read back damaged: the queue is unavailable, its file left
        alone."""
        log.error("queue {queue!r} in vhost {vhost!r} is unavailable: {damage}",
                  queue=queue[1], vhost=queue[0], damage=damage)
        self._damaged[queue] = damage
        batch = self._batch
        batch.damaged[queue] = damage
        for handle in batch.appends.pop(queue, ()):
            self._drop_if_unwritten(handle)
        batch.acks.pop(queue, None)
        batch.returns.pop(queue, None)
        self._reads.forget(queue)

    def read(self, handle):
        if self._writer_thread.state != "open":
            return defer.fail(RuntimeError("the filelog store is not open"))
        try:
            return defer.succeed(record_of(self.load(handle)))
        except (KeyError, StoreCorrupted):
            return defer.fail()
        except TypeError:
            return defer.fail(KeyError(f"{handle!r} is not a filelog store handle"))

    # -- delayed messages

    def delay(self, message, exchange, due):
        check_due(due)
        exchange = check_exchange(exchange)
        if self._delayed_damage is not None:
            damage = self._delayed_damage
            raise StoreCorrupted(f"delayed messages are unavailable: {damage}", damage.path,
                                 damage.offset)
        handle = self._lease.take()
        head, body = encode_delayed(message, exchange, due, handle)
        self._batch.delays[handle] = (due, exchange, head, body)
        self._delayed.add(handle)
        return handle

    def release(self, handle):
        if type(handle) is not int or handle < 0 or self._delayed.pop(handle) is None:
            return
        delays = self._batch.delays
        if handle in delays:
            del delays[handle]  # never written
        else:
            self._batch.delay_releases.append(handle)

    def delayed_after(self, cursor, until, limit):
        if self._writer_thread.state != "open":
            return defer.fail(RuntimeError("the filelog store is not open"))
        damage = self._delayed_damage
        if damage is not None:
            return defer.fail(StoreCorrupted(f"delayed messages are unavailable: {damage}",
                                             damage.path, damage.offset))

        def fetch(position, bound, count):
            return self._writer_thread.call(self._writer.delayed_window, position, bound, count)

        pending = [(due, handle, exchange, (head, body)) for handle, (due, exchange, head, body)
                   in self._batch.delays.items()]
        rows = delayed_window(fetch, pending, self._delayed.__contains__, cursor, until, limit)
        return rows.addCallback(self._delayed_messages, cursor, until, limit)

    def _delayed_messages(self, rows, cursor, until, limit):
        """
        The window's DelayedMessages. One whose record does not parse is
        quarantined: logged, no longer counted as kept (so the window asked
        for again leaves it out), and kept in the log as it is.
        """
        found, quarantined = readable_messages(rows, self._delayed_message,
                                               self._quarantine_delayed)
        if quarantined:
            return self.delayed_after(cursor, until, limit)
        return found

    @staticmethod
    def _delayed_message(row):
        due, handle, exchange, record = row
        # Not written yet: still encoded as (head, body), not a MessageRecord.
        if type(record) is tuple:
            record = decode_delayed(b"".join(record))[3]
        if isinstance(record, UnreadableMessage):
            raise record
        return DelayedMessage(due, handle, exchange, record)

    def _quarantine_delayed(self, row, problem):
        due, handle, (vhost, exchange), _ = row
        log.error("delayed message {handle} for exchange {exchange!r} in vhost {vhost!r}"
                  " (due {due}) is quarantined, not routed, and kept in the delayed log as it is:"
                  " {problem}",
                  handle=handle, exchange=exchange, vhost=vhost, due=due, problem=problem)
        self._delayed.pop(handle)

    # -- commits

    def _take_batch(self):
        """Called by GroupCommit on the reactor thread: hand over what is buffered."""
        batch = self._batch
        batch.delay_lease = self._lease.persist()
        topology = self._topology.take_changes()
        if topology is not None:
            batch.topology = topology
        elif batch.is_empty():
            return None
        self._batch = Batch()
        if batch.records:
            self._in_flight.append(batch)
        return batch

    def _batch_written(self, written):
        """
        Called by GroupCommit on the reactor thread with a commit's
        L{BatchWritten}, before the syncs it covers fire: read what it wrote
        from the files from now on. What it says of a queue deleted or found
        damaged since it was taken is stale, and dropped.
        """
        self._figures = written.figures
        gone = self._batch.deleted
        for queue, update in written.files.items():
            if queue in self._damaged or queue in gone:
                if update.descriptor is not None:
                    os.close(update.descriptor)
                continue
            self._reads.take(queue, update)
        self._in_flight = []

    def _close_files(self):
        self._reads.close()
        self._in_flight = []
        self._writer.close()

    def stats(self):
        figures, reads = self._figures, self._reads
        return {
            **self._topology.figures(),
            **self._writer_thread.figures(),
            "messages": figures.held,
            "bytes": figures.held_bytes,
            "appends": self._appends,
            "acks": self._acks,
            "compactions": figures.compactions,
            "file_bytes": figures.file_bytes,
            "file_writes": figures.writes,
            "file_syncs": figures.syncs,
            "file_reads": reads.records_read,
            "file_read_calls": reads.read_calls,
            "cache_bytes": reads.cache_bytes,
            "delayed": len(self._delayed),
        }
