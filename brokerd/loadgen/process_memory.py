"""How much memory a process and everything it started keep resident, read from /proc.

The validation's Spark benchmark prints the peak of this for the job's driver
side: the Python driver, the Spark JVM it launches (in local mode the
executors run inside it) and the Python workers that JVM starts.
"""

import threading

from brokerd.loadgen.process_cpu import descendants

KIB = 1024


def resident_bytes(pid):
    """
    Process C{pid}'s resident set (VmRSS), in bytes; None when it is gone (or a
    zombie without one).
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * KIB
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def tree_resident_bytes(pid):
    """
    The resident sets of C{pid} and its live descendants, added up, in bytes;
    None when C{pid} is gone.
    """
    own = resident_bytes(pid)
    if own is None:
        return None
    return own + sum(resident_bytes(child) or 0 for child in descendants(pid))


class PeakResidentMemory:
    """
    Samples L{tree_resident_bytes} of C{pid} every C{interval} seconds on a
    thread, from L{start} to L{stop}, keeping the largest: a figure between
    two samples can be missed, so the interval should be short against the
    phases measured.
    """

    def __init__(self, pid, interval=0.25):
        self.pid = pid
        self.interval = interval
        self.peak_bytes = 0
        self.samples = 0
        self.sampled = threading.Event()  # set once the first sample is taken
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=f"rss-of-{pid}", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _sample(self):
        while True:
            size = tree_resident_bytes(self.pid)
            if size is not None:
                self.peak_bytes = max(self.peak_bytes, size)
                self.samples += 1
                self.sampled.set()
            if self._stopped.wait(self.interval):
                return

    def stop(self):
        """Stops sampling (after one last sample); the peak in bytes."""
        self._stopped.set()
        self._thread.join()
        return self.peak_bytes
