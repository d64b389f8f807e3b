"""The filelog store: one append-only file per durable queue, acks flipping a
valid flag in place, compaction of files that are mostly acked, the topology
in a small file replaced atomically; delayed messages in one more such log,
indexed by due time in memory. Files live under C{<data dir>/filelog/}.

The store pages: the broker keeps handles for a backlog, and messages are read
back from the files when delivered, a run of following records at a time,
within C{cache_size} bytes.
"""

import os

from zope.interface import implementer

from backends.common.options import byte_size, given_options, whole_number
from backends.filelog.store import FilelogStore
from brokerd.interfaces import IStoreBackend

SUBDIRECTORY = "filelog"


@implementer(IStoreBackend)
class FilelogBackend:
    name = "filelog"
    description = ("one append-only file per durable queue; an ack flips a flag in place;"
                   " mostly-acked files are compacted")
    options = {
        "compact_min_records": ("2000", "compact a queue file only once it holds at least this"
                                        " many records"),
        "compact_valid_ratio": ("0.5", "... and fewer than this fraction of them are un-acked"
                                       " (0 < ratio <= 1)"),
        "delayed_bucket_ms": ("60000", "milliseconds of due time per bucket of the in-memory"
                                       " delayed-message index"),
        "cache_size": ("64M", "bytes of records read ahead from the queue files and kept in memory"
                              " for loads"),
    }

    def make_store(self, data_dir, sync_policy=None, *, reactor, **options):
        given = given_options(self, options)
        return FilelogStore(
            os.path.join(data_dir, SUBDIRECTORY),
            sync_policy,
            reactor=reactor,
            compact_min_records=whole_number("compact_min_records", given["compact_min_records"]),
            compact_valid_ratio=_ratio("compact_valid_ratio", given["compact_valid_ratio"]),
            delayed_bucket_ms=whole_number("delayed_bucket_ms", given["delayed_bucket_ms"]),
            cache_size=byte_size("cache_size", given["cache_size"], 0),
        )


def _ratio(name, text):
    """An option's text as a number above 0 and at most 1; the ValueError names the option."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"option {name} must be a number above 0 and at most 1, not {text!r}")
    return value


backend = FilelogBackend()

__all__ = ["FilelogStore", "backend"]
