"""The chunked store (EQueue's design): every persistent message written once to
a log of fixed-size chunk files, per durable queue an index of fixed-size
entries pointing into it, acks in a per-queue ack log with a checkpointed
low-water mark. Files live under C{<data dir>/chunked/}.
"""

import os

from zope.interface import implementer

from backends.chunked.format import BLOCK_SIZE
from backends.chunked.store import ChunkedStore, MessageTooLarge
from brokerd.interfaces import IStoreBackend
from brokerd.units import parse_size

SUBDIRECTORY = "chunked"
SMALLEST_CHUNK = BLOCK_SIZE


@implementer(IStoreBackend)
class ChunkedBackend:
    name = "chunked"
    description = "EQueue's design: one log of fixed-size chunk files, a fixed-size index per queue, acks in an ack log"
    options = {
        "chunk_size": ("256M", "bytes of messages per chunk file; the largest message must fit in one"),
        "index_chunk_entries": ("1048576", "queue index entries (16 bytes each) per index chunk file"),
        "cache_size": ("64M", "bytes of recently appended messages kept in memory for reads"),
        "retain_chunks": ("0", "fully consumed chunks kept anyway, newest first (0: delete at once)"),
        "retain_seconds": ("0", "... and consumed chunks kept until this old (0: delete at once)"),
    }

    def make_store(self, data_dir, sync_policy=None, **options):
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"no option {unknown[0]!r}; the options are: {', '.join(sorted(self.options))}")
        given = {name: options.get(name, default) for name, (default, _) in self.options.items()}
        chunk_size = _size("chunk_size", given["chunk_size"], SMALLEST_CHUNK)
        if chunk_size % BLOCK_SIZE:
            raise ValueError(f"option chunk_size must be a whole number of {BLOCK_SIZE}-byte blocks, not {chunk_size}")
        return ChunkedStore(
            os.path.join(data_dir, SUBDIRECTORY),
            sync_policy,
            chunk_size=chunk_size,
            index_chunk_entries=_whole_number("index_chunk_entries", given["index_chunk_entries"], 1),
            cache_size=_size("cache_size", given["cache_size"], 0),
            retain_chunks=_whole_number("retain_chunks", given["retain_chunks"], 0),
            retain_seconds=_whole_number("retain_seconds", given["retain_seconds"], 0),
        )


def _size(name, text, smallest):
    """A byte size like C{64M}; the ValueError names the option."""
    try:
        value = parse_size(text)
    except ValueError as problem:
        raise ValueError(f"option {name}: {problem}") from None
    if value < smallest:
        raise ValueError(f"option {name} must be at least {smallest} bytes, not {text!r}")
    return value


def _whole_number(name, text, smallest):
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = smallest - 1
    if value < smallest:
        raise ValueError(f"option {name} must be a whole number of at least {smallest}, not {text!r}")
    return value


backend = ChunkedBackend()

__all__ = ["ChunkedStore", "MessageTooLarge", "backend"]
