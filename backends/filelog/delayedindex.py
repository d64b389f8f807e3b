"""The filelog store's index of delayed messages: kept in memory, as arrays.

The delayed log (L{backends.filelog.delayedlog}) is in append order; this
index puts its valid records in C{(due, handle)} order. Entries are grouped in
buckets of due time (C{width} milliseconds each), each a
L{backends.delayedruns.MemoryBucket} of sorted runs; a L{HandleMap} says where each
kept handle's record is and when it is due. That is about 33 bytes per kept
message and no object per message; a window reads only the buckets it spans.
Only the writer thread touches it.
"""

from bisect import bisect_left, insort

from backends.delayedshared.sortedruns import MemoryBucket, window
from backends.handlemap import HandleMap


class FilelogDelayedMemoryIndex:
    """Kept delayed messages: their handles, due times and record offsets."""

    def __init__(self, width):
        self.width = width
        self.where = HandleMap(("Q", "Q"))  # handle -> (record offset, due)
        self._buckets = {}  # bucket number -> MemoryBucket of (due, handle)
        self._numbers = []  # bucket numbers, sorted

    def __len__(self):
        return len(self.where)

    def add(self, due, handle, offset):
        self.where.add(handle, offset, due)
        number = due // self.width
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = MemoryBucket()
            insort(self._numbers, number)
        bucket.add(due, handle)

    def release(self, handle):
        """Forget C{handle}; the offset of its record, or None if it was not kept."""
        values = self.where.pop(handle)
        if values is None:
            return None
        offset, due = values
        number = due // self.width
        bucket = self._buckets[number]
        bucket.released += 1
        if bucket.live == 0:
            del self._buckets[number]
            del self._numbers[bisect_left(self._numbers, number)]
        return offset

    def relocate(self, handle, offset):
        """The record of C{handle} moved to C{offset} (a compaction)."""
        values = self.where.get(handle)
        if values is not None:
            self.where.add(handle, offset, values[1])

    def _released(self, handle):
        return handle not in self.where

    def window(self, cursor, until, limit):
        """Up to C{limit} C{(due, handle, offset)} after C{cursor} and due by C{until}, in key order."""
        found = []
        numbers, last = self._numbers, until // self.width
        index = 0 if cursor is None else bisect_left(numbers, cursor[0] // self.width)
        while index < len(numbers) and numbers[index] <= last and len(found) < limit:
            runs = self._buckets[numbers[index]].view(self._released)
            found += window(runs, cursor, until, limit - len(found), self._released)
            index += 1
        where = self.where
        return [(due, handle, where.get(handle)[0]) for due, handle in found]
