"""Everything a chunked store keeps on disk, as its writer thread works on it.

Only the store's writer thread (L{brokerd.storage.durability.GroupCommit}'s) calls a
L{ChunkedFiles} or reads its state: recovery at open, each commit's batch.
What the reactor thread needs to know comes back as values: a L{Recovery}
from C{open}, a L{BatchWritten} from each C{write_batch}. Under its directory:
a lock file, the topology file, the message log's chunks, under ``queues/``
one L{QueueIndex} directory per durable queue and, under ``delayed/``, the
index of delayed messages (L{ChunkedDelayedIndex}), whose records are in the log too.

It also decides when a message chunk goes: it counts, per chunk, the un-acked
queue entries and the kept delayed messages that point into it, and once a
finished chunk's count is zero (and the retention options let it go) the
chunk file is deleted, after the acks and releases that freed it are durable.
A finished chunk that stays sparse (few held bytes) is compacted
(L{backends.chunked.compaction}): its held records are copied to the head
of the log and the pairs (handle, new position) kept in the moves file
(L{backends.chunked.moves}), so the chunk counts as consumed. A commit
writes, in this order: the topology, removed queues, records (copies
included), index entries, returns and acks; the fsync of the log (forced
when the batch moves records) and of the indexes; the moves record;
checkpoints and deleted chunks (the moves file fsynced first, whatever the
sync policy); then it picks the next slice of a compaction.
"""

import os
import shutil
import time
from collections import Counter
from typing import NamedTuple

from twisted.logger import Logger

from backends.chunked.compaction import Compactor, Held
from backends.chunked.delayedindex import ChunkedDelayedIndex
from backends.chunked.messagelog import MessageLog
from backends.chunked.moves import MovesFile
from backends.chunked.queueindex import QueueIndex, creation_cut_short
from backends.common.fileio import TEMPORARY_SUFFIX, fsync_directory, lock_directory, queue_key_name, replace_file
from backends.common.quarantine import keep_aside
from backends.common.topology_file import TOPOLOGY_FILE, kept_queue_names, read_topology
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2

log = Logger()

LOCK_FILE = "lock"
QUEUES = "queues"
TOPOLOGY_MAGIC = b"brokerd chunked topology 1\n"


class Batch:
    """
    What the reactor thread buffered since the last commit, shaped for the
    writer: the reactor's until the store's C{_take_batch} hands it over, the
    writer thread's from then on (the reactor only reads its C{messages}
    until the records are in the files).
    """

    __slots__ = ("records", "messages", "appends", "acks", "returns", "shared", "deleted", "topology", "end",
                 "delays", "delay_releases", "delayed_meta", "kept_aside", "moves", "slice_dropped")

    def __init__(self):
        self.records = []  # (position, head, body), in position order
        self.messages = {}  # handle -> message, for reads until the records are written
        self.appends = {}  # queue key -> [handle], in queue order
        self.acks = {}  # queue key -> [handle]
        self.returns = {}  # queue key -> {handle: delivery count}
        self.shared = {}  # handle -> number of queues, for messages appended to more than one
        self.deleted = []  # queue keys whose indexes go before this batch's appends
        self.topology = None  # the new topology file's contents, if it changed
        self.end = 0  # the log position after this batch's last record
        self.delays = []  # (due, delayed handle, position, exchange number), in handle order
        self.delay_releases = []  # (delayed handle, due, chunk number)
        self.delayed_meta = None  # the delayed index's new Meta, if it changed
        self.kept_aside = {}  # quarantine file name -> (head, body) of a record that does not parse
        self.moves = []  # (handle, position) of the copies among the records, made by compaction
        self.slice_dropped = False  # the last compaction slice handed back could not be read

    def is_empty(self):
        return not (self.records or self.acks or self.returns or self.deleted or self.delay_releases
                    or self.delayed_meta or self.kept_aside or self.slice_dropped)


