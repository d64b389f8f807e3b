"""L{FilelogStore}: the store contract over one append-only file per durable queue.

The reactor thread buffers every change in a L{Batch} and keeps what the
broker asks about (topology, which queues hold which handles, what open
recovered); L{GroupCommit} hands each batch to L{QueueFiles} on its writer
thread and decides when it is fsynced. Nothing here touches a file, nor the
writer's state: the file figures of stats() come back with each commit.

Delayed messages go to one more log (L{backends.filelog.delayedlog}); the
writer thread indexes it by due time, and the reactor thread keeps only which
handles are kept (a L{HandleMap}) and the delays not yet handed over.
"""

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from backends.delayedshared.reactorside import HandleLease, check_due, check_exchange, delayed_window, readable_messages
from backends.filelog.delayedlog import decode_delayed, encode_delayed
from backends.filelog.queuefile import FiguresNow
from backends.filelog.queuefiles import QueueFiles
from backends.filelog.records import decode, encode
from backends.filestore import FileStoreBase
from backends.handlemap import HandleMap
from backends.topologyfile import Topology
from brokerd.durability import SyncPolicy
from brokerd.interfaces import DelayedMessage, IDelayedMessageStore, IMessageStore, StoreCorrupted, UnreadableMessage

log = Logger()


class Batch:
    """
    What the reactor thread buffered since the last commit, shaped for the
    writer: an append acked before its commit is simply never written, and a
    deleted queue takes its buffered appends and acks with it, so the writer
    can apply removals, then appends, then acks.
    """

    __slots__ = ("records", "appends", "acks", "returns", "deleted", "topology", "delays", "delay_releases",
                 "delay_lease")

    def __init__(self):
        self.records = {}  # handle -> encoded StoredMessage, as (head, body)
        self.appends = {}  # queue key -> {handle: None}, in append order
        self.acks = {}  # queue key -> [handle], of records already handed to the writer
        self.returns = {}  # queue key -> {handle: delivery count}, the latest count of each
        self.deleted = []  # queue keys whose files go before this batch's appends
        self.topology = None  # the new topology file's contents, if it changed
        self.delays = {}  # delayed handle -> (due, exchange key, head, body), in handle order
        self.delay_releases = []  # delayed handles handed to the writer before, released since
        self.delay_lease = None  # the handle limit to persist, if it moved

    def is_empty(self):
        return not (self.records or self.acks or self.returns or self.deleted or self.delays or self.delay_releases
                    or self.delay_lease is not None)


