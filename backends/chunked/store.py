"""L{ChunkedStore}: the store contract over EQueue's message log and queue indexes.

The reactor thread assigns every message its place in the log as it is
appended (its handle is that global position), buffers the change in a
L{Batch}, and reads messages back from the batches not yet written, the ring
cache or the chunk files (L{backends.chunked.reads}). The store's
L{WriterThread} hands each batch to the L{ChunkedWriter} on the writer thread,
its group commit deciding when it is fsynced. The two threads share no
mutable object: a batch belongs to the writer once taken, and each commit's
L{BatchWritten} comes back to the reactor thread, which learns from it how far
the files are written and which chunks are gone.

A queue's backlog need not live in Python memory: the store provides
L{IPagingStore}, so the broker keeps only handles for recovered messages and
for deep queues, and loads each message when it is delivered.

Sparse old chunks are compacted (L{backends.chunked.compaction}); the reactor
thread's part, a L{CompactionFollower}, has the held records a commit names
read, has the store place their copies at the head of the log and says where
a moved handle's record is from the pairs (handle, new position) that come back.

Delayed messages (L{IDelayedMessageStore}) are records of the log too; the
writer thread indexes them by due time (L{backends.chunked.delayedindex}).
The reactor thread keeps, per kept handle, its due time and chunk
(L{DelayedHandles}), and has the records of a window read on the writer thread.
"""

import os
from functools import partial

from google.protobuf.message import DecodeError
from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from backends.chunked.chunkfiles import bytes_on_disk, chunk_path
from backends.chunked.compaction import CompactionFollower
from backends.chunked.delayedhandles import DelayedHandles
from backends.chunked.format import decode_head, handle_of_message_id, message_id
from backends.chunked.handover import BatchWritten
from backends.chunked.readahead import ReadAhead
from backends.chunked.reads import ChunkReader, RingCache
from backends.chunked.pendingwrites import PendingWrites
from backends.chunked.writer import TOPOLOGY_MAGIC, ChunkedWriter
from backends.common.delayed_requests import (
    check_due,
    check_exchange,
    delayed_window,
    readable_messages,
)
from backends.common.message_record import loaded_records, record_of, record_of_stored
from backends.common.quarantine import QUARANTINE_DIRECTORY, RECORD_SUFFIX, unreadable_message
from backends.common.topology_file import DurableTopology
from backends.common.writer_thread import WriterThread, appends_in
from brokerd.interfaces import (
    DelayedMessage,
    ICommitFailures,
    IDelayedMessageStore,
    IPagingStore,
    ITimedCommits,
    StoreCorrupted,
)
from brokerd.storage.durability import SyncPolicy

log = Logger()


