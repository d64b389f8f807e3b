"""A queue's ready entries, with paged-out ones kept as runs of store handles.

A backlog of a million recovered messages as a million entry objects would
cost some 160 MB; kept as runs of handles in arrays it costs 8 bytes a
message. An entry comes out of its run as a L{QueuedMessage} without a
message when it reaches the head, and the queue's pager loads the message
then (see L{brokerd.model.paging}). The lists count the body bytes of the
entries they keep as objects, for byte limits.
"""

from array import array
from collections import deque

from brokerd.model.message import QueuedMessage


class PagedRun:
    """Entries with consecutive sequence numbers kept only as store handles."""

    __slots__ = ("handles", "head", "first_sequence", "redelivered")

    def __init__(self, first_sequence, redelivered):
        self.handles = array("Q")
        self.head = 0  # handles before it have left the run
        self.first_sequence = first_sequence
        self.redelivered = redelivered

    def __len__(self):
        return len(self.handles) - self.head

    @property
    def sequence(self):
        """The sequence number of the run's first entry still in it."""
        return self.first_sequence + self.head

    @property
    def next_sequence(self):
        return self.first_sequence + len(self.handles)


class ReadyList:
    """
    The ready entries of one queue, in order: L{QueuedMessage}s and L{PagedRun}s.

    @ivar count: how many entries (an attribute, so a queue's hot paths compare it without a call).
    @ivar bytes: the body bytes of the entries kept as objects (paged-out ones count none), for
        x-max-length-bytes and the management API's C{memory}.
    """

    def __init__(self, queue):
        self._queue = queue
        self._items = deque()
        self.count = 0
        self.bytes = 0

    def __len__(self):
        return self.count

    def __bool__(self):
        return self.count > 0

    def append(self, entry):
        self._items.append(entry)
        self.count += 1
        self.bytes += len(entry.message.body)

    def append_paged(self, handles, first_sequence, redelivered):
        """
        Add entries by handle only, numbered from C{first_sequence}; they join
        the last run if they follow it.
        """
        if not len(handles):
            return
        items = self._items
        last = items[-1] if items else None
        if (type(last) is not PagedRun or last.next_sequence != first_sequence
                or last.redelivered != redelivered):
            last = PagedRun(first_sequence, redelivered)
            items.append(last)
        if type(handles) is array and handles.typecode != "Q":
            handles = array("Q", handles)  # array.extend takes only an array of its own kind
        last.handles.extend(handles)
        self.count += len(handles)

    def head_sequence(self):
        return self._items[0].sequence

    def popleft(self):
        """The head entry; one taken from a run comes without its message."""
        item = self._items[0]
        self.count -= 1
        if type(item) is not PagedRun:
            message = item.message
            if message is not None:  # None: put back at the head when it could not be loaded
                self.bytes -= len(message.body)
            return self._items.popleft()
        handle = item.handles[item.head]
        entry = QueuedMessage(
            None, self._queue, item.first_sequence + item.head, handle, item.redelivered
        )
        item.head += 1
        if item.head == len(item.handles):
            self._items.popleft()
        elif item.head >= 65536 and item.head * 2 > len(item.handles):
            del item.handles[: item.head]  # give back what the head has passed
            item.first_sequence += item.head
            item.head = 0
        return entry

    def appendleft(self, entry):
        self._items.appendleft(entry)
        self.count += 1
        self.bytes += body_size(entry)

    def extendleft(self, entries):
        entries = list(entries)
        self._items.extendleft(entries)
        self.count += len(entries)
        self.bytes += sum(map(body_size, entries))

    def put_back(self, returned):
        """
        Return delivered entries (sorted by sequence) near the head, each where
        its arrival order puts it among the entries still waiting.
        """
        last = returned[-1].sequence
        overtaken = []
        while self.count and self.head_sequence() < last:
            overtaken.append(self.popleft())
        if overtaken:
            returned = sorted(returned + overtaken, key=_by_sequence)
        self.extendleft(reversed(returned))

    def remove_where(self, condition):
        """
        Take out the entries kept as objects for which C{condition(entry)}
        holds; returns them in order.
        """
        removed, kept = [], deque()
        for item in self._items:
            if type(item) is not PagedRun and condition(item):
                removed.append(item)
            else:
                kept.append(item)
        if removed:
            self._items = kept
            self.count -= len(removed)
            self.bytes -= sum(map(body_size, removed))
        return removed

    def remove_handles(self, handles):
        """
        Take out the entries whose store handle is in the set C{handles}, those
        kept in runs too (a run is split around them); returns the handles taken out.
        """
        kept, taken, removed = deque(), [], []
        for item in self._items:
            if type(item) is not PagedRun:
                (removed if item.handle in handles else kept).append(item)
            elif handles.isdisjoint(item.handles[item.head :]):
                kept.append(item)
            else:
                run = None
                for index in range(item.head, len(item.handles)):
                    handle = item.handles[index]
                    if handle in handles:
                        taken.append(handle)
                        run = None
                    elif run is None:
                        run = PagedRun(item.first_sequence + index, item.redelivered)
                        run.handles.append(handle)
                        kept.append(run)
                    else:
                        run.handles.append(handle)
        self._items = kept
        self.count -= len(taken) + len(removed)
        self.bytes -= sum(map(body_size, removed))
        return taken + [entry.handle for entry in removed]

    def in_memory(self):
        """The entries kept as objects (those whose message may be loaded)."""
        return [item for item in self._items if type(item) is not PagedRun]

    def handles(self):
        """The store handles of every entry, in order (None for entries the store does not keep)."""
        for item in self._items:
            if type(item) is PagedRun:
                yield from item.handles[item.head :]
            else:
                yield item.handle

    def clear(self):
        self._items.clear()
        self.count = self.bytes = 0


