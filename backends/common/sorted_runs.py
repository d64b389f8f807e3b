"""Sorted runs of delayed-message entries: how the file-based stores hold (part of)
a due-time index in memory, as arrays rather than an object per message.

An entry is a due time, a handle and a few more numbers (where the message
is). A L{SortedRun} holds entries sorted by C{(due, handle)} in parallel
arrays; a L{MemoryBucket} is the entries of one slice of due time: some runs,
plus a I{tail} of entries added since, in handle order and unsorted, which
becomes a run when the bucket is next read. A window (L{window}) merges the
runs from a cursor on, so reading the next 1,000 entries costs about 1,000
steps however big the bucket is; L{merge_runs} folds many runs into one.

The filelog store's whole due-time index is L{MemoryBucket}s
(L{backends.filelog.delayedlog.FilelogDelayedMemoryIndex}); the chunked
store's on-disk index keeps a L{MemoryBucket} per bucket as its memtable and
reads its bucket files back as L{SortedRun}s
(L{backends.chunked.delayedbuckets}, L{backends.chunked.delayedformat}).
"""

from array import array
from bisect import bisect_left, bisect_right
from heapq import merge
from itertools import count, repeat

MAX_RUNS = 8  # a bucket with more runs is merged into one when read
# ... and so is one with at least this many released entries, if they are half of it
MERGE_RELEASED = 256


class SortedRun:
    """Entries sorted by C{(due, handle)}: arrays C{dues}, C{handles} and C{extra} columns,
    never changed."""

    __slots__ = ("dues", "handles", "extra")

    def __init__(self, dues, handles, extra=()):
        self.dues = dues
        self.handles = handles
        self.extra = tuple(extra)

    def __len__(self):
        return len(self.dues)

    def start(self, cursor):
        """The index of the first entry whose key is greater than C{cursor}
        (None: the first one)."""
        if cursor is None:
            return 0
        due, handle = cursor
        low = bisect_left(self.dues, due)
        high = bisect_right(self.dues, due, low)
        return bisect_right(self.handles, handle, low, high)

    def entries(self, start=0, tag=0):
        """C{(due, handle, tag, index)} of the entries from C{start} on."""
        return zip(memoryview(self.dues)[start:], memoryview(self.handles)[start:], repeat(tag),
                   count(start))


def empty_columns(typecodes):
    """New empty arrays: dues, handles, then one per extra column."""
    return (array("Q"), array("Q"), *(array(code) for code in typecodes))


def sorted_run(columns):
    """
    A L{SortedRun} of entries given as unsorted columns (dues, handles, extra...)
    whose handles increase: a stable sort by due alone gives (due, handle) order.
    """
    dues = columns[0]
    order = sorted(range(len(dues)), key=dues.__getitem__)
    in_order = [array(column.typecode, map(column.__getitem__, order)) for column in columns]
    return SortedRun(in_order[0], in_order[1], in_order[2:])


def merge_runs(runs, released=None, typecodes=None):
    """
    One run of the entries of C{runs} whose handles C{released} (a predicate,
    or None) does not reject. Entries are merged one at a time: what lives at
    once is the arrays, never an object per entry.
    """
    if len(runs) == 1 and released is None:
        return runs[0]
    if typecodes is None:
        typecodes = [column.typecode for column in runs[0].extra] if runs else []
    dues, handles, *extra = empty_columns(typecodes)
    add_due, add_handle = dues.append, handles.append
    sources = [run.entries(0, tag) for tag, run in enumerate(runs)]
    entries = merge(*sources) if len(sources) > 1 else sources[0] if sources else ()
    for due, handle, tag, index in entries:
        if released is not None and released(handle):
            continue
        add_due(due)
        add_handle(handle)
        for target, column in zip(extra, runs[tag].extra):
            target.append(column[index])
    return SortedRun(dues, handles, extra)


def window(runs, cursor, until, limit, released=None):
    """
    Up to C{limit} entries of C{runs} with key above C{cursor} and due at most
    C{until}, in C{(due, handle)} order, skipping handles C{released} rejects:
    a list of C{(due, handle, *extra)}.
    """
    sources = []
    for tag, run in enumerate(runs):
        start = run.start(cursor)
        if start < len(run) and run.dues[start] <= until:
            sources.append(run.entries(start, tag))
    found = []
    if not sources or limit <= 0:
        return found
    for due, handle, tag, index in merge(*sources) if len(sources) > 1 else sources[0]:
        if due > until:
            break
        if released is not None and released(handle):
            continue
        found.append((due, handle, *(column[index] for column in runs[tag].extra)))
        if len(found) >= limit:
            break
    return found


class MemoryBucket:
    """
    The entries of one slice of due time held in memory: sorted runs and a
    tail of newer entries. C{released} counts entries still in the runs or
    tail whose handles were released since (the owner's predicate says which).
    """

    __slots__ = ("typecodes", "runs", "tail", "entries", "released")

    def __init__(self, typecodes=()):
        self.typecodes = tuple(typecodes)
        self.runs = []
        self.tail = empty_columns(self.typecodes)
        self.entries = 0  # in runs and tail, released ones included
        self.released = 0

    @property
    def live(self):
        return self.entries - self.released

    def add(self, due, handle, *extra):
        for column, value in zip(self.tail, (due, handle, *extra)):
            column.append(value)
        self.entries += 1

    def add_rows(self, rows):
        """Add many C{(due, handle, *extra)} rows at once, a column at a time
        (faster than L{add} per row)."""
        for column, values in zip(self.tail, zip(*rows)):
            column.extend(values)
        self.entries += len(rows)

    def add_run(self, run):
        if len(run):
            self.runs.append(run)
            self.entries += len(run)

    def view(self, released):
        """The runs, the tail sorted into one of them, merged into one if there are many or much is
        released."""
        if self.tail[0]:
            self.runs.append(sorted_run(self.tail))
            self.tail = empty_columns(self.typecodes)
        much_released = self.released >= MERGE_RELEASED and 2 * self.released >= self.entries
        if len(self.runs) > MAX_RUNS or much_released:
            self.runs = [merge_runs(self.runs, released, self.typecodes)]
            self.entries, self.released = len(self.runs[0]), 0
        return self.runs