@implementer(IPagingStore, IDelayedMessageStore, ITimedCommits, ICommitFailures)
class ChunkedStore:
    """
    Keeps every persistent message once in a log of fixed-size chunks, and per
    durable queue an index of entries pointing into it plus an ack log.
    """

    name = "chunked"
    durable = True

    def __init__(self, directory, sync_policy=None, chunk_size=256 << 20,
                 index_chunk_entries=1 << 20, cache_size=64 << 20, retain_chunks=0,
                 retain_seconds=0.0, *, reactor, delayed_bucket_ms=60_000,
                 delayed_flush_entries=1 << 16, compact_below=0.25, compact_bytes=256 << 10,
                 compact_quiet=5.0, read_ahead=4 << 20):
        self.directory = directory
        self.sync_policy = sync_policy or SyncPolicy()
        self._writer_thread = WriterThread(self.name, self.sync_policy, reactor, self._take_batch,
                                           self._close_files, self._batch_written, appends_in)
        self._writer = ChunkedWriter(directory, chunk_size, index_chunk_entries, retain_chunks,
                                     retain_seconds, delayed_bucket_ms, delayed_flush_entries,
                                     compact_below, compact_bytes, compact_quiet)
        self._pending = PendingWrites(chunk_size)
        self._compaction = CompactionFollower(reactor, directory, self._writer_thread,
                                              self._pending.place_copies, self._pending.drop_slice)
        self._delays = DelayedHandles(delayed_bucket_ms)
        self._reader = ChunkReader(directory, chunk_size,
                                   ReadAhead(read_ahead, partial(chunk_path, directory))
                                   if read_ahead else None)
        self._cache = RingCache(cache_size)
        self._topology = DurableTopology(TOPOLOGY_MAGIC)
        # the last commit's result (the writer's figures)
        self._written = BatchWritten(0, 0, (), {}, 0, 0, 0)
        # chunk number -> (writes, bytes written), of every chunk file there is
        self._chunk_figures = {}
        self._recovered = {}  # queue key -> handles open found
        self._recovered_counts = {}  # queue key -> {handle: delivery count} open found
        self._damaged = {}  # queue key -> StoreCorrupted that open found
        self._appends = 0
        self._acks = 0

    @property
    def chunk_capacity(self):
        """The largest record a chunk holds: a message must fit in it with its head."""
        return self._pending.data_size

    def open(self):
        """
        Start the writer thread and read the directory back on it. Fails with
        StoreCorrupted if the topology file or a message chunk header is
        damaged, or DirectoryInUse if another open store has the directory; a
        damaged queue index only makes that queue's C{recover} fail.
        """
        return self._writer_thread.open(self._writer.open, self._writer.write_batch, self._take_in)

    def _take_in(self, recovery):
        """Keep what the writer thread's open found (its L{Recovery})."""
        self._topology.recovered(recovery.topology)
        self._damaged = dict(recovery.damaged)
        self._recovered = dict(recovery.unacked)
        self._recovered_counts = dict(recovery.delivery_counts)
        self._pending.recovered(recovery.write_position, recovery.data_size)
        self._reader.opened(recovery.data_size, recovery.write_position)
        self._written = recovery.written
        self._chunk_figures = dict(recovery.written.chunk_figures)
        self._compaction.recovered(recovery.moves, recovery.data_size)
        self._delays.recovered(recovery.delayed)

    def _check_available(self, queue):
        damage = self._damaged.get(queue)
        if damage is not None:
            raise StoreCorrupted(f"queue {queue!r} is unavailable: {damage}", damage.path,
                                 damage.offset)

    def recovered_handles(self, queue):
        """The handles of the messages open found for C{queue}, in order, all possibly delivered
        before."""
        self._check_available(queue)
        return self._recovered.get(queue, ())

    def delivery_counts(self, queue):
        return dict(self._recovered_counts.get(queue, ()))

    def recover(self, queue):
        """
        The messages open found for C{queue}, read one at a time as the result
        is iterated; one that cannot be read is quarantined (logged, kept
        aside) and left out.
        """
        return loaded_records(self.load, queue, self.recovered_handles(queue),
                              "its record is kept aside")

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
        """Forget a queue, its bindings and its index (damaged or not);
        its share of the log is released."""
        self._topology.delete_queue(queue)
        batch = self._pending.batch
        for handle in batch.appends.pop(queue, ()):
            if handle in batch.shared:
                batch.shared[handle] -= 1
        batch.acks.pop(queue, None)
        batch.returns.pop(queue, None)
        batch.deleted.append(queue)
        self._damaged.pop(queue, None)
        self._recovered.pop(queue, None)

    # -- messages

    def append(self, message, queues):
        for queue in queues:
            if queue in self._damaged:
                self._check_available(queue)
        pending = self._pending
        handle, head, body = pending.place(message)
        batch = pending.batch
        batch.records.append((handle, head, body))
        batch.messages[handle] = message
        appends = batch.appends
        for queue in queues:
            handles = appends.get(queue)
            if handles is None:
                appends[queue] = [handle]
            else:
                handles.append(handle)
        if len(queues) > 1:
            batch.shared[handle] = len(queues)
        self._cache.put(handle, head, body)
        self._appends += 1
        return handle

    def ack(self, queue, handle):
        batch = self._pending.batch
        acks = batch.acks.get(queue)
        if acks is None:
            batch.acks[queue] = [handle]
        else:
            acks.append(handle)
        self._acks += 1

    def returned(self, queue, handle, count):
        """Buffered: the writer adds the count to the queue's ack log after this batch's entries and
        acks."""
        batch = self._pending.batch
        returns = batch.returns.get(queue)
        if returns is None:
            batch.returns[queue] = {handle: count}
        else:
            returns[handle] = count

    def purge(self, queue, handles):
        self._pending.batch.acks.setdefault(queue, []).extend(handles)
        self._acks += len(handles)

    def load(self, handle):
        """
        The message of C{handle}, at once: from the batches not yet written,
        the ring cache or the chunk files.

        @raise KeyError: if the handle names no stored message.
        @raise StoreCorrupted: if its record is damaged.
        @raise UnreadableMessage: if its record is whole but does not parse;
            a copy of it is written to the store's quarantine directory with
            the next commit, before the acks that let its chunk go.
        """
        message = self._pending.message(handle)
        if message is None:
            record = self._cache.get(handle)
            position = handle
            try:
                if record is not None:
                    message = self._reader.message(*record)
                else:
                    if self._writer_thread.state != "open":
                        raise KeyError(f"the chunked store is not open; cannot read {handle!r}")
                    moves = self._compaction.moves
                    if moves:
                        position = moves.get(handle, handle)
                    message = self._reader.read(position)
            except DecodeError as problem:
                raise self._keep_aside(handle, position, record, problem) from None
        return message

    def _keep_aside(self, handle, position, record, problem):
        """Buffer a copy of an unparsable record for the quarantine directory;
        the UnreadableMessage to raise."""
        where = self._reader.where(position)
        name = f"message-{handle}"
        if record is None:
            record = self._reader.record(position)
        self._pending.batch.kept_aside[name] = record
        copy = os.path.join(self.directory, QUARANTINE_DIRECTORY, name + RECORD_SUFFIX)
        return unreadable_message(f"{where} (copied to {copy})", problem)

    def read(self, handle):
        try:
            return defer.succeed(record_of(self.load(handle)))
        except (KeyError, StoreCorrupted):
            return defer.fail()
        except TypeError:
            return defer.fail(KeyError(f"{handle!r} is not a chunked store handle"))

    def message_id(self, handle):
        """The id of a stored message, which encodes its global position in the log."""
        return message_id(handle)

    def lookup(self, text):
        """Read the message a L{message_id} names without consuming it:
        a Deferred firing with its MessageRecord."""
        try:
            handle = handle_of_message_id(text)
            return defer.succeed(record_of(self.load(handle)))
        except (ValueError, KeyError):
            return defer.fail()
        except StoreCorrupted as problem:
            # An id made up by hand may point anywhere: no record there is no message, not damage.
            return defer.fail(KeyError(f"no message has id {text!r}: {problem}"))

    # -- delayed messages

    def delay(self, message, exchange, due):
        check_due(due)
        exchange = check_exchange(exchange)
        delays = self._delays
        if delays.damage is not None:
            raise delays.unavailable()
        number = delays.exchange_number(exchange)
        pending = self._pending
        position, head, body = pending.place(message)
        handle = delays.keep(due, position // pending.data_size)
        batch = pending.batch
        batch.records.append((position, head, body))
        batch.messages[position] = message
        batch.delays.append((due, handle, position, number))
        # Not put in the ring cache: it is read back once due, long after the queues' recent
        # messages.
        return handle

    def release(self, handle):
        if type(handle) is not int or handle < 0:
            return
        values = self._delays.release(handle)
        if values is not None:
            self._pending.batch.delay_releases.append((handle, *values))

    def delayed_after(self, cursor, until, limit):
        if self._writer_thread.state != "open":
            return defer.fail(RuntimeError("the chunked store is not open"))
        if self._delays.damage is not None:
            return defer.fail(self._delays.unavailable())

        def fetch(position, bound, count):
            # The writer thread reads the records too: the reactor thread never waits for the disk
            # here.
            return self._writer_thread.call(self._writer.delayed_window, position, bound, count)

        pending = list(self._pending.batch.delays)
        rows = delayed_window(fetch, pending, self._delays.is_kept, cursor, until, limit)
        return rows.addCallbacks(self._delayed_messages, self._delayed_failed,
                                 (cursor, until, limit))

    def _delayed_messages(self, rows, cursor, until, limit):
        """
        DelayedMessages of rows read with their records by the writer, or of
        delays not yet handed to it. A record that does not parse is kept
        aside and released, and the window is asked for again without it.
        """
        found, quarantined = readable_messages(rows, self._delayed_message,
                                               self._quarantine_delayed)
        if quarantined:
            return self.delayed_after(cursor, until, limit)
        return found

    def _delayed_message(self, row):
        due, handle, position, number = row[:4]
        if len(row) > 4:
            try:
                record = record_of_stored(decode_head(row[4]), row[5])
            except DecodeError as problem:
                raise self._keep_aside(position, position, row[4:6], problem) from None
        else:
            record = record_of(self.load(position))
        return DelayedMessage(due, handle, self._delays.exchange(number), record)

    def _quarantine_delayed(self, row, problem):
        due, handle, _, number = row[:4]
        vhost, exchange = self._delays.exchange(number)
        log.error("delayed message {handle} for exchange {exchange!r} in vhost {vhost!r}"
                  " (due {due}) is quarantined, not routed: {problem}",
                  handle=handle, exchange=exchange, vhost=vhost, due=due, problem=problem)
        self.release(handle)

    def _delayed_failed(self, failure):
        if failure.check(StoreCorrupted):
            self._delays.found_damage(failure.value)  # found in a bucket file while the store runs
        return failure

    # -- commits

    def _take_batch(self):
        """Called by GroupCommit on the reactor thread: hand over what is buffered
        (the writer's from now on)."""
        return self._pending.take(self._delays.meta(), self._topology.take_changes())

    def _batch_written(self, written):
        """
        Called by GroupCommit on the reactor thread with a commit's
        L{BatchWritten}, before the syncs it covers fire: read what is written
        from the files, and unmap and forget the chunks it removed.
        """
        self._written = written
        position = written.write_position
        self._reader.follow(position, written.deleted_chunks)
        self._pending.written(position)
        figures = self._chunk_figures
        if written.chunk_figures:
            figures.update(written.chunk_figures)
        for number in written.deleted_chunks:
            figures.pop(number, None)
        self._compaction.follow(written)

    def _close_files(self):
        """Drop the maps and cached messages, then close the files (final checkpoints written)."""
        self._compaction.stop()
        self._reader.close()
        self._cache.clear()
        self._pending.clear()
        self._writer.close()

    # -- figures

    def stats(self):
        """The figures of the last commit (see L{BatchWritten}) and the reactor thread's own."""
        written, chunks = self._written, self._chunk_figures
        chunk_reads = sum(self._reader.reads.values())
        read_ahead = self._reader.read_ahead
        return {
            **self._topology.figures(),
            **self._writer_thread.figures(),
            "messages": written.held_messages,
            "bytes": written.held_bytes,
            "appends": self._appends,
            "acks": self._acks,
            "chunks": len(chunks),
            "chunk_size": self._pending.data_size,
            "chunk_reads": chunk_reads,
            "read_ahead_bytes": read_ahead.bytes_read if read_ahead else 0,
            "read_ahead_checked_bytes": read_ahead.bytes_checked if read_ahead else 0,
            "chunk_writes": sum(writes for writes, _ in chunks.values()),
            "bytes_on_disk": bytes_on_disk(self.directory, chunks),
            "append_position": self._pending.position,
            "write_position": written.write_position,
            "flushed_position": written.flushed_position,
            "cache_hits": self._cache.hits,
            "cache_misses": self._cache.misses,
            "cache_hit_ratio": self._cache.hit_ratio,
            "cache_bytes": self._cache.size,
            "delayed": len(self._delays),
            "delayed_flushes": written.delayed_flushes,
            "compacted_chunks": written.compacted_chunks,
            "compacted_bytes": written.compacted_bytes,
            "moved_messages": len(self._compaction.moves),
        }

    def chunk_stats(self):
        """Per message chunk: records read back, writes made and bytes written, for metrics."""
        reads = self._reader.reads
        return {
            number: {"reads": reads.get(number, 0), "writes": writes,
                     "bytes_written": bytes_written}
            for number, (writes, bytes_written) in sorted(self._chunk_figures.items())
        }

    def chunk_of(self, handle):
        """The number of the message chunk a handle's record is in (moved by compaction or not)."""
        return self._compaction.moves.get(handle, handle) // self._pending.data_size