@implementer(IMessageStore, IDelayedMessageStore)
class FilelogStore(FileStoreBase):
    """
    Keeps each durable queue's persistent messages in its own file, an ack
    being a one-byte flip of the record's valid flag, and the topology in a
    small file replaced whole on change.

    Handles are integers from one counter: one handle serves every queue a
    message was appended for, though each queue's file has its own copy of
    the record. After a restart each recovered copy has a handle of its own.
    """

    name = "filelog"
    durable = True

    def __init__(self, directory, sync_policy=None, compact_min_records=2000, compact_valid_ratio=0.5, *, reactor,
                 delayed_bucket_ms=60_000):
        self.directory = directory
        self.sync_policy = sync_policy or SyncPolicy()
        self.compact_min_records = compact_min_records
        self.compact_valid_ratio = compact_valid_ratio
        self._reactor = reactor
        self._files = QueueFiles(directory, compact_min_records, compact_valid_ratio, delayed_bucket_ms)
        self._topology = Topology()
        self._topology_changed = False
        self._batch = Batch()
        self._held = {}  # handle -> [body size, set of queue keys still holding it]
        self._queue_handles = {}  # queue key -> {handle: None}, in queue order
        self._recovered = {}  # handle -> MessageRecord that open found, while held
        self._recovered_counts = {}  # queue key -> {handle: delivery count} that open found
        self._damaged = {}  # queue key -> StoreCorrupted that open found
        self._next_handle = 1
        self._bytes = 0
        self._appends = 0
        self._acks = 0
        self._delayed = HandleMap()  # kept delayed handles
        self._lease = HandleLease()
        self._delayed_damage = None  # StoreCorrupted that open found in the delayed files
        self._figures = FiguresNow(0, 0, 0, 0)  # the files' figures as of the last commit

    def open(self):
        """
        Start the writer thread and read the files back on it. Fails with
        StoreCorrupted if the topology file is damaged (the broker cannot
        start without it), or DirectoryInUse if another open store has the
        directory; a damaged queue file only makes that queue's C{recover} fail.
        """
        return self._open(self._files.open, self._files.write_batch, self._take_in)

    def _take_in(self, recovery):
        """Keep what the writer thread's open found (its L{Recovery})."""
        self._topology = Topology(recovery.topology)
        self._damaged = dict(recovery.damaged)
        for queue in self._topology.queues:
            self._queue_handles.setdefault(queue, {})
        for queue, messages in recovery.messages.items():
            handles = self._queue_handles[queue]
            for handle, record in messages:
                handles[handle] = None
                self._held[handle] = [len(record.body), {queue}]
                self._recovered[handle] = record
                self._bytes += len(record.body)
        self._recovered_counts = dict(recovery.delivery_counts)
        self._next_handle = recovery.next_handle
        self._delayed = recovery.delayed.kept
        self._lease = HandleLease(recovery.delayed.next_handle)
        self._delayed_damage = recovery.delayed.damage
        self._figures = recovery.figures

    def recover(self, queue):
        """The messages open found for C{queue} and still held, each flagged as possibly delivered before."""
        damage = self._damaged.get(queue)
        if damage is not None:
            raise StoreCorrupted(str(damage), damage.path, damage.offset)
        recovered = self._recovered
        return [(handle, recovered[handle], True) for handle in self._queue_handles.get(queue, ()) if handle in recovered]

    # -- topology

    def save_queue(self, record):
        self._topology.save_queue(record)
        self._queue_handles.setdefault((record.vhost, record.name), {})
        self._topology_changed = True

    def delete_queue(self, queue):
        """Forget a queue, its bindings and messages; its file (damaged or not) is removed."""
        self._topology.delete_queue(queue)
        self._topology_changed = True
        for handle in self._queue_handles.pop(queue, ()):
            self._release(queue, handle)
        self._batch.appends.pop(queue, None)
        self._batch.acks.pop(queue, None)
        self._batch.returns.pop(queue, None)
        self._batch.deleted.append(queue)
        self._damaged.pop(queue, None)

    # -- messages

    def append(self, message, queues):
        for queue in queues:
            if queue in self._damaged:
                damage = self._damaged[queue]
                raise StoreCorrupted(f"queue {queue!r} is unavailable: {damage}", damage.path, damage.offset)
        handle = self._next_handle
        self._next_handle = handle + 1
        batch = self._batch
        batch.records[handle] = encode(message)
        for queue in queues:
            batch.appends.setdefault(queue, {})[handle] = None
            self._queue_handles.setdefault(queue, {})[handle] = None
        size = len(message.body)
        self._held[handle] = [size, set(queues)]
        self._bytes += size
        self._appends += 1
        return handle

    def ack(self, queue, handle):
        handles = self._queue_handles.get(queue)
        if handles is None or handle not in handles:
            return
        del handles[handle]
        self._acks += 1
        returns = self._batch.returns.get(queue)
        if returns:
            returns.pop(handle, None)
        buffered = self._batch.appends.get(queue)
        if buffered is not None and handle in buffered:
            del buffered[handle]  # never written to this queue's file
        else:
            self._batch.acks.setdefault(queue, []).append(handle)
        self._release(queue, handle)

    def purge(self, queue, handles):
        for handle in handles:
            self.ack(queue, handle)

    def returned(self, queue, handle, count):
        """Buffered: the writer appends one record of the queue's new counts to its file."""
        handles = self._queue_handles.get(queue)
        if handles is not None and handle in handles:
            self._batch.returns.setdefault(queue, {})[handle] = count

    def delivery_counts(self, queue):
        return dict(self._recovered_counts.get(queue, ()))

    def read(self, handle):
        held = self._held.get(handle)
        if held is None:
            return defer.fail(KeyError(f"the filelog store holds no message with handle {handle!r}"))
        buffered = self._batch.records.get(handle)
        if buffered is not None:
            return defer.succeed(decode(*buffered))
        recovered = self._recovered.get(handle)
        if recovered is not None:  # open read it whole and keeps it: no trip to the writer thread and the file
            return defer.succeed(recovered)
        if self._state != "open":
            return defer.fail(RuntimeError("the filelog store is not open"))
        return self._commit.call(self._files.read, handle, tuple(held[1]))

    def _release(self, queue, handle):
        """C{queue} no longer holds C{handle}; the message goes once no queue does."""
        held = self._held.get(handle)
        if held is None:
            return
        held[1].discard(queue)
        if not held[1]:
            del self._held[handle]
            self._bytes -= held[0]
            self._recovered.pop(handle, None)
            self._batch.records.pop(handle, None)

    # -- delayed messages

    def delay(self, message, exchange, due):
        check_due(due)
        exchange = check_exchange(exchange)
        if self._delayed_damage is not None:
            damage = self._delayed_damage
            raise StoreCorrupted(f"delayed messages are unavailable: {damage}", damage.path, damage.offset)
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
        if self._state != "open":
            return defer.fail(RuntimeError("the filelog store is not open"))
        if self._delayed_damage is not None:
            return defer.fail(StoreCorrupted(f"delayed messages are unavailable: {self._delayed_damage}",
                                             self._delayed_damage.path, self._delayed_damage.offset))

        def fetch(position, bound, count):
            return self._commit.call(self._files.delayed.window, position, bound, count)

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
        found, quarantined = readable_messages(rows, self._delayed_message, self._quarantine_delayed)
        if quarantined:
            return self.delayed_after(cursor, until, limit)
        return found

    @staticmethod
    def _delayed_message(row):
        due, handle, exchange, record = row
        if type(record) is tuple:  # not written yet: still encoded as (head, body), not a MessageRecord
            record = decode_delayed(b"".join(record))[3]
        if isinstance(record, UnreadableMessage):
            raise record
        return DelayedMessage(due, handle, exchange, record)

    def _quarantine_delayed(self, row, problem):
        due, handle, (vhost, exchange), _ = row
        log.error("delayed message {handle} for exchange {exchange!r} in vhost {vhost!r} (due {due}) is quarantined,"
                  " not routed, and kept in the delayed log as it is: {problem}",
                  handle=handle, exchange=exchange, vhost=vhost, due=due, problem=problem)
        self._delayed.pop(handle)

    # -- commits

    def _take_batch(self):
        """Called by GroupCommit on the reactor thread: hand over what is buffered."""
        batch = self._batch
        batch.delay_lease = self._lease.persist()
        if self._topology_changed:
            batch.topology = self._topology.encode()
            self._topology_changed = False
        elif batch.is_empty():
            return None
        self._batch = Batch()
        return batch

    def _batch_written(self, figures):
        """Called by GroupCommit on the reactor thread with the L{FiguresNow} a commit handed back."""
        self._figures = figures

    def _close_files(self):
        self._files.close()

    def stats(self):
        figures = self._figures
        return {
            **self._common_stats(),
            "messages": len(self._held),
            "bytes": self._bytes,
            "appends": self._appends,
            "acks": self._acks,
            "compactions": figures.compactions,
            "file_bytes": figures.file_bytes,
            "file_writes": figures.writes,
            "file_syncs": figures.syncs,
            "delayed": len(self._delayed),
        }