class BatchWritten(NamedTuple):
    """
    What the files are like after a commit, for the reactor thread: handed
    back through the group commit, so the reactor never reads the writer's
    objects.
    """

    write_position: int  # records below it are in the chunk files, and may be read from them
    flushed_position: int  # records below it are fsynced too
    deleted_chunks: tuple  # message chunk numbers whose files were removed by this commit
    chunk_figures: dict  # chunk number -> (writes, bytes written), of the chunks created or written by it
    held_messages: int  # messages some queue holds
    held_bytes: int  # and their body bytes
    delayed_flushes: int  # flushes of the delayed index so far
    moved: dict = {}  # handle -> position, of records compaction moved in this commit
    unmoved: tuple = ()  # moved handles no queue holds any more: their pairs are forgotten
    compaction: tuple = ()  # (handle, position) of held records to copy to the head of the log
    compacted_chunks: int = 0  # chunks compacted so far
    compacted_bytes: int = 0  # and the bytes of records they moved
    compaction_due_in: float = 0.0  # seconds until a sparse chunk is quiet enough to compact (0: none waits)


class Recovery(NamedTuple):
    """What L{ChunkedFiles.open} found, for the store to answer C{topology} and C{recover}."""

    topology: list  # topology records in file order
    unacked: dict  # queue key -> handles of its un-acked entries (an array), in queue order
    damaged: dict  # queue key -> StoreCorrupted
    write_position: int
    data_size: int
    delayed: object = None  # the ChunkedDelayedRecovery of the delayed-message index
    delivery_counts: dict = {}  # queue key -> {handle: delivery count}, for messages that came back unacked
    written: BatchWritten = None  # the files as open leaves them: every chunk there is, with no writes yet
    moves: dict = {}  # handle -> position of the records compaction moved, for the messages held


