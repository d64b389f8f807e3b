"""What the chunked store's writer thread does to its files (L{ChunkedWriter}):
recovery at open, each commit's batch, the windows of delayed messages.

Only the store's writer thread (its L{GroupCommit<brokerd.storage.durability.GroupCommit>}'s)
calls a L{ChunkedWriter} or reads its state. What the reactor thread needs to
know comes back as values (L{backends.chunked.handover}): a L{Recovery} from
C{open}, a L{BatchWritten} from each C{write_batch}. Under its directory: a
lock file, the topology file, the message log's chunks
(L{backends.chunked.messagelog}), under ``queues/`` one queue index per durable
queue (L{backends.chunked.queueindexset}), under ``delayed/`` the index of
delayed messages (L{backends.chunked.delayedindex}), whose records are in the
log too, and the moves file of compaction (L{backends.chunked.movesfile}).

The writer decides when a message chunk goes: it counts, per chunk, the
un-acked queue entries and the kept delayed messages that point into it
(L{backends.chunked.references}), and once a finished chunk's count is zero
(and the retention options let it go) the chunk file is deleted, after the
acks and releases that freed it are durable. A finished chunk that stays
sparse (few held bytes) is compacted (L{backends.chunked.compaction}): its
held records are copied to the head of the log and the pairs (handle, new
position) kept in the moves file, so the chunk counts as consumed.

A commit writes, in this order: the topology, removed queues, records
(copies included), index entries, returns and acks; the fsync of the log
(forced when the batch moves records) and of the indexes; the moves record;
checkpoints and deleted chunks (the moves file fsynced first, whatever the
sync policy); then it picks the next slice of a compaction.
"""

import os

from twisted.logger import Logger

from backends.chunked.compaction import Compactor
from backends.chunked.delayedindex import ChunkedDelayedIndex
from backends.chunked.handover import BatchWritten, Recovery
from backends.chunked.messagelog import MessageLog
from backends.chunked.movesfile import MovesFile
from backends.chunked.queueindexset import QueueIndexSet
from backends.chunked.references import ChunkReferences, Held
from backends.common.fileio import TEMPORARY_SUFFIX, lock_directory, replace_file
from backends.common.quarantine import keep_aside
from backends.common.topology_file import TOPOLOGY_FILE, read_topology
from brokerd.interfaces import StoreCorrupted

log = Logger()

LOCK_FILE = "lock"
TOPOLOGY_MAGIC = b"brokerd chunked topology 1\n"


