"""CRC-32 of message bodies without letting go of the interpreter lock.

zlib.crc32 releases the lock while it checksums more than 5 KiB. Between two
threads that both run Python code (the reactor and a store's writer) each
release costs the releasing thread a wait to get the lock back: the other
keeps it until its next system call, or for the 5 ms switch interval. With
64 KiB messages that is a wait per message, and the writer spent half its
time waiting instead of writing. L{crc32} checksums in slices small enough
for zlib to keep the lock, so a thread lets go of it only where it waits for
the disk or the network anyway.

Where ISA-L's Python binding is installed (the C{isal} package: the same
CRC-32, computed with the processor's carry-less multiply, over ten times
faster than zlib's on 64 KiB), its C{crc32} is used in place of zlib's; it
keeps the lock for slices as small, too.
"""

import zlib

try:
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # no wheel for this platform: zlib's, slower, gives the same values
    _fast_crc32 = zlib.crc32

SLICE = 4096  # zlib.crc32 and ISA-L's keep the lock for up to 5 KiB


def crc32(data, value=0):
    """zlib.crc32(C{data}, C{value}), computed without releasing the interpreter lock."""
    if len(data) <= SLICE:
        return zlib.crc32(data, value)
    crc = _fast_crc32
    with memoryview(data) as view:
        view = view.cast("B")
        for start in range(0, len(view), SLICE):
            value = crc(view[start : start + SLICE], value)
    return value
