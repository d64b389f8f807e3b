"""What the tests of the benchmarks that start systems of their own (``benchmarks.cluster_throughput``,
``benchmarks.versus_rabbitmq``) check them with: which processes they said they started, whether those are
gone, where they worked, and a run stopped with SIGTERM once it measures."""

import queue
import signal
import subprocess
import threading

from tests.support.paths import ROOT


def gone(pid):
    """True once process C{pid} has exited (a zombie, reparented and not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def started_pids(stderr_lines):
    """The process ids the benchmark said its systems run as (its ``LABEL up: NAME pid PID, ...`` lines)."""
    pids = []
    for line in stderr_lines:
        if " up: " in line:
            pids += [int(part.rpartition(" pid ")[2]) for part in line.partition(" up: ")[2].split(", ")]
    return pids


def working_directory(stderr_lines):
    return next(line.removeprefix("working in ").strip() for line in stderr_lines if line.startswith("working in "))


def stopped_once_measuring(command):
    """
    Runs C{command}, sends it SIGTERM once it says it measures its first round, and expects it to exit with
    status 1; the lines it wrote to stderr, to its end.
    """
    benchmark = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines, arrived = [], queue.Queue()
    threading.Thread(target=lambda: [arrived.put(line) for line in benchmark.stderr] + [arrived.put(None)],
                     daemon=True).start()
    try:
        while not lines or not lines[-1].startswith("round 1"):  # measuring, with every system up
            line = arrived.get(timeout=120)
            assert line is not None, lines
            lines.append(line)
        benchmark.send_signal(signal.SIGTERM)
        assert benchmark.wait(120) == 1
    finally:
        if benchmark.poll() is None:
            benchmark.kill()
            benchmark.wait()
    while (line := arrived.get(timeout=10)) is not None:
        lines.append(line)
    return lines