class ChunkedWriter:
    """
    The message log, the queue indexes, the delayed index, the moves file
    and the topology file of one directory, on the writer thread.

    @ivar log: the L{MessageLog}.
    @ivar delayed: the L{ChunkedDelayedIndex}.
    @ivar moves_file: the L{MovesFile}, with the pairs of moved messages held.
    @ivar compactor: the L{Compactor}.
    """

    def __init__(self, directory, data_size, entries_per_chunk, retain_chunks=0,
                 retain_seconds=0.0, delayed_bucket_ms=60_000, delayed_flush_entries=1 << 16,
                 compact_below=0.25, compact_bytes=256 << 10, compact_quiet=5.0):
        self.directory = directory
        self.topology_path = os.path.join(directory, TOPOLOGY_FILE)
        self.log = MessageLog(directory, data_size)
        self.delayed = ChunkedDelayedIndex(directory, delayed_bucket_ms, delayed_flush_entries)
        self.moves_file = MovesFile(directory)
        self._indexes = QueueIndexSet(directory, entries_per_chunk)
        self._references = ChunkReferences(self.log, retain_chunks, retain_seconds)
        self._held = Held()
        self.compactor = Compactor(self.log, self._references, self.moves_file, self._indexes,
                                   self._held, compact_below, compact_bytes, compact_quiet)
        self._lock = None

    def _knows_every_reference(self):
        """
        Whether records may be moved or chunks deleted: not while a damaged
        queue index or delayed index, or the index of a quarantined queue
        whose name cannot be read, may point anywhere.
        """
        return self._indexes.complete and not self.delayed.damaged

    # -- open

    def open(self):
        """
        Take the directory and read it back: chunk headers and the last chunk,
        the moves file, the topology, each durable queue's index from its
        mark, the delayed index.

        @raise StoreCorrupted: if the topology file or the message log is damaged.
        @raise DirectoryInUse: if another open store holds the directory.
        """
        self._indexes.make_directory()
        self._lock = lock_directory(os.path.join(self.directory, LOCK_FILE), "chunked")
        for name in os.listdir(self.directory):
            if name.endswith(TEMPORARY_SUFFIX):
                os.unlink(os.path.join(self.directory, name))
        self.log.open()
        self.moves_file.open(self.log)
        topology = read_topology(self.topology_path, TOPOLOGY_MAGIC)
        unacked, damaged, delivery_counts = self._indexes.recover(topology, self.log.write_position,
                                                                 self._count_entries)
        self._held.count(self._indexes.values())
        if self._indexes.complete:  # else any index may hold any moved message
            self.moves_file.forget_unheld(self._indexes.values())
        delayed = self.delayed.open(self.log.write_position, self.log.data_size,
                                    self.log.chunks.__contains__)
        for number, count in delayed.references.items():
            if count:
                self._references.add_delayed(number, count)
        for number in list(self.log.chunks):
            self._references.note_if_consumed(number)
        self._delete_consumed()
        self.log.take_changes()
        written = self._written(dict.fromkeys(self.log.chunks, (0, 0)), ())
        return Recovery(topology, unacked, damaged, self.log.write_position, self.log.data_size,
                        delayed, delivery_counts, written, dict(self.moves_file.pairs))

    def _count_entries(self, queue, index):
        """
        Count a recovered index's un-acked entries in the chunks they point into.

        @raise StoreCorrupted: if one of those chunks is missing.
        """
        counts = index.unacked_positions_by_chunk(self.log.data_size, self.moves_file.pairs)
        missing = sorted(number for number in counts if number not in self.log.chunks)
        if missing:
            path = self.log.path_of(missing[0])
            raise StoreCorrupted(
                f"queue {queue!r} holds {counts[missing[0]]} un-acked messages in message chunk"
                f" {path}, which is missing", path,
            )
        for number, count in counts.items():
            self._references.add(number, count)

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
                        self._held.add(handle, queues, sizes[handle])
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
                self.compactor.look_again()  # a chunk may have turned sparse
            if batch.delays or batch.delay_releases or batch.delayed_meta is not None:
                self._delayed(batch, fsync)
        moves, dropped = (batch.moves, batch.slice_dropped) if batch is not None else (None, False)
        self.log.sync(fsync or bool(moves))  # copies are durable before any pair names them
        self._indexes.sync(fsync)
        self.delayed.sync(fsync)
        moved = self.compactor.apply_moves(moves or (), dropped)
        if batch is not None:
            self.delayed.flush_if_due()  # what it flushes points into log records already durable
            self._indexes.checkpoint_if_due({*batch.acks, *batch.returns}, fsync)
            self._delete_consumed()
            if fsync and self.moves_file.written_pairs:
                self.moves_file.rewrite_if_due()  # the acks that made pairs stale are durable
        compaction = self.compactor.next_slice() if self._knows_every_reference() else ()
        deleted, figures = self.log.take_changes()
        return self._written(figures, deleted, moved, compaction)

    def _written(self, chunk_figures, deleted_chunks, moved=None, compaction=()):
        held, compactor = self._held, self.compactor
        return BatchWritten(self.log.write_position, self.log.flushed_position, deleted_chunks,
                            chunk_figures, held.messages, held.bytes, self.delayed.flushes,
                            moved or {}, self.moves_file.take_unmoved(), compaction,
                            compactor.compacted_chunks, compactor.compacted_bytes,
                            compactor.due_in)

    def _append(self, queue, handles, sizes, shared):
        index = self._indexes.get(queue)
        if index is None:
            index = self._indexes.create(queue)
        lengths = [sizes[handle] for handle in handles]
        index.append(handles, lengths)
        self._references.add_entries(handles)
        held = self._held
        for handle, size in zip(handles, lengths):
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
        """The rows of L{ChunkedDelayedIndex.window}, each followed by its record's head and
        body."""
        rows = self.delayed.window(cursor, until, limit)
        records = self.log.read_records([position for _, _, position, _ in rows])
        return [(*row, head, body) for row, (head, body) in zip(rows, records)]

    def _delayed(self, batch, fsync):
        """Index the batch's delays (their records are written) and releases; count their chunks."""
        references, data_size = self._references, self.log.data_size
        for _, _, position, _ in batch.delays:
            references.add_delayed(position // data_size)
        self.delayed.write(batch.delayed_meta, batch.delays, batch.delay_releases, fsync)
        for _, _, number in batch.delay_releases:
            references.release_delayed(number)

    def _release(self, handle, size):
        """One queue let C{handle} (of C{size} body bytes) go."""
        moves = self.moves_file.pairs
        number = (moves.get(handle, handle) if moves else handle) // self.log.data_size
        if self._held.release(handle, size) and (moves or self.compactor.moving):
            self._forget_moved(handle)
        self._references.release(number)

    def _release_run(self, handles, sizes):
        """
        L{_release} for a run of handles in log order that one queue let go.
        When none is held by another queue or moved by compaction, the counts
        change once per chunk instead of once per message.
        """
        held = self._held
        if self.moves_file.pairs or self.compactor.moving or held.shared:
            for handle, size in zip(handles, sizes):
                self._release(handle, size)
            return
        held.release_unshared(len(handles), sum(sizes))
        self._references.release_run(handles)

    def _forget_moved(self, handle):
        """No queue holds C{handle} any more: drop its pair, and it from a compaction under way."""
        self.moves_file.forget(handle)
        self.compactor.let_go(handle)

    def _delete_queue(self, queue):
        index = self._indexes.remove(queue)
        if index is not None:
            for handle, size in zip(index.unacked(), index.unacked_sizes()):
                self._release(handle, size)
            self._indexes.deleted(index)

    def _delete_consumed(self):
        """Delete the consumed chunks the retention options do not keep."""
        for number in self.log.take_finished():
            self._references.note_if_consumed(number)
            self.compactor.look_again()
        if not self._knows_every_reference():
            # A damaged queue index or delayed index, or the index of a quarantined queue whose name
            # cannot be read, may still point into any chunk: keep them all until the damaged data
            # is dropped or repaired by hand.
            return
        for number in self._references.to_delete():
            self.moves_file.sync()  # the moves that emptied it are durable before it goes
            self.log.delete(number)
            self._references.deleted(number)

    # -- the end

    def close(self):
        """Write final checkpoints, close every file and give up the lock."""
        self._indexes.close()
        self.delayed.close()
        self.moves_file.sync()
        self.moves_file.close()
        self.log.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
