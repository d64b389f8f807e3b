"""Giving memory the broker has freed back to the system.

When a burst ends (a client that held tens of megabytes of half-sent bodies goes
away, a backlog past the watermark drains), Python frees the objects, but glibc's
allocator keeps the freed pages of its heap unless they happen to sit at its top,
so the broker's resident memory can stay at its peak for good. After such an
event L{FreedMemory} asks glibc (C{malloc_trim}) to hand every free page back. It
does nothing where the C library has no such call.
"""

import ctypes
import ctypes.util

from twisted.logger import Logger

log = Logger()


def _malloc_trim():
    """glibc's C{malloc_trim}, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class FreedMemory:
    """Returns freed heap pages to the system once per reactor turn in which it was asked to."""

    def __init__(self, reactor, trim=None):
        """C{trim}: the call that returns free pages (default: glibc's C{malloc_trim(0)})."""
        self._reactor = reactor
        self._trim = trim if trim is not None else _malloc_trim()
        self._pending = None

    def give_back_soon(self):
        """Return freed pages after the current reactor turn, when what it released is gone too."""
        if self._trim is None or self._pending is not None:
            return
        self._pending = self._reactor.callLater(0, self._give_back)

    def _give_back(self):
        self._pending = None
        self._trim(0)
        log.info("freed memory given back to the system")
