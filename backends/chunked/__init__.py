"""The chunked store (EQueue's design): every persistent message written once to
a log of fixed-size chunk files, per durable queue an index of fixed-size
entries pointing into it, acks in a per-queue ack log with a checkpointed
low-water mark. Delayed messages are records of the same log, indexed by due
time in one file per bucket of due time under C{delayed/} (fed through a
journal). A finished chunk whose held messages are a small share of it is
compacted: they are moved to the head of the log and the chunk is deleted.
Files live under C{<data dir>/chunked/}.
"""

import os

from zope.interface import implementer

from backends.chunked.format import BLOCK_SIZE
from backends.chunked.pendingwrites import MessageTooLarge
from backends.chunked.store import ChunkedStore
from backends.common.options import byte_size, given_options, whole_number
from brokerd.interfaces import IStoreBackend

SUBDIRECTORY = "chunked"
SMALLEST_CHUNK = BLOCK_SIZE
# Above it, the copies of one sparse chunk would make a chunk to compact again.
COMPACT_BELOW_LIMIT = 50


@implementer(IStoreBackend)
class ChunkedBackend:
    name = "chunked"
    description = ("EQueue's design: one log of fixed-size chunk files, a fixed-size index per"
                   " queue, acks in an ack log")
    options = {
        "chunk_size": ("256M", "bytes of messages per chunk file; the largest message must fit in"
                               " one"),
        "index_chunk_entries": ("1048576", "queue index entries (16 bytes each) per index chunk"
                                           " file"),
        "cache_size": ("64M", "bytes of recently appended messages kept in memory for reads"),
        "read_ahead": ("4M", "bytes of a chunk read into the page cache ahead of deliveries,"
                             " on a thread (0: off)"),
        "retain_chunks": ("0", "fully consumed chunks kept anyway, newest first"
                               " (0: delete at once)"),
        "retain_seconds": ("0", "... and consumed chunks kept until this old (0: delete at once)"),
        "delayed_bucket_ms": ("60000", "milliseconds of due time per delayed-message index file"
                                       " (bucket)"),
        "delayed_flush_entries": ("65536", "delayed-message journal entries that make a flush"
                                           " into the buckets"),
        "compact_below": ("25", "percent of a finished chunk's bytes still held under which its"
                                " held messages are moved forward and the chunk deleted"
                                " (0: never, at most 50)"),
        "compact_bytes": ("256K", "bytes of held messages a compaction moves per commit, at most"
                                  " (and one message)"),
        "compact_after_seconds": ("5", "... once a sparse chunk's held bytes have not changed for"
                                       " this long"),
    }

    # A follower's store: nothing reads recent messages back from memory there.
    replica_options = {"cache_size": "0"}

    def make_store(self, data_dir, sync_policy=None, *, reactor, **options):
        given = given_options(self, options)
        chunk_size = byte_size("chunk_size", given["chunk_size"], SMALLEST_CHUNK)
        if chunk_size % BLOCK_SIZE:
            raise ValueError(f"option chunk_size must be a whole number of {BLOCK_SIZE}-byte"
                             f" blocks, not {chunk_size}")
        return ChunkedStore(
            os.path.join(data_dir, SUBDIRECTORY),
            sync_policy,
            reactor=reactor,
            chunk_size=chunk_size,
            index_chunk_entries=whole_number("index_chunk_entries",
                                             given["index_chunk_entries"], 1),
            cache_size=byte_size("cache_size", given["cache_size"], 0),
            read_ahead=byte_size("read_ahead", given["read_ahead"], 0),
            retain_chunks=whole_number("retain_chunks", given["retain_chunks"], 0),
            retain_seconds=whole_number("retain_seconds", given["retain_seconds"], 0),
            delayed_bucket_ms=whole_number("delayed_bucket_ms", given["delayed_bucket_ms"]),
            delayed_flush_entries=whole_number("delayed_flush_entries",
                                               given["delayed_flush_entries"]),
            compact_below=percent("compact_below", given["compact_below"],
                                  COMPACT_BELOW_LIMIT) / 100,
            compact_bytes=byte_size("compact_bytes", given["compact_bytes"], 1),
            compact_quiet=whole_number("compact_after_seconds", given["compact_after_seconds"], 0),
        )


def percent(name, text, largest):
    """An option's text as a whole percentage, 0 to C{largest}; the ValueError names the option."""
    value = whole_number(name, text, 0)
    if value > largest:
        raise ValueError(f"option {name} must be a percentage from 0 to {largest}, not {text!r}")
    return value


backend = ChunkedBackend()

__all__ = ["ChunkedStore", "MessageTooLarge", "backend"]
