"""L{SortedKeys}: comparable keys kept in order, for the memory store's delayed messages."""

from bisect import bisect_left, bisect_right, insort

CHUNK = 512  # keys per list; a list twice as long is split


class SortedKeys:
    """
    Keys kept sorted in a list of short sorted lists, so that adding or
    removing one moves at most a short list's worth of references (one sorted
    list of a million keys would move megabytes on each insert).
    """

    def __init__(self):
        self._lists = []
        self._maxes = []  # the last key of each list
        self._count = 0

    def __len__(self):
        return self._count

    def add(self, key):
        lists, maxes = self._lists, self._maxes
        self._count += 1
        if not lists:
            lists.append([key])
            maxes.append(key)
            return
        index = min(bisect_left(maxes, key), len(maxes) - 1)
        keys = lists[index]
        insort(keys, key)
        maxes[index] = keys[-1]
        if len(keys) > 2 * CHUNK:
            lists[index : index + 1] = [keys[:CHUNK], keys[CHUNK:]]
            maxes[index : index + 1] = [keys[CHUNK - 1], keys[-1]]

    def remove(self, key):
        """Remove C{key}; False if it was not there."""
        lists, maxes = self._lists, self._maxes
        index = bisect_left(maxes, key)
        if index == len(maxes):
            return False
        keys = lists[index]
        position = bisect_left(keys, key)
        if position == len(keys) or keys[position] != key:
            return False
        del keys[position]
        self._count -= 1
        if keys:
            maxes[index] = keys[-1]
        else:
            del lists[index], maxes[index]
        return True

    def after(self, cursor):
        """The keys greater than C{cursor} (None: all of them), in order, lazily."""
        lists = self._lists
        if cursor is None:
            index, position = 0, 0
        else:
            index = bisect_right(self._maxes, cursor)
            position = bisect_right(lists[index], cursor) if index < len(lists) else 0
        while index < len(lists):
            keys = lists[index]
            yield from keys[position:]
            index, position = index + 1, 0
