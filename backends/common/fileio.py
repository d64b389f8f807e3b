"""Small file-system steps the file-based backends' writer threads build on:
whole writes, gathered writes, atomic replacement, durable directory changes,
file names made from queue names."""

import fcntl
import hashlib
import os
import sys
from array import array

from brokerd.interfaces import StoreInUse

TEMPORARY_SUFFIX = ".tmp"
IOV_MAX = os.sysconf("SC_IOV_MAX")
SMALL_PART = 16 * 1024  # parts smaller than this are joined; copying them costs less than an iovec
HASHED_PREFIX = "sha256-"
LONGEST_HEX_NAME = 200  # file systems allow 255 bytes; longer keys are hashed


class DirectoryInUse(StoreInUse):
    """Another open store (most likely another broker on the same data directory) holds the
    files."""


def lock_directory(lock_path, backend):
    """
    Take an exclusive C{flock} on C{lock_path} (created if need be), held
    until the returned descriptor is closed: two stores writing the same files
    would corrupt them, so the second to open fails with DirectoryInUse.
    """
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise DirectoryInUse(
            f"{os.path.dirname(lock_path)} is in use by another open {backend} store"
            " (another broker on the same data directory?)"
        ) from None
    return descriptor


def queue_key_name(queue):
    """
    A file name for a queue key C{(vhost, name)}: the hex of the UTF-8 of
    C{"vhost\\0name"}, which is safe on any file system whatever the names hold,
    or a SHA-256 of it when the hex would be too long for a file name.
    """
    key = "\0".join(queue).encode("utf-8")
    name = key.hex()
    if len(name) > LONGEST_HEX_NAME:
        name = HASHED_PREFIX + hashlib.sha256(key).hexdigest()
    return name


def replace_file(path, data, sync_directory):
    """
    Replace the file at C{path} by one holding C{data}, atomically.

    The new contents are fsynced before the rename whatever the sync policy:
    otherwise a crash could leave an empty file in place of a good one. The
    directory (which makes the rename itself durable) is fsynced only if
    C{sync_directory}.

    @return: the number of fsyncs made.
    """
    temporary = path + TEMPORARY_SUFFIX
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(descriptor, data, 0)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    if sync_directory:
        fsync_directory(os.path.dirname(path))
        return 2
    return 1


def write_all(descriptor, data, offset):
    """pwrite C{data} at C{offset}, however many calls the kernel needs (usually one)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view = view[written:]
        offset += written


def fsync_directory(path):
    """Make the creations, renames and removals of files in a directory durable."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_gathered(descriptor, parts, offset):
    """
    Write C{parts} one after the other from C{offset} with vectored writes:
    one call unless the kernel's iovec limit needs more, and big parts (message
    bodies) written from where they are instead of copied into one buffer.

    @return: the number of write calls made.
    """
    buffers = _gather(parts)
    calls = 0
    while buffers:
        written = os.pwritev(descriptor, buffers[:IOV_MAX], offset)
        calls += 1
        offset += written
        done = 0
        while done < len(buffers) and written >= len(buffers[done]):
            written -= len(buffers[done])
            done += 1
        buffers = buffers[done:]
        if written:
            buffers[0] = memoryview(buffers[0])[written:]
    return calls


def _gather(parts):
    """The buffers of C{parts}: each run of small parts joined into one, big parts as they are."""
    buffers, run = [], []
    for part in parts:
        if len(part) < SMALL_PART:
            run.append(part)
            continue
        if run:
            buffers.append(b"".join(run))
            run = []
        buffers.append(part)
    if run:
        buffers.append(b"".join(run))
    return buffers


def little_endian_bytes(numbers):
    """The bytes of an array as little-endian numbers, whatever the machine's byte order."""
    if sys.byteorder != "little":
        numbers = array(numbers.typecode, numbers)
        numbers.byteswap()
    return numbers.tobytes()


def read_little_endian(typecode, data, offset=0, count=None):
    """An array of C{typecode} read from little-endian bytes of C{data} (C{count} numbers from
    C{offset}, or all that follow), in the machine's byte order."""
    numbers = array(typecode)
    end = None if count is None else offset + numbers.itemsize * count
    numbers.frombytes(data[offset:end])
    if sys.byteorder != "little":
        numbers.byteswap()
    return numbers
