"""What the cross-backend validation says on stderr while it runs.

The workload runner hands L{WorkloadProgress} a snapshot of its counters
(L{WorkloadCounts}) every time it looks at its clients; the meter keeps the
current rate over a sliding window (not the mean since the start, which hides
a stall or a slow phase) and the ETA of publishing, and now and then passes a
status line to its output. On a terminal (L{TerminalOutput}) that line is
rewritten in place a few times a second and the finished run's line stays;
anywhere else (L{PlainOutput}: a pipe, a file, a callable collecting lines) it
is a plain line every few seconds, with no carriage returns or escape codes,
so logs stay readable. L{ProgressPrinter} is what
L{spark_jobs.validate_backends} hands around: the lines of its steps and a
meter per workload, or nothing at all with C{--quiet}.
"""

import collections
import contextlib
import os
import sys
import time
from dataclasses import dataclass

LIVE_INTERVAL = 0.3  # seconds between rewrites of a terminal's status line (about 3 a second)
PLAIN_INTERVAL = 5.0  # seconds between plain progress lines when the output is not a terminal
RATE_WINDOW = 5.0  # seconds of snapshots the current rate is measured over
# Seconds between the snapshots a rate keeps (the runner may look far more often).
SAMPLE_INTERVAL = 0.05
FALLBACK_COLUMNS = 80  # width of a terminal that does not say how wide it is
ERASE_TO_END_OF_LINE = "\x1b[K"


@dataclass(frozen=True)
class WorkloadCounts:
    """One look at a run's counters, summed over its clients."""

    published: int
    confirmed: int
    delivered: int
    crashes: int = 0


class RecentRate:
    """
    Events per second over the last C{window} seconds of C{(time, running
    count)} samples: the newest sample against the newest one at or before the
    window's start (or the oldest, early on), so a slowdown shows within one
    window instead of being averaged into the whole run.
    """

    def __init__(self, window=RATE_WINDOW):
        self.window = window
        self._samples = collections.deque()

    def add(self, t, count):
        self._samples.append((t, count))
        while len(self._samples) >= 2 and self._samples[1][0] <= t - self.window:
            self._samples.popleft()

    @property
    def last_time(self):
        """The time of the newest sample; None before the first."""
        return self._samples[-1][0] if self._samples else None

    @property
    def per_second(self):
        """The recent rate; 0.0 until two samples some time apart were added."""
        if len(self._samples) < 2:
            return 0.0
        (first_t, first_count), (last_t, last_count) = self._samples[0], self._samples[-1]
        return (last_count - first_count) / (last_t - first_t) if last_t > first_t else 0.0


def duration_text(seconds):
    """C{7} -> C{"7s"}, C{75} -> C{"1m15s"}, C{3725} -> C{"1h02m"}."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def eta_text(remaining, per_second):
    """When C{remaining} events will be done at C{per_second}: C{"ETA 1m15s"}, or C{"ETA --"}
    while nothing moves."""
    if remaining <= 0:
        return "ETA 0s"
    if per_second <= 0:
        return "ETA --"
    return f"ETA {duration_text(remaining / per_second)}"


def short_count(number):
    """C{9999} -> C{"9,999"}, C{45678} -> C{"45.7k"}, C{1000000} -> C{"1.00M"}: a count in a few
    characters."""
    if number < 10_000:
        return f"{number:,}"
    if number < 1_000_000:
        return f"{number / 1000:.1f}k"
    return f"{number / 1_000_000:.2f}M"


def counts_text(counts, planned):
    """C{"published 450/1,000, confirmed 440/1,000, delivered 610"}; deliveries have no fixed plan
    (fan-out, nacks and crashes redeliver)."""
    return (f"published {counts.published:,}/{planned:,},"
            f" confirmed {counts.confirmed:,}/{planned:,},"
            f" delivered {counts.delivered:,}")


def summary_line(label, counts, planned, seconds, done=False):
    """A run's counts with its mean publish rate over C{seconds}: the line a finished run leaves
    (C{done}), or what a stalled one had done."""
    return (f"{label}: {'done, ' if done else ''}{counts_text(counts, planned)} in {seconds:.0f} s"
            f" ({counts.published / max(seconds, 1e-9):,.0f} published/s),"
            f" crashes {counts.crashes}")


class TerminalOutput:
    """
    Progress on a terminal: L{status} rewrites the current line in place
    (carriage return, the text, erase to the end of the line), in its short
    form when the full one is wider than the terminal and cut to the width
    (a line that wrapped could not be rewritten); L{line} writes a line that
    stays, over the status line if one is shown.
    """

    interval = LIVE_INTERVAL
    first_status_after = 0.0  # a terminal shows the line at once

    def __init__(self, stream):
        self.stream = stream
        self.status_shown = False

    def status(self, text, short=None):
        """Shows C{text} (or C{short}, when C{text} is too wide) in place of the current status
        line."""
        room = self._columns() - 1
        if len(text) > room and short:
            text = short
        self.stream.write(f"\r{text[:room]}{ERASE_TO_END_OF_LINE}")
        self.stream.flush()
        self.status_shown = True

    def line(self, text):
        """Shows C{text} on a line of its own that stays."""
        self.stream.write(f"\r{text}{ERASE_TO_END_OF_LINE}\n" if self.status_shown else f"{text}\n")
        self.stream.flush()
        self.status_shown = False

    def end_status(self):
        """Leave the status line as it is and move below it (before anything else writes to the
        terminal)."""
        if self.status_shown:
            self.stream.write("\n")
            self.stream.flush()
            self.status_shown = False

    def _columns(self):
        """The terminal's width now (it may have been resized since the last line)."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
        return columns or FALLBACK_COLUMNS