class ChunkedFiles:
    """The message log, the queue indexes and the topology file of one directory."""

    def __init__(self, directory, data_size, entries_per_chunk, retain_chunks=0, retain_seconds=0.0,
                 delayed_bucket_ms=60_000, delayed_flush_entries=1 << 16, compact_below=0.25, compact_bytes=256 << 10,
                 compact_quiet=5.0):
        self.directory = directory
        self.entries_per_chunk = entries_per_chunk
        self.retain_chunks = retain_chunks
        self.retain_seconds = retain_seconds
        self.log = MessageLog(directory, data_size)
        self.delayed = ChunkedDelayedIndex(directory, delayed_bucket_ms, delayed_flush_entries)
        self.held = Held()
        self.topology_path = os.path.join(directory, TOPOLOGY_FILE)
        self.queues_directory = os.path.join(directory, QUEUES)
        self._indexes = {}  # queue key -> QueueIndex
        self._references = {}  # message chunk number -> un-acked entries pointing into it
        self.delayed_references = {}  # message chunk number -> kept delayed messages in it (never compacted)
        self.moves = {}  # handle -> position of the record compaction moved it to, for messages held
        self._unmoved = []  # moved handles released since the last commit's result
        self.moves_file = MovesFile(directory)
        self.compactor = Compactor(self, compact_below, compact_bytes, compact_quiet)
        self._consumed = set()  # finished chunks no entry points into, kept for retention
        self._damaged = set()  # queues whose index could not be read: what they point to is unknown
        self._kept_queues = set()  # queues whose topology records are quarantined: their indexes are kept
        self._unnamed_kept_queue = False  # a quarantined queue record's name could not be read
        self._lock = None

    def index_directory(self, queue):
        return os.path.join(self.queues_directory, queue_key_name(queue))

    @property
    def chunk_references(self):
        """Message chunk number -> un-acked entries and kept delayed messages pointing into it."""
        return self._references

    @property
    def queue_indexes(self):
        """Queue key -> L{QueueIndex}, of every queue whose index was read."""
        return self._indexes

    def compactable(self):
        """
        Whether records may be moved: not while a damaged queue index or
        delayed index, or the index of a quarantined queue whose name cannot
        be read, may point anywhere (nothing is deleted then either).
        """
        return not (self._damaged or self.delayed.damaged or self._unnamed_kept_queue)

    # -- open

    def open(self):
        """
        Take the directory and read it back: chunk headers and the last chunk,
        the topology, each durable queue's index from its mark.

        @raise StoreCorrupted: if the topology file or the message log is damaged.
        @raise DirectoryInUse: if another open store holds the directory.
        """
        os.makedirs(self.queues_directory, exist_ok=True)
        self._lock = lock_directory(os.path.join(self.directory, LOCK_FILE), "chunked")
        for name in os.listdir(self.directory):
            if name.endswith(TEMPORARY_SUFFIX):
                os.unlink(os.path.join(self.directory, name))
        self.log.open()
        self._read_moves()
        topology = read_topology(self.topology_path, TOPOLOGY_MAGIC)
        queues = [(record.vhost, record.name) for record in topology if isinstance(record, messages_pb2.QueueRecord)]
        self._kept_queues, self._unnamed_kept_queue = kept_queue_names(topology)
        unacked, damaged, delivery_counts = {}, {}, {}
        # A quarantined queue's index is read too (it needs no topology record): its messages stay, and
        # so do the chunks they are in, until the queue is deleted.
        for queue in [*queues, *sorted(self._kept_queues - set(queues))]:
            try:
                unacked[queue] = self._recover(queue)
                if queue in self._indexes:
                    delivery_counts[queue] = self._indexes[queue].delivery_counts()
            except StoreCorrupted as damage:
                damaged[queue] = damage
                index = self._indexes.pop(queue, None)
                if index is not None:
                    index.close()
        self._damaged = set(damaged)
        self._remove_orphans(queues)
        self._count_held()
        delayed = self.delayed.open(self.log.write_position, self.log.data_size, self.log.chunks.__contains__)
        for number, count in delayed.references.items():
            if count:
                self._references[number] = self._references.get(number, 0) + count
                self.delayed_references[number] = count
        for number in list(self.log.chunks):
            self.note_if_consumed(number)
        self._delete_consumed()
        self.log.take_changes()
        return Recovery(topology, unacked, damaged, self.log.write_position, self.log.data_size, delayed,
                        delivery_counts, self._written(dict.fromkeys(self.log.chunks, (0, 0)), ()), dict(self.moves))

    def _read_moves(self):
        """The moves file's pairs whose records are there (the others' messages are read where they were)."""
        end, data_size, chunks = self.log.write_position, self.log.data_size, self.log.chunks
        self.moves.update((handle, position) for handle, position in self.moves_file.open().items()
                          if position < end and position // data_size in chunks)

    def _recover(self, queue):
        directory = self.index_directory(queue)
        if not os.path.isdir(directory):
            return []
        if creation_cut_short(directory):
            log.warn("queue index {path}: its creation was cut short by a crash; the queue starts empty", path=directory)
            shutil.rmtree(directory)
            return []
        index = QueueIndex(directory, queue, self.entries_per_chunk)
        self._indexes[queue] = index
        index.recover(self.log.write_position)
        counts = index.unacked_positions_by_chunk(self.log.data_size, self.moves)
        missing = sorted(number for number in counts if number not in self.log.chunks)
        if missing:
            path = self.log.path_of(missing[0])
            raise StoreCorrupted(
                f"queue {queue!r} holds {counts[missing[0]]} un-acked messages in message chunk {path}, which is"
                " missing", path,
            )
        for number, count in counts.items():
            self._references[number] = self._references.get(number, 0) + count
        return index.unacked()

    def _remove_orphans(self, queues):
        """
        Index directories of queues the topology no longer holds: a crash came
        between the two removals. Those of queues whose topology records are
        quarantined are kept, and all of them are if one such queue's name
        cannot be read.
        """
        expected = {queue_key_name(queue) for queue in [*queues, *self._kept_queues]}
        for name in sorted(os.listdir(self.queues_directory)):
            if name not in expected:
                path = os.path.join(self.queues_directory, name)
                if self._unnamed_kept_queue:
                    log.warn("queue index {path} belongs to no readable queue of the topology; kept, as it may be"
                             " the quarantined queue's whose name cannot be read", path=path)
                    continue
                log.warn("queue index {path} belongs to no queue of the topology; removed", path=path)
                shutil.rmtree(path, ignore_errors=True)

    def _count_held(self):
        """
        Messages held by more than one queue count once: find them without a
        set of every handle. The pairs of moved messages no queue holds are forgotten.
        """
        indexes = sorted(self._indexes.values(), key=lambda index: index.held)
        counts = {}
        for index in indexes[:-1]:
            for handle, size in zip(index.unacked(), index.unacked_sizes()):
                counts[handle] = (counts[handle][0] + 1, size) if handle in counts else (1, size)
        held = self.held
        if indexes and not counts:  # one queue holds messages: none is shared
            held.add_unshared(len(indexes[-1].unacked()), sum(indexes[-1].unacked_sizes()))
        elif indexes:
            for handle, size in zip(indexes[-1].unacked(), indexes[-1].unacked_sizes()):
                if handle in counts:
                    counts[handle] = (counts[handle][0] + 1, size)
                else:
                    held.add(handle, 1, size)
        for handle, (queues, size) in counts.items():
            held.add(handle, queues, size)
        if self.moves and not (self._damaged or self._unnamed_kept_queue):  # else any index may hold any
            indexes = self._indexes.values()
            for handle in [handle for handle in self.moves if all(index.held_size(handle) is None for index in indexes)]:
                del self.moves[handle]  # acked before the restart: its pair is forgotten

    # -- commits

    def write_batch(self, batch, fsync):
        """
        Apply one batch in the order that keeps a crash at any point
        recoverable: the topology, then removed queues, then records, index
        entries and acks; then make it durable; then checkpoints and deleted
        chunks, which only follow what is already durable.

        @return: a L{BatchWritten}.
        """
        if batch is not None:
            for name, parts in batch.kept_aside.items():
                path = keep_aside(self.directory, name, parts)
                log.info("kept a copy of a quarantined record in {path}", path=path)
            if batch.topology is not None:
                replace_file(self.topology_path, batch.topology, fsync)
            for queue in batch.deleted:
                self._delete_queue(queue)
            if batch.records:
                self.log.write(batch.records)
                sizes = {position: len(body) for position, _, body in batch.records}
                for queue, handles in batch.appends.items():
                    self._append(queue, handles, sizes, batch.shared)
                for handle, queues in batch.shared.items():
                    if queues:
                        self.held.add(handle, queues, sizes[handle])
            for queue, counts in batch.returns.items():
                index = self._indexes.get(queue)
                if index is not None:
                    for handle, count in counts.items():
                        index.returned(handle, count)
                    if queue not in batch.acks:
                        index.write_acks()
            for queue, handles in batch.acks.items():
                self._ack(queue, handles)
            if batch.acks or batch.deleted or batch.delay_releases:
                self.compactor.changed = True  # a chunk may have turned sparse
            if batch.delays or batch.delay_releases or batch.delayed_meta is not None:
                self._delayed(batch, fsync)
        moves, dropped = (batch.moves, batch.slice_dropped) if batch is not None else (None, False)
        self.log.sync(fsync or bool(moves))  # copies are durable before any pair names them
        for index in self._indexes.values():
            index.sync(fsync)
        self.delayed.sync(fsync)
        moved = self.compactor.apply_moves(moves or (), dropped)
        if batch is not None:
            self.delayed.flush_if_due()  # what it flushes points into log records already durable
            for queue in {*batch.acks, *batch.returns}:
                index = self._indexes.get(queue)
                if index is not None:
                    index.checkpoint_if_due(fsync)
            self._delete_consumed()
            if fsync and self.moves_file.written_pairs:
                self.moves_file.rewrite_if_due(self.moves)  # the acks that made pairs stale are durable
        compaction = self.compactor.next_slice()
        deleted, figures = self.log.take_changes()
        return self._written(figures, deleted, moved, compaction)

    def _written(self, chunk_figures, deleted_chunks, moved=None, compaction=()):
        held, compactor = self.held, self.compactor
        unmoved, self._unmoved = tuple(self._unmoved), []
        return BatchWritten(self.log.write_position, self.log.flushed_position, deleted_chunks, chunk_figures,
                            held.messages, held.bytes, self.delayed.flushes, moved or {}, unmoved, compaction,
                            compactor.compacted_chunks, compactor.compacted_bytes, compactor.due_in)

    def _append(self, queue, handles, sizes, shared):
        index = self._indexes.get(queue)
        if index is None:
            index = self._indexes[queue] = QueueIndex(self.index_directory(queue), queue, self.entries_per_chunk)
            index.create()
        lengths = [sizes[handle] for handle in handles]
        index.append(handles, lengths)
        references, data_size, held = self._references, self.log.data_size, self.held
        for handle, size in zip(handles, lengths):
            number = handle // data_size
            references[number] = references.get(number, 0) + 1
            if handle not in shared:
                held.add(handle, 1, size)

    def _ack(self, queue, handles):
        index = self._indexes.get(queue)
        if index is None:
            return
        sizes = index.ack_run(handles) if len(handles) > 1 else None
        if sizes is not None:
            self._release_run(handles, sizes)
        else:
            ack, release = index.ack, self._release
            for handle in handles:
                size = ack(handle)
                if size is not None:
                    release(handle, size)
        index.write_acks()

    def delayed_window(self, cursor, until, limit):
        """The rows of L{ChunkedDelayedIndex.window}, each followed by its record's head and body."""
        rows = self.delayed.window(cursor, until, limit)
        records = self.log.read_records([position for _, _, position, _ in rows])
        return [(*row, head, body) for row, (head, body) in zip(rows, records)]

    def _delayed(self, batch, fsync):
        """Index the batch's delays (their records are written) and releases; count their chunks."""
        references, delayed, data_size = self._references, self.delayed_references, self.log.data_size
        for _, _, position, _ in batch.delays:
            number = position // data_size
            references[number] = references.get(number, 0) + 1
            delayed[number] = delayed.get(number, 0) + 1
        self.delayed.write(batch.delayed_meta, batch.delays, batch.delay_releases, fsync)
        for _, _, number in batch.delay_releases:
            remaining = references[number] - 1
            references[number] = remaining
            delayed[number] = delayed.get(number, 0) - 1
            if remaining == 0:
                self.note_if_consumed(number)

    def _release(self, handle, size):
        moves, references = self.moves, self._references
        number = (moves.get(handle, handle) if moves else handle) // self.log.data_size
        remaining = references[number] - 1
        references[number] = remaining
        if self.held.release(handle, size) and (moves or self.compactor.moving):
            self._forget_moved(handle)
        if remaining == 0:
            self.note_if_consumed(number)

    def _release_run(self, handles, sizes):
        """L{_release} for a run of handles in log order that one queue let go: when no other queue holds them
        and compaction moves none, the counts change once per chunk, not once per message."""
        held = self.held
        if self.moves or self.compactor.moving or held.shared:
            for handle, size in zip(handles, sizes):
                self._release(handle, size)
            return
        held.messages -= len(handles)
        held.bytes -= sum(sizes)
        data_size, references = self.log.data_size, self._references
        first, last = handles[0] // data_size, handles[-1] // data_size
        counts = {first: len(handles)} if first == last else Counter(handle // data_size for handle in handles)
        for number, count in counts.items():
            remaining = references[number] - count
            references[number] = remaining
            if remaining == 0:
                self.note_if_consumed(number)

    def _forget_moved(self, handle):
        """No queue holds C{handle} any more: drop its pair, and it from a compaction under way."""
        if self.moves.pop(handle, None) is not None:
            self._unmoved.append(handle)
        self.compactor.moving.pop(handle, None)

    def _delete_queue(self, queue):
        self._damaged.discard(queue)
        index = self._indexes.pop(queue, None)
        if index is None:
            shutil.rmtree(self.index_directory(queue), ignore_errors=True)
            return
        for handle, size in zip(index.unacked(), index.unacked_sizes()):
            self._release(handle, size)
        index.delete()
        fsync_directory(self.queues_directory)

    # -- chunk cleanup

    def note_if_consumed(self, number):
        """Count finished chunk C{number} as consumed (to be deleted) if nothing points into it."""
        if self._references.get(number, 0) == 0 and self.log.deletable(number) and number in self.log.chunks:
            self._consumed.add(number)

    def _delete_consumed(self):
        """Delete the consumed chunks the retention options do not keep."""
        finished, self.log.finished = self.log.finished, []
        for number in finished:
            self.note_if_consumed(number)
            self.compactor.changed = True
        if not self._consumed or self._damaged or self.delayed.damaged or self._unnamed_kept_queue:
            # A damaged queue index or delayed index, or the index of a quarantined queue whose name
            # cannot be read, may still point into any chunk: keep them all until the damaged data is
            # dropped or repaired by hand.
            return
        newest_first = sorted(self._consumed, reverse=True)
        now = time.time()
        for rank, number in enumerate(newest_first):
            if self._references.get(number, 0) != 0:
                self._consumed.discard(number)
                continue
            kept_by_count = rank < self.retain_chunks
            kept_by_age = self.retain_seconds and now - self.log.completed_at(number) < self.retain_seconds
            if not (kept_by_count or kept_by_age):
                self.moves_file.sync()  # the moves that emptied it are durable before it goes
                self.log.delete(number)
                self._consumed.discard(number)
                self._references.pop(number, None)
                self.delayed_references.pop(number, None)

    # -- the end

    def close(self):
        """Write final checkpoints, close every file and give up the lock."""
        for index in self._indexes.values():
            index.checkpoint(True)
            index.close()
        self._indexes.clear()
        self.delayed.close()
        self.moves_file.sync()
        self.moves_file.close()
        self.log.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
