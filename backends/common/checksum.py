"""CRC-32 of message bodies without letting go of the interpreter lock.

zlib.crc32 releases the lock while it checksums more than 5 KiB. Between two
threads that both run Python code (the reactor and a store's writer) each
release costs the releasing thread a wait to get the lock back: the other
keeps it until its next system call, or for the 5 ms switch interval. With
64 KiB messages that is a wait per message, and the writer spent half its
time waiting instead of writing. L{crc32} checksums in slices small enough
for zlib to keep the lock, so a thread lets go of it only where it waits for
the disk or the network anyway.
"""

import zlib

SLICE = 4096  # zlib.crc32 keeps the lock for up to 5 KiB


def crc32(data, value=0):
    """zlib.crc32(C{data}, C{value}), computed without releasing the interpreter lock."""
    if len(data) <= SLICE:
        return zlib.crc32(data, value)
    crc = zlib.crc32
    with memoryview(data) as view:
        view = view.cast("B")
        for start in range(0, len(view), SLICE):
            value = crc(view[start : start + SLICE], value)
    return value
