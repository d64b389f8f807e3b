"""The message chunk files as files, apart from the writing of the log
(L{backends.chunked.messagelog.MessageLog}): their paths, the disk space they
take, whether a chunk file's header was ever written, and reading records out
of them with pread, which lets the reactor thread run while the disk works.

The writer thread reads records this way for the delayed index's windows
(L{read_records}), and the reactor's thread pool reads the slices compaction
moves (L{read_run}); the reactor thread itself reads through maps of the
files (L{backends.chunked.reads}).
"""

import os

from backends.chunked.format import (
    HEADER_SIZE,
    LENGTH,
    checked_record_parts,
    chunk_file_name,
    full_record_size,
)

PREFIX = "message-chunk"
# Bytes read for a record at first: most records fit, bigger ones take a second read.
RECORD_READ_AHEAD = 4096


def chunk_path(directory, number):
    """The path of message chunk C{number} in a store's C{directory}."""
    return os.path.join(directory, chunk_file_name(PREFIX, number))


def read_records(directory, data_size, positions):
    """
    The C{(head, body)} of the records at C{positions} of the log in
    C{directory}, whose chunks hold C{data_size} bytes of records each, a
    record at a time.

    @raise KeyError: if a record's chunk is gone.
    @raise StoreCorrupted: if a record is damaged.
    """
    records, descriptors = [], {}
    try:
        for position in positions:
            number, offset = divmod(position, data_size)
            path = chunk_path(directory, number)
            descriptor = descriptors.get(number)
            if descriptor is None:
                try:
                    descriptor = descriptors[number] = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise KeyError(f"no record at {position}:"
                                   f" message chunk {number} is gone") from None
            offset += HEADER_SIZE
            room = HEADER_SIZE + data_size - offset
            data = os.pread(descriptor, min(RECORD_READ_AHEAD, room), offset)
            size = min(full_record_size(data, 0), room) if len(data) >= LENGTH.size else 0
            if size > len(data):
                data = os.pread(descriptor, size, offset)
            records.append(checked_record_parts(data, 0, len(data), path, offset))
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)
    return records


def read_run(directory, data_size, positions):
    """
    The C{(head, body)} of the records at C{positions}, ascending and all
    in one finished chunk of the log in C{directory}, read with one pread of
    the span they cover (a record running past it is read on its own). Any
    thread may call it: the records of a finished chunk never change.

    @raise KeyError: if their chunk is gone.
    @raise StoreCorrupted: if a record is damaged.
    """
    number, first = divmod(positions[0], data_size)
    path = chunk_path(directory, number)
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyError(f"no record at {positions[0]}: message chunk {number} is gone") from None
    try:
        start = HEADER_SIZE + first
        end = min(HEADER_SIZE + positions[-1] % data_size + RECORD_READ_AHEAD,
                  HEADER_SIZE + data_size)
        span = os.pread(descriptor, end - start, start)
        records = []
        for position in positions:
            offset = HEADER_SIZE + position % data_size
            local = offset - start
            if local + LENGTH.size > len(span) or local + full_record_size(span, local) > len(span):
                data = os.pread(descriptor, RECORD_READ_AHEAD, offset)
                if len(data) >= LENGTH.size and full_record_size(data, 0) > len(data):
                    data = os.pread(descriptor, full_record_size(data, 0), offset)
                records.append(checked_record_parts(data, 0, len(data), path, offset))
            else:
                records.append(checked_record_parts(span, local, len(span), path, offset))
    finally:
        os.close(descriptor)
    return records


def bytes_on_disk(directory, numbers):
    """The disk space the message chunks C{numbers} take (their files are sparse until
    written)."""
    total = 0
    for number in numbers:
        try:
            total += os.stat(chunk_path(directory, number)).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def header_never_written(path):
    """True if the file at C{path} is shorter than a header or its header is all zeros:
    created, never written. (A chunk's header is written before anything else in it, and
    synced with it.)"""
    with open(path, "rb") as chunk:
        header = chunk.read(HEADER_SIZE)
    return len(header) < HEADER_SIZE or not any(header)
