"""The chunked store's queue indexes, one directory each under ``queues/``, as
its writer thread works on them (L{QueueIndexSet}).

At open the set reads the index of every durable queue the topology names,
and of every queue whose topology record is quarantined (it needs none: its
messages stay, and so do the chunks they are in, until the queue is deleted).
An index that cannot be read makes its queue unavailable, not the store; the
directories of queues the topology no longer holds (a crash came between the
two removals) are removed. While an index is damaged, or a quarantined
queue's name cannot be read, some index may point anywhere in the log: the
writer then neither deletes nor compacts a message chunk (L{complete}).
"""

import os
import shutil

from twisted.logger import Logger

from backends.chunked.queueindex import QueueIndex, creation_cut_short
from backends.common.fileio import fsync_directory, queue_key_name
from backends.common.topology_file import kept_queue_names
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2

log = Logger()

QUEUES = "queues"


class QueueIndexSet:
    """The L{QueueIndex} of every durable queue of one store's directory, by queue key."""

    def __init__(self, directory, entries_per_chunk):
        self.directory = os.path.join(directory, QUEUES)
        self.entries_per_chunk = entries_per_chunk
        self._indexes = {}  # queue key -> QueueIndex
        self._damaged = set()  # queues whose index could not be read: what they point to is unknown
        # queues whose topology records are quarantined: their indexes are kept
        self._kept_queues = set()
        self._unnamed_kept_queue = False  # a quarantined queue record's name could not be read

    def directory_of(self, queue):
        return os.path.join(self.directory, queue_key_name(queue))

    def get(self, queue):
        """The index of C{queue}, or None (no entry was ever appended, or its index is damaged)."""
        return self._indexes.get(queue)

    def values(self):
        return self._indexes.values()

    @property
    def complete(self):
        """
        Whether every entry is known: no index is damaged and no quarantined
        queue lacks a name. Until then any chunk may be pointed into.
        """
        return not (self._damaged or self._unnamed_kept_queue)

    # -- open

    def make_directory(self):
        os.makedirs(self.directory, exist_ok=True)

    def recover(self, topology, write_position, count):
        """
        Read the index of each queue of C{topology} (records as
        L{backends.common.topology_file.decode_topology} gives them) and of
        each quarantined queue, cutting off entries at or past
        C{write_position}; C{count(queue, index)} counts each index's entries
        in their chunks, and may find it damaged too. Then remove the
        directories of queues the topology does not hold.

        @return: C{(unacked, damaged, delivery_counts)}: by queue key, the
            handles of its un-acked entries, the L{StoreCorrupted} that makes
            it unavailable, its entries' delivery counts.
        """
        queues = [(record.vhost, record.name) for record in topology
                  if isinstance(record, messages_pb2.QueueRecord)]
        self._kept_queues, self._unnamed_kept_queue = kept_queue_names(topology)
        unacked, damaged, delivery_counts = {}, {}, {}
        for queue in [*queues, *sorted(self._kept_queues - set(queues))]:
            try:
                unacked[queue] = self._recover(queue, write_position, count)
                if queue in self._indexes:
                    delivery_counts[queue] = self._indexes[queue].delivery_counts()
            except StoreCorrupted as damage:
                damaged[queue] = damage
                index = self._indexes.pop(queue, None)
                if index is not None:
                    index.close()
        self._damaged = set(damaged)
        self._remove_orphans(queues)
        return unacked, damaged, delivery_counts

    def _recover(self, queue, write_position, count):
        directory = self.directory_of(queue)
        if not os.path.isdir(directory):
            return []
        if creation_cut_short(directory):
            log.warn("queue index {path}: its creation was cut short by a crash; the queue starts"
                     " empty", path=directory)
            shutil.rmtree(directory)
            return []
        index = QueueIndex(directory, queue, self.entries_per_chunk)
        self._indexes[queue] = index
        index.recover(write_position)
        count(queue, index)
        return index.unacked()

    def _remove_orphans(self, queues):
        """
        Index directories of queues the topology no longer holds: a crash came
        between the two removals. Those of queues whose topology records are
        quarantined are kept, and all of them are if one such queue's name
        cannot be read.
        """
        expected = {queue_key_name(queue) for queue in [*queues, *self._kept_queues]}
        for name in sorted(os.listdir(self.directory)):
            if name not in expected:
                path = os.path.join(self.directory, name)
                if self._unnamed_kept_queue:
                    log.warn("queue index {path} belongs to no readable queue of the topology;"
                             " kept, as it may be the quarantined queue's whose name cannot be"
                             " read", path=path)
                    continue
                log.warn("queue index {path} belongs to no queue of the topology; removed",
                         path=path)
                shutil.rmtree(path, ignore_errors=True)

    # -- commits

    def create(self, queue):
        """The new, empty index of C{queue}, for its first entries."""
        index = self._indexes[queue] = QueueIndex(self.directory_of(queue), queue,
                                                  self.entries_per_chunk)
        index.create()
        return index

    def remove(self, queue):
        """
        Take C{queue}'s index out of the set, damaged or not: its index if it
        was read (the caller releases its entries, then deletes it with
        L{deleted}), else None, its directory removed already.
        """
        self._damaged.discard(queue)
        index = self._indexes.pop(queue, None)
        if index is None:
            shutil.rmtree(self.directory_of(queue), ignore_errors=True)
        return index

    def deleted(self, index):
        """Remove the files of an index L{remove} took out."""
        index.delete()
        fsync_directory(self.directory)

    def sync(self, fsync):
        for index in self._indexes.values():
            index.sync(fsync)

    def checkpoint_if_due(self, queues, fsync):
        """Checkpoint the indexes of C{queues} (those a commit acked in) that are due,
        after the acks are durable."""
        for queue in queues:
            index = self._indexes.get(queue)
            if index is not None:
                index.checkpoint_if_due(fsync)

    def close(self):
        """Write final checkpoints and close every index."""
        for index in self._indexes.values():
            index.checkpoint(True)
            index.close()
        self._indexes.clear()
