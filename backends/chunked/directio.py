"""Writing a chunk's records with O_DIRECT through one reused, aligned buffer.

Buffered writes make the kernel find a fresh page-cache page for every 4 KiB
written, which at hundreds of MB/s costs more CPU than anything else the
broker does; with O_DIRECT the bytes go from one buffer, reused for every
write, straight to the disk. Direct writes must start and end on block
boundaries, so the writer keeps the bytes of the last, partly filled block and
writes that block again, completed, with the next batch; what follows the
last record in the file is always zeros.

Where the file system refuses O_DIRECT (tmpfs, say) the same writer works on
an ordinary descriptor.
"""

import errno
import fcntl
import mmap
import os

BLOCK = 4096
STAGING_SIZE = 8 << 20  # bytes copied into the buffer before it is written out


def open_for_writing(path, create=False):
    """A descriptor of C{path} for L{AlignedWriter}, with O_DIRECT if the file system allows it."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, 0o644)
        except OSError:
            pass
    return os.open(path, flags, 0o644)


class AlignedWriter:
    """
    Appends bytes to one file from C{offset} on, in whole blocks.

    @param tail: the bytes of the file from the start of C{offset}'s block up
        to C{offset} (they are written again with the first flush).
    """

    def __init__(self, descriptor, offset, tail=b""):
        if len(tail) != offset % BLOCK:
            raise ValueError(f"the tail of a write at {offset} has {offset % BLOCK} bytes,"
                             f" not {len(tail)}")
        self.descriptor = descriptor
        self._buffer = mmap.mmap(-1, STAGING_SIZE)
        self._base = offset - len(tail)  # file offset of the buffer's first byte, block-aligned
        self._fill = len(tail)
        self._buffer[: len(tail)] = tail
        self.writes = 0

    @property
    def offset(self):
        """Where the next byte goes in the file."""
        return self._base + self._fill

    def write(self, data):
        """Add C{data} after what was added before; full buffers are written out at once."""
        view = memoryview(data)
        buffer, fill = self._buffer, self._fill
        while view:
            taken = min(len(view), STAGING_SIZE - fill)
            buffer[fill : fill + taken] = view[:taken]
            fill += taken
            view = view[taken:]
            if fill == STAGING_SIZE:
                self._fill = fill
                self._write_out(STAGING_SIZE)
                fill = 0
        self._fill = fill

    def flush(self):
        """Write out everything added so far: whole blocks, the last one padded with zeros."""
        fill = self._fill
        if fill == 0:
            return
        padded = -(-fill // BLOCK) * BLOCK
        self._buffer[fill:padded] = bytes(padded - fill)
        self._write_out(padded)

    def _write_out(self, size):
        """Write the buffer's first C{size} bytes (whole blocks) and keep only the partial last
        block."""
        view = memoryview(self._buffer)
        try:
            written = 0
            while written < size:
                part = view[written:size]
                try:
                    written += _pwrite(self.descriptor, part, self._base + written)
                finally:
                    # Released even when the write fails (a full disk): the error's traceback
                    # keeps the part, which would otherwise hold the buffer open for good.
                    part.release()
        finally:
            view.release()
        self.writes += 1
        keep = self._fill % BLOCK
        whole = self._fill - keep
        if keep and whole:
            self._buffer[:keep] = self._buffer[whole : whole + keep]
        self._base += whole
        self._fill = keep

    def close(self):
        self._buffer.close()


def write_block(descriptor, offset, data):
    """Write C{data}, padded with zeros to a whole block, at the block-aligned C{offset}."""
    buffer = mmap.mmap(-1, -(-len(data) // BLOCK) * BLOCK or BLOCK)
    try:
        buffer[: len(data)] = data
        view = memoryview(buffer)
        try:
            written = 0
            while written < len(buffer):
                part = view[written:]
                try:
                    written += _pwrite(descriptor, part, offset + written)
                finally:
                    part.release()  # as in AlignedWriter._write_out
        finally:
            view.release()
    finally:
        buffer.close()


def _pwrite(descriptor, data, offset):
    """pwrite; if the file system refuses a direct write (EINVAL: an alignment it
    wants bigger than a block), the descriptor goes on without O_DIRECT."""
    try:
        return os.pwrite(descriptor, data, offset)
    except OSError as problem:
        flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
        direct = getattr(os, "O_DIRECT", 0)
        if problem.errno != errno.EINVAL or not flags & direct:
            raise
        fcntl.fcntl(descriptor, fcntl.F_SETFL, flags & ~direct)
        return os.pwrite(descriptor, data, offset)