class PriorityReady:
    """
    The ready entries of a priority queue: one L{ReadyList} per priority
    level, the highest served first, FIFO within a level. Its entries are
    always objects (a priority queue does not page its backlog out).

    @ivar count: how many entries, over every level.
    @ivar bytes: their body bytes, over every level.
    """

    def __init__(self, queue, max_priority):
        self._queue = queue
        self._max_priority = max_priority
        self._levels = [ReadyList(queue) for _ in range(max_priority + 1)]
        self.count = 0
        self.bytes = 0

    def level_of(self, entry):
        properties = entry.message.properties
        return (
            min(properties.priority, self._max_priority) if properties.HasField("priority") else 0
        )

    def __len__(self):
        return self.count

    def __bool__(self):
        return self.count > 0

    def append(self, entry):
        self._levels[self.level_of(entry)].append(entry)
        self.count += 1
        self.bytes += len(entry.message.body)

    def append_paged(self, handles, first_sequence, redelivered):
        raise TypeError("a priority queue keeps its entries as objects")

    def _highest(self):
        for level in reversed(self._levels):
            if level:
                return level
        raise IndexError("no ready entry")

    def head_sequence(self):
        return self._highest().head_sequence()

    def popleft(self):
        entry = self._highest().popleft()
        self.count -= 1
        self.bytes -= len(entry.message.body)
        return entry

    def appendleft(self, entry):
        self._levels[self.level_of(entry)].appendleft(entry)
        self.count += 1
        self.bytes += len(entry.message.body)

    def put_back(self, returned):
        by_level = {}
        for entry in returned:
            by_level.setdefault(self.level_of(entry), []).append(entry)
        for level, entries in by_level.items():
            self._levels[level].put_back(entries)
        self.count += len(returned)
        self.bytes += sum(map(body_size, returned))

    def remove_where(self, condition):
        removed = []
        for level in self._levels:
            removed += level.remove_where(condition)
        self.count -= len(removed)
        self.bytes -= sum(map(body_size, removed))
        return removed

    def remove_handles(self, handles):
        taken = []
        for level in self._levels:
            bytes_before = level.bytes
            found = level.remove_handles(handles)
            self.count -= len(found)
            self.bytes -= bytes_before - level.bytes
            taken += found
        return taken

    def in_memory(self):
        return [entry for level in reversed(self._levels) for entry in level.in_memory()]

    def handles(self):
        for level in reversed(self._levels):
            yield from level.handles()

    def clear(self):
        for level in self._levels:
            level.clear()
        self.count = self.bytes = 0


def _by_sequence(entry):
    return entry.sequence


def body_size(entry):
    """The body bytes an entry holds in memory: none while its message is paged out."""
    message = entry.message
    return 0 if message is None else len(message.body)
