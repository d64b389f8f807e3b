"""A queue index's chunk files as open finds them (L{read_entries}): each
holds a header and fixed 16-byte entries, entry N at a place computed from
N alone (L{backends.chunked.format}), so reading them back is checking
headers and decoding entries until the first unwritten one. The index
itself, its acks and its checkpoint are L{backends.chunked.queueindex}'s.
"""

import os
from array import array

from twisted.logger import Logger

from backends.chunked.chunkfiles import header_never_written
from backends.chunked.format import (
    HEADER_SIZE,
    INDEX_CHUNK,
    INDEX_ENTRY_SIZE,
    FormatError,
    chunk_file_name,
    chunk_numbers,
    decode_header,
    decode_index_entries,
)
from brokerd.interfaces import StoreCorrupted

log = Logger()

PREFIX = "index-chunk"


def index_chunk_path(directory, number):
    """The path of index chunk C{number} in a queue index's C{directory}."""
    return os.path.join(directory, chunk_file_name(PREFIX, number))


def read_entries(directory, queue, entries_per_chunk, mark):
    """
    The entries of C{queue}'s index in C{directory} from entry C{mark} to
    the first unwritten one: C{(handles, body lengths, next entry, entries
    per chunk)}, the arrays in entry order and the last the chunk size the
    index was made with, which holds for it whatever C{entries_per_chunk}
    says. A last chunk whose creation a crash cut short is removed, and a
    torn entry at the end is cut off.

    @raise StoreCorrupted: naming the file, if a chunk is missing or damaged.
    """
    window, window_sizes = array("Q"), array("I")
    numbers = chunk_numbers(directory, PREFIX)
    if numbers and header_never_written(index_chunk_path(directory, numbers[-1])):
        log.warn("index chunk {path} has no header: a crash came before it was written, so no"
                 " entry in it was ever synced; removed",
                 path=index_chunk_path(directory, numbers[-1]))
        os.unlink(index_chunk_path(directory, numbers.pop()))
    if numbers:
        entries_per_chunk = adopted_chunk_size(index_chunk_path(directory, numbers[0]), queue,
                                               entries_per_chunk)
    numbers = [number for number in numbers if number >= mark // entries_per_chunk]
    entry = mark
    for position, number in enumerate(numbers):
        if number != entry // entries_per_chunk:
            missing = index_chunk_path(directory, entry // entries_per_chunk)
            raise StoreCorrupted(f"queue {queue!r}: index chunk {missing} is missing", missing)
        path = index_chunk_path(directory, number)
        with open(path, "rb") as chunk:
            header = chunk.read(HEADER_SIZE)
            check_header(header, number, path, entries_per_chunk)
            first = entry % entries_per_chunk
            chunk.seek(HEADER_SIZE + first * INDEX_ENTRY_SIZE)
            data = chunk.read((entries_per_chunk - first) * INDEX_ENTRY_SIZE)
        handles, sizes, stop, problem = decode_index_entries(data)
        window.extend(handles)
        window_sizes.extend(sizes)
        entry += len(handles)
        last = position == len(numbers) - 1
        if problem is not None:
            offset = HEADER_SIZE + (first + stop) * INDEX_ENTRY_SIZE
            if not last or any(data[(stop + 1) * INDEX_ENTRY_SIZE :]):
                raise StoreCorrupted(f"index chunk {path}: the entry at offset {offset} is damaged"
                                     f" ({problem})", path, offset)
            log.warn("index chunk {path}: a torn entry at offset {offset} is cut off",
                     path=path, offset=offset)
            zero_from(path, offset, entries_per_chunk)
        elif entry % entries_per_chunk and not last:
            raise StoreCorrupted(f"index chunk {path} ends before its last entry, yet a later chunk"
                                 " exists", path)
    return window, window_sizes, entry, entries_per_chunk


def adopted_chunk_size(path, queue, entries_per_chunk):
    """The entries per chunk of C{queue}'s index, whose first chunk is C{path}: the index chunk
    size a queue's index was made with holds for it, as entry numbers map to chunks by it."""
    with open(path, "rb") as chunk:
        header = chunk.read(HEADER_SIZE)
    try:
        size = decode_header(header, path)[3]
    except FormatError as problem:
        raise StoreCorrupted(str(problem), path, 0) from None
    if size != entries_per_chunk * INDEX_ENTRY_SIZE and size and size % INDEX_ENTRY_SIZE == 0:
        log.warn("queue {queue!r}: its index chunks hold {entries} entries each; keeping that size",
                 queue=queue, entries=size // INDEX_ENTRY_SIZE)
        return size // INDEX_ENTRY_SIZE
    return entries_per_chunk


def check_header(header, number, path, entries_per_chunk):
    """Raise L{StoreCorrupted} unless C{header} is that of index chunk C{number}."""
    try:
        kind, found, start, size = decode_header(header, path)
    except FormatError as problem:
        raise StoreCorrupted(str(problem), path, 0) from None
    expected = (INDEX_CHUNK, number, number * entries_per_chunk,
                entries_per_chunk * INDEX_ENTRY_SIZE)
    if (kind, found, start, size) != expected:
        raise StoreCorrupted(f"index chunk {path} has the header of another chunk", path, 0)


def zero_from(path, offset, entries_per_chunk):
    """Cut the index chunk at C{path} at C{offset}, so what follows reads as zeros again."""
    with open(path, "r+b") as chunk:
        os.ftruncate(chunk.fileno(), offset)
        os.ftruncate(chunk.fileno(), HEADER_SIZE + entries_per_chunk * INDEX_ENTRY_SIZE)
