"""Measuring the free space of the data directory for the disk alarm
(L{brokerd.model.disk_alarm.DiskAlarm}), and reading C{--disk-free-limit}.

L{FreeSpaceMonitor} measures on a timer whose period the alarm picks (from
every 0.1 s close to the limit to every 10 s far from it, every second while
raised), and at once when a store commit fails for want of space. A measure
is one C{statvfs} call, which on a local file system answers from memory
without blocking, so it runs on the reactor thread. The free bytes are those
an unprivileged process may use (C{f_bavail}), as C{df} shows them and as
RabbitMQ measures them.
"""

import os
import re

from twisted.logger import Logger

from brokerd.storage.durability import is_out_of_space

log = Logger()

# RabbitMQ's units (rabbit_resource_monitor_misc): k, kiB, M, MiB, G, GiB (any case) are
# powers of 1024; kB, MB, GB are powers of 1000.
_INFORMATION_UNIT = re.compile(
    r"^(?P<number>[0-9]+)(?P<unit>kB|KB|MB|GB|kb|mb|gb|Kb|Mb|Gb|mB|gB|kiB|KiB|MiB|GiB|kib|mib"
    r"|gib|KIB|MIB|GIB|k|K|m|M|g|G)?$"
)
_MULTIPLIERS = {"k": 1024, "m": 1024**2, "g": 1024**3, "kib": 1024, "mib": 1024**2,
                "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}
MEM_RELATIVE = "mem_relative:"


def total_memory():
    """The machine's physical memory in bytes (0 where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 0


def parse_disk_free_limit(text, memory=None):
    """
    Bytes of C{--disk-free-limit}: a number of bytes with one of RabbitMQ's
    units (C{50MB}, C{2GB}, C{512MiB}, C{1G}), or C{mem_relative:R}, R times
    the physical memory (C{memory} bytes if given), as RabbitMQ's
    C{disk_free_limit.relative}.

    @raise ValueError: naming the text if it is neither.
    """
    text = text.strip()
    if text.startswith(MEM_RELATIVE):
        ratio = text[len(MEM_RELATIVE):]
        try:
            value = float(ratio)
            if not value >= 0 or value == float("inf"):
                raise ValueError
        except ValueError:
            raise ValueError(f"{ratio!r} is not a non-negative ratio of the memory") from None
        return round(value * (total_memory() if memory is None else memory))
    match = _INFORMATION_UNIT.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a size; use bytes with a unit as RabbitMQ's disk_free_limit"
            " (50MB, 2GB, 512MiB, 1G) or mem_relative:RATIO"
        )
    unit = match["unit"]
    return int(match["number"]) * (_MULTIPLIERS[unit.lower()] if unit else 1)


def free_bytes(directory):
    """Bytes free for an unprivileged writer on the file system of C{directory}."""
    found = os.statvfs(directory)
    return found.f_bavail * found.f_frsize


class FreeSpaceMonitor:
    """
    Measures the free space of C{directory} for C{alarm}, on C{clock}'s timers.

    @param measure: C{measure()} returns the free bytes (default: L{free_bytes}
        of C{directory}); it may raise C{OSError}.
    """

    def __init__(self, alarm, directory, clock, measure=None):
        self.alarm = alarm
        self.directory = directory
        self._clock = clock
        self._measure = measure if measure is not None else (lambda: free_bytes(directory))
        self._call = None
        self._failing = False  # the last measure failed (logged once)

    def start(self):
        """Measure now, and from then on as the alarm asks."""
        self._check()
        log.info(
            "disk free limit {limit} bytes (--disk-free-limit); {free} bytes free in {directory}",
            limit=self.alarm.limit, free=self.alarm.free, directory=self.directory,
        )

    def stop(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def commit_failed(self, failure):
        """A store commit failed: if it was for want of space, raise the alarm and measure now."""
        if not is_out_of_space(failure):
            return
        self.alarm.write_failed(self._free())
        self._schedule()

    def _check(self):
        self._call = None
        free = self._free()
        if free is not None:
            self.alarm.measured(free)
        self._schedule()

    def _schedule(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = self._clock.callLater(self.alarm.next_check_in(), self._check)

    def _free(self):
        """The free bytes now, or None (logged once a run) if they cannot be measured."""
        try:
            free = self._measure()
        except OSError as problem:
            if not self._failing:
                self._failing = True
                log.error("cannot measure the free space of {directory}: {problem}",
                          directory=self.directory, problem=problem)
            return None
        self._failing = False
        return free
