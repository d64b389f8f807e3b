"""The counters of the filelog store's files, for its stats(): L{Figures}, kept
by the writer thread as the queue files (L{backends.filelog.queuefile}) and
the delayed log (L{backends.filelog.delayedlog}) change, and L{FiguresNow},
the value of them that reaches the reactor thread with the writer's
recovery and with each commit's result.
"""

from typing import NamedTuple


class FiguresNow(NamedTuple):
    """The L{Figures} at one moment, as a value the reactor thread may keep."""

    file_bytes: int
    writes: int
    syncs: int
    compactions: int
    held: int = 0
    held_bytes: int = 0


class Figures:
    """Counters of a store's files for its stats(), kept by the writer thread; L{now} gives them as
    a value.

    @ivar held: valid message records in the queue files (a message kept for two queues counts
        twice).
    @ivar held_bytes: their sizes, framing included.
    """

    def __init__(self):
        self.file_bytes = 0
        self.writes = 0
        self.syncs = 0
        self.compactions = 0
        self.held = 0
        self.held_bytes = 0

    def now(self):
        return FiguresNow(self.file_bytes, self.writes, self.syncs, self.compactions, self.held,
                          self.held_bytes)