class PlainOutput:
    """Progress as plain lines, each handed to C{write_line}: a status every L{PLAIN_INTERVAL}
    seconds, no control characters."""

    interval = PLAIN_INTERVAL
    # A log gets its first line after one interval, not a line of zeros.
    first_status_after = PLAIN_INTERVAL

    def __init__(self, write_line):
        self.write_line = write_line

    def status(self, text, short=None):
        """Writes C{text} as a line (a log has room for the full form)."""
        self.write_line(text)

    def line(self, text):
        self.write_line(text)

    def end_status(self):
        """Nothing to do: every line is already complete."""


def output_for(stream):
    """L{TerminalOutput} when C{stream} is a terminal, else L{PlainOutput} printing lines on it."""
    if stream.isatty():
        return TerminalOutput(stream)
    return PlainOutput(lambda text: print(text, file=stream, flush=True))


class WorkloadProgress:
    """
    One run's meter: takes snapshots of its counts (L{update}) and shows, at
    most every C{output.interval} seconds, what was published, confirmed and
    delivered, the current publish rate and the ETA of publishing (once
    publishing is over, the current delivery rate instead); called with a
    line, it shows that line for good (the run's final figures).

    @param prefix: put before every line, e.g. C{"[1/3] "}.
    @param clock: where L{update} takes the time when not given one.
    """

    def __init__(self, output, label, planned, prefix="", clock=time.monotonic, window=RATE_WINDOW):
        self.output = output
        self.label = label
        self.planned = planned
        self.prefix = prefix
        self.clock = clock
        self.publish_rate = RecentRate(window)
        self.deliver_rate = RecentRate(window)
        self.started = None
        self.next_status = None

    def update(self, counts, now=None):
        """A snapshot of the run's counts at C{now} (the clock's time by default); shows a status
        line when due."""
        now = self.clock() if now is None else now
        if self.started is None:
            self.started = now
            self.next_status = now + self.output.first_status_after
        last = self.publish_rate.last_time
        if last is None or now - last >= SAMPLE_INTERVAL:
            self.publish_rate.add(now, counts.published)
            self.deliver_rate.add(now, counts.delivered)
        if now >= self.next_status:
            self.next_status = now + self.output.interval
            self.output.status(self.status_text(counts, now),
                               self.status_text(counts, now, short=True))

    def status_text(self, counts, now, short=False):
        """The status line for C{counts} seen at C{now}; C{short}: the few words that fit a narrow
        terminal."""
        remaining = self.planned - counts.published
        publishing, delivering = self.publish_rate.per_second, self.deliver_rate.per_second
        title = f"{self.prefix}{self.label}:"
        if short:
            pace = (f"{publishing:,.0f}/s {eta_text(remaining, publishing)}" if remaining > 0
                    else f"delivering {delivering:,.0f}/s")
            return (f"{title} pub {short_count(counts.published)}/{short_count(self.planned)}"
                    f" conf {short_count(counts.confirmed)}"
                    f" del {short_count(counts.delivered)} {pace}")
        pace = (f"{publishing:,.0f} msgs/s, {eta_text(remaining, publishing)}" if remaining > 0
                else f"publishing done, delivering {delivering:,.0f} msgs/s")
        return (f"{title} {counts_text(counts, self.planned)} | {pace}"
                f" | {duration_text(now - self.started)}, crashes {counts.crashes}")

    def __call__(self, line):
        """Shows C{line} for good, over the status line on a terminal."""
        self.output.line(self.prefix + line)

    def close(self):
        """The run is over, finished or not: a status line still shown stays, and later output goes
        below it."""
        self.output.end_status()


class ProgressPrinter:
    """
    The validation's progress: called with a line, it shows that line (a
    step starting or ending); L{workload} gives the meter of one run. Without
    an output (C{--quiet}) it shows nothing.
    """

    def __init__(self, output=None, prefix=""):
        self.output = output
        self.prefix = prefix

    @classmethod
    def to_stream(cls, stream):
        """Progress on C{stream}: in place on a terminal, plain lines elsewhere."""
        return cls(output_for(stream))

    def __call__(self, line):
        if self.output is not None:
            self.output.line(line)

    def for_backend(self, number, count):
        """This printer, with the meters of its workloads numbered C{[number/count]}."""
        return ProgressPrinter(self.output, f"[{number}/{count}] ")

    def workload(self, label, planned):
        """The meter of a run of C{planned} messages labelled C{label}; None when quiet."""
        if self.output is None:
            return None
        return WorkloadProgress(self.output, label, planned, self.prefix)

    @contextlib.contextmanager
    def quieted(self, log_path):
        """
        When quiet, a context in which whatever writes to this process's
        stderr (file descriptor 2), such as the Spark JVM started in it and its
        log4j lines, writes to C{log_path} instead; otherwise nothing changes.
        """
        if self.output is not None:
            yield
            return
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            with open(log_path, "ab") as log:
                os.dup2(log.fileno(), 2)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def workload_meter(progress, label, planned):
    """
    The meter C{run_workload(progress=...)} feeds: for C{None} or C{False}
    none; for C{True} one on stderr (in place on a terminal); for a
    L{ProgressPrinter} its meter; for any other callable one handing it plain
    lines.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        return WorkloadProgress(output_for(sys.stderr), label, planned)
    if isinstance(progress, ProgressPrinter):
        return progress.workload(label, planned)
    if callable(progress):
        return WorkloadProgress(PlainOutput(progress), label, planned)
    raise TypeError(f"progress must be None, True, a ProgressPrinter or a callable taking a line,"
                    f" not {progress!r}")
