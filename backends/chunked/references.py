"""What the chunked store's writer thread counts of what is held: per message
chunk, the queue entries and kept delayed messages that point into it
(L{ChunkReferences}), which decides when a chunk file goes; and the messages
and body bytes some queue holds (L{Held}), for stats() and for the messages
several queues share.

A finished chunk nothing points into is I{consumed}: it is deleted with the
commit that freed it, after the acks and releases that did are durable,
unless the retention options keep it (the newest C{retain_chunks} consumed
chunks, and those finished less than C{retain_seconds} ago).
"""

import time
from collections import Counter


class ChunkReferences:
    """
    Per message chunk of a L{backends.chunked.messagelog.MessageLog}, the
    un-acked queue entries and kept delayed messages pointing into it, and
    the consumed chunks waiting to be deleted.
    """

    def __init__(self, log, retain_chunks=0, retain_seconds=0.0):
        self.retain_chunks = retain_chunks
        self.retain_seconds = retain_seconds
        self._log = log
        # message chunk number -> entries and kept delayed messages pointing into it
        self._counts = {}
        self._delayed = {}  # message chunk number -> kept delayed messages in it (never compacted)
        self._consumed = set()  # finished chunks nothing points into, kept for retention

    def entries(self, number):
        """The entries and kept delayed messages pointing into chunk C{number}."""
        return self._counts.get(number, 0)

    def delayed_entries(self, number):
        """The kept delayed messages in chunk C{number}."""
        return self._delayed.get(number, 0)

    def add(self, number, count):
        """C{count} more entries point into chunk C{number}."""
        self._counts[number] = self._counts.get(number, 0) + count

    def add_entries(self, handles):
        """A queue's new entries, one per handle (in log order), point into their chunks."""
        counts, data_size = self._counts, self._log.data_size
        for handle in handles:
            number = handle // data_size
            counts[number] = counts.get(number, 0) + 1

    def add_delayed(self, number, count=1):
        """C{count} more kept delayed messages are in chunk C{number}."""
        self._counts[number] = self._counts.get(number, 0) + count
        self._delayed[number] = self._delayed.get(number, 0) + count

    def release(self, number):
        """One entry pointing into chunk C{number} is gone (acked, or its queue deleted)."""
        remaining = self._counts[number] - 1
        self._counts[number] = remaining
        if remaining == 0:
            self.note_if_consumed(number)

    def release_run(self, handles):
        """The entries of C{handles}, in log order and none moved by compaction, are gone."""
        data_size, counts = self._log.data_size, self._counts
        first, last = handles[0] // data_size, handles[-1] // data_size
        if first == last:
            chunks = {first: len(handles)}
        else:
            chunks = Counter(handle // data_size for handle in handles)
        for number, count in chunks.items():
            remaining = counts[number] - count
            counts[number] = remaining
            if remaining == 0:
                self.note_if_consumed(number)

    def release_delayed(self, number):
        """A kept delayed message in chunk C{number} is released."""
        remaining = self._counts[number] - 1
        self._counts[number] = remaining
        self._delayed[number] = self._delayed.get(number, 0) - 1
        if remaining == 0:
            self.note_if_consumed(number)

    def move(self, old, new, entries):
        """C{entries} entries point into chunk C{new} instead of C{old}:
        compaction moved their record."""
        counts = self._counts
        counts[old] -= entries
        counts[new] = counts.get(new, 0) + entries
        if counts[old] == 0:
            self.note_if_consumed(old)

    def note_if_consumed(self, number):
        """Count finished chunk C{number} as consumed (to be deleted) if nothing points into it."""
        log = self._log
        if self._counts.get(number, 0) == 0 and log.deletable(number) and number in log.chunks:
            self._consumed.add(number)

    def to_delete(self):
        """
        The consumed chunks the retention options do not keep, newest first;
        the caller deletes each and says so (L{deleted}).
        """
        if not self._consumed:
            return []
        newest_first = sorted(self._consumed, reverse=True)
        now, gone = time.time(), []
        for rank, number in enumerate(newest_first):
            if self._counts.get(number, 0) != 0:
                self._consumed.discard(number)
                continue
            kept_by_count = rank < self.retain_chunks
            kept_by_age = (self.retain_seconds
                           and now - self._log.completed_at(number) < self.retain_seconds)
            if not (kept_by_count or kept_by_age):
                gone.append(number)
        return gone

    def deleted(self, number):
        """Chunk C{number}'s file was deleted: forget it."""
        self._consumed.discard(number)
        self._counts.pop(number, None)
        self._delayed.pop(number, None)


class Held:
    """Messages and body bytes held by some queue, kept on the writer thread for stats()."""

    __slots__ = ("messages", "bytes", "shared")

    def __init__(self):
        self.messages = 0
        self.bytes = 0
        # handle -> queues still holding it, for messages held by more than one queue
        self.shared = {}

    def count(self, indexes):
        """
        Count what the queue indexes read at open hold (C{indexes}, every
        one there is). Messages held by more than one queue count once: they
        are found without a set of every handle.
        """
        indexes = sorted(indexes, key=lambda index: index.held)
        counts = {}
        for index in indexes[:-1]:
            for handle, size in zip(index.unacked(), index.unacked_sizes()):
                counts[handle] = (counts[handle][0] + 1, size) if handle in counts else (1, size)
        if indexes and not counts:  # one queue holds messages: none is shared
            self.add_unshared(len(indexes[-1].unacked()), sum(indexes[-1].unacked_sizes()))
        elif indexes:
            for handle, size in zip(indexes[-1].unacked(), indexes[-1].unacked_sizes()):
                if handle in counts:
                    counts[handle] = (counts[handle][0] + 1, size)
                else:
                    self.add(handle, 1, size)
        for handle, (queues, size) in counts.items():
            self.add(handle, queues, size)

    def add(self, handle, queues, size):
        self.messages += 1
        self.bytes += size
        if queues > 1:
            self.shared[handle] = queues

    def add_unshared(self, count, size):
        """C{count} messages of C{size} body bytes in all, each held by one queue."""
        self.messages += count
        self.bytes += size

    def release(self, handle, size):
        """Count one queue letting C{handle} go; True if it was the last one holding it."""
        remaining = self.shared.get(handle)
        if remaining is not None:
            if remaining > 1:
                self.shared[handle] = remaining - 1
                return False
            del self.shared[handle]
        self.messages -= 1
        self.bytes -= size
        return True

    def release_unshared(self, count, size):
        """C{count} messages of C{size} body bytes in all, none shared, are let go."""
        self.messages -= count
        self.bytes -= size
