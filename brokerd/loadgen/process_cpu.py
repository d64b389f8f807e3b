"""How many cores a process kept busy over a stretch of wall time, read from /proc.

The throughput benchmarks print this for the broker next to each rate: 1.0 means one
core busy for the whole phase, 2.0 both cores of a 2-core machine. A process counts
with the processes it started (workers, if a broker runs any), so the figure is the
broker's whole CPU cost whatever its process layout.
"""

import os
import time

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
# /proc/PID/stat fields after the ")" that closes the command name:
# state is the first (field 3 of proc(5))
_PARENT = 1  # ppid, field 4
# utime, stime, cutime, cstime: fields 14-17
_USER, _SYSTEM, _CHILDREN_USER, _CHILDREN_SYSTEM = 11, 12, 13, 14


def _stat_fields(pid):
    """
    The fields of /proc/PID/stat after the command name, or None when there is
    no such process.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(b")") + 2:].split()


def descendants(pid):
    """The live processes started by C{pid}, their children and so on."""
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(name)
            if fields is not None:
                children.setdefault(int(fields[_PARENT]), []).append(int(name))
    found, waiting = [], list(children.get(pid, ()))
    while waiting:
        child = waiting.pop()
        found.append(child)
        waiting.extend(children.get(child, ()))
    return found


def cpu_seconds(pid):
    """
    User plus system CPU seconds used so far by process C{pid}, all its threads, its
    live descendants and the children they have reaped; None when C{pid} is gone.
    """
    fields = _stat_fields(pid)
    if fields is None:
        return None
    ticks = _ticks(fields)
    for child in descendants(pid):
        child_fields = _stat_fields(child)
        if child_fields is not None:  # it may have exited since the listing
            ticks += _ticks(child_fields)
    return ticks / CLOCK_TICKS_PER_SECOND


def _ticks(fields):
    return (int(fields[_USER]) + int(fields[_SYSTEM]) + int(fields[_CHILDREN_USER])
            + int(fields[_CHILDREN_SYSTEM]))


class CpuWindow:
    """
    The CPU use of process C{pid} from L{start} on: L{cores_busy} is its CPU
    seconds divided by the wall seconds since then. A None C{pid} (a broker that
    is not ours to read) gives None, as does a process that is gone.
    """

    def __init__(self, pid):
        self.pid = pid
        self.started_cpu = self.started_at = None

    def start(self):
        """Begin the window now; call it just before the phase's clock starts."""
        if self.pid is not None:
            self.started_cpu = cpu_seconds(self.pid)
            self.started_at = time.perf_counter()
        return self

    def cpu_seconds(self):
        """CPU seconds used since L{start}, or None."""
        if self.started_cpu is None:
            return None
        now = cpu_seconds(self.pid)
        return None if now is None else now - self.started_cpu

    def cores_busy(self):
        """
        CPU seconds over wall seconds since L{start} (1.0 = one core busy
        throughout), or None.
        """
        if self.started_cpu is None:
            return None
        used = self.cpu_seconds()
        elapsed = time.perf_counter() - self.started_at
        if used is None or elapsed <= 0:
            return None
        return used / elapsed


def format_cores(cores):
    """A cores-busy figure as the tables print it: C{0.97}, or C{n/a} when it could not be read."""
    return "n/a" if cores is None else f"{cores:.2f}"
