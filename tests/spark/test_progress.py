"""What the cross-backend validation shows while it runs: the current rate and
the ETA of publishing from snapshots of a run's counts, a status line rewritten
in place on a terminal and plain lines anywhere else, and on the command line:
progress by default, nothing but the results with --quiet."""

import fcntl
import io
import os
import pathlib
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from spark_jobs.analysis import STEPS
from spark_jobs.progress import (
    ERASE_TO_END_OF_LINE,
    PlainOutput,
    ProgressPrinter,
    RecentRate,
    TerminalOutput,
    WorkloadCounts,
    WorkloadProgress,
    duration_text,
    eta_text,
    output_for,
)
from tests.support.paths import ROOT
from tests.support.spark_driver import spark_environment

pytestmark = pytest.mark.long_module(seconds=90)  # two small validations side by side (tests/conftest.py)

PTY_READ_TIMEOUT = 60.0  # seconds to wait for what a terminal is expected to show
STEP = 0.125  # seconds between the snapshots the tests feed (exact in binary, so the times add up exactly)


def feed(meter, seconds, per_second, start=0.0, published=0):
    """Snapshots at C{start}, then every L{STEP} seconds for C{seconds}, C{per_second} more published in each
    second (every message confirmed and delivered twice); the last time and published count."""
    meter.update(WorkloadCounts(published, published, 2 * published), now=start)
    t = start
    for number in range(1, round(seconds / STEP) + 1):
        t = start + number * STEP
        published += round(per_second * STEP)
        meter.update(WorkloadCounts(published, published, 2 * published), now=t)
    return t, published


class Terminal:
    """A pseudo-terminal C{columns} wide: C{stream} writes to its terminal side, L{read_until} reads what it shows."""

    def __init__(self, columns=200):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        self.slave = slave
        self.stream = open(slave, "w", encoding="utf-8", closefd=False)
        self.shown = b""

    def read_until(self, ending, process=None):
        """What the terminal received up to and including C{ending} (or until C{process} ended)."""
        deadline = time.monotonic() + PTY_READ_TIMEOUT
        while not self.shown.endswith(ending) and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if ready:
                try:
                    self.shown += os.read(self.master, 65536)
                except OSError:  # every terminal side is closed
                    break
            elif process is not None and process.poll() is not None:
                break
        return self.shown.decode("utf-8")

    def close(self):
        self.stream.close()
        os.close(self.slave)
        os.close(self.master)


@pytest.fixture
def terminal():
    opened = Terminal()
    yield opened
    opened.close()


def test_the_rate_is_the_one_of_the_last_seconds_not_the_mean_since_the_start():
    rate = RecentRate(window=5.0)
    count = 0
    for step in range(1, 201):  # 10 s at 100 msgs/s, then 10 s at 1,000 msgs/s, a snapshot every 0.1 s
        count += 10 if step <= 100 else 100
        rate.add(step / 10, count)
    assert count / 20.0 == 550  # the mean since the start
    assert rate.per_second == pytest.approx(1000)
    for step in range(201, 231):  # publishing stops: within one window the rate says so
        rate.add(step / 10, count)
    assert 0 < rate.per_second < 500
    for step in range(231, 261):
        rate.add(step / 10, count)
    assert rate.per_second == 0


def test_a_rate_needs_two_snapshots_some_time_apart():
    rate = RecentRate()
    assert rate.per_second == 0
    rate.add(3.0, 500)
    rate.add(3.0, 600)
    assert rate.per_second == 0
    rate.add(3.5, 700)
    assert rate.per_second == pytest.approx(400)


def test_the_eta_is_what_is_left_to_publish_at_the_current_rate():
    assert eta_text(9000, 1000.0) == "ETA 9s"
    assert eta_text(150_000, 1000.0) == "ETA 2m30s"
    assert eta_text(7_200_000, 1000.0) == "ETA 2h00m"
    assert eta_text(9000, 0.0) == "ETA --"
    assert eta_text(0, 0.0) == "ETA 0s"
    assert duration_text(59.6) == "1m00s"


def test_the_meter_shows_the_recent_rate_and_the_eta_and_says_so_when_publishing_stalls():
    meter = WorkloadProgress(PlainOutput([].append), "sqlite", 100_000)
    t, published = feed(meter, 10, 80)  # 800 published in 10 s
    t, published = feed(meter, 10, 800, start=t, published=published)  # then 8,000 more in 10 s
    assert (t, published) == (20.0, 8800)
    assert meter.status_text(WorkloadCounts(published, published - 5, 2 * published, crashes=1), t) == (
        "sqlite: published 8,800/100,000, confirmed 8,795/100,000, delivered 17,600"
        " | 800 msgs/s, ETA 1m54s | 20s, crashes 1")  # 91,200 to go at 800/s, not at the mean 440/s
    t, published = feed(meter, 10, 0, start=t, published=published)
    assert meter.status_text(WorkloadCounts(published, published, 2 * published), t).endswith(
        "| 0 msgs/s, ETA -- | 30s, crashes 0")


def test_once_everything_is_published_the_meter_shows_the_delivery_rate():
    meter = WorkloadProgress(PlainOutput([].append), "chunked", 5000)
    t, published = feed(meter, 6.25, 800)
    assert meter.status_text(WorkloadCounts(published, published, 2 * published), t) == (
        "chunked: published 5,000/5,000, confirmed 5,000/5,000, delivered 10,000"
        " | publishing done, delivering 1,600 msgs/s | 6s, crashes 0")


def test_on_a_terminal_the_status_line_is_rewritten_in_place_a_few_times_a_second(terminal):
    output = output_for(terminal.stream)
    assert isinstance(output, TerminalOutput)
    printer = ProgressPrinter(output).for_backend(1, 2)
    meter = printer.workload("sqlite", 10_400)
    feed(meter, 3, 800)
    meter("sqlite: done, the final figures")
    printer("[1/2] sqlite: export started")
    shown = terminal.read_until(b"export started\r\n")
    rewritten, step, rest = shown.split("\r\n")
    *statuses, final = rewritten.split("\r")[1:]
    assert rewritten.startswith("\r") and "\n" not in rewritten and rest == ""
    assert 3 * 2 <= len(statuses) <= 3 * 4, statuses  # 3 s of snapshots
    assert all(status.endswith(ERASE_TO_END_OF_LINE) for status in statuses)
    assert statuses[0] == ("[1/2] sqlite: published 0/10,400, confirmed 0/10,400, delivered 0 | 0 msgs/s, ETA --"
                           " | 0s, crashes 0" + ERASE_TO_END_OF_LINE)
    assert statuses[-1] == ("[1/2] sqlite: published 2,400/10,400, confirmed 2,400/10,400, delivered 4,800"
                            " | 800 msgs/s, ETA 10s | 3s, crashes 0" + ERASE_TO_END_OF_LINE)
    # The finished run's line replaces the status line and stays; the next step goes below it.
    assert final == "[1/2] sqlite: done, the final figures" + ERASE_TO_END_OF_LINE
    assert step == "[1/2] sqlite: export started"


def test_on_a_narrow_terminal_the_status_line_is_the_short_form_and_never_wraps():
    narrow = Terminal(columns=70)
    try:
        meter = WorkloadProgress(output_for(narrow.stream), "chunked", 1_000_000, prefix="[3/3] ")
        feed(meter, 2, 20_000)
        meter.close()
        statuses = narrow.read_until(b"\r\n").removesuffix("\r\n").split("\r")[1:]  # the last one at 1.875 s
    finally:
        narrow.close()
    assert statuses
    assert all(len(status.removesuffix(ERASE_TO_END_OF_LINE)) <= 69 for status in statuses)
    assert statuses[-1] == "[3/3] chunked: pub 37.5k/1.00M conf 37.5k del 75.0k 20,000/s ETA 48s" + \
        ERASE_TO_END_OF_LINE


def test_elsewhere_the_progress_is_a_plain_line_every_few_seconds():
    stream = io.StringIO()
    output = output_for(stream)
    assert isinstance(output, PlainOutput)
    printer = ProgressPrinter(output).for_backend(2, 2)
    meter = printer.workload("filelog", 20_000)
    feed(meter, 12, 800)
    meter("filelog: done, the final figures")
    meter.close()
    lines = stream.getvalue().splitlines()
    assert lines[:2] == [
        "[2/2] filelog: published 4,000/20,000, confirmed 4,000/20,000, delivered 8,000 | 800 msgs/s, ETA 20s"
        " | 5s, crashes 0",
        "[2/2] filelog: published 8,000/20,000, confirmed 8,000/20,000, delivered 16,000 | 800 msgs/s, ETA 15s"
        " | 10s, crashes 0",
    ]
    assert lines[2:] == ["[2/2] filelog: done, the final figures"]
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_a_quiet_printer_shows_nothing_and_gives_no_meter():
    quiet = ProgressPrinter()
    quiet("a step")
    assert quiet.for_backend(1, 1).workload("sqlite", 100) is None


def test_the_workload_command_rewrites_its_line_in_place_when_stderr_is_a_terminal(terminal, tmp_path):
    command = [sys.executable, "-m", "spark_jobs.workload", "--backend", "sqlite", "--out", str(tmp_path / "run"),
               "--messages", "300"]
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=terminal.slave)
    try:
        shown = terminal.read_until(b"crashes 0" + ERASE_TO_END_OF_LINE.encode() + b"\r\n", process)
        stdout, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, shown
    assert b'"published": 300' in stdout
    statuses, final, line_end = shown.rsplit("\r", 2)
    assert line_end == "\n"
    assert "\rsqlite: published " in statuses and "\n" not in statuses
    assert re.fullmatch(r"sqlite: done, published 300/300, confirmed 300/300, delivered [\d,]+ in \d+ s"
                        r" \([\d,]+ published/s\), crashes 0" + re.escape(ERASE_TO_END_OF_LINE), final), final


@pytest.fixture(scope="module")
def small_validations(tmp_path_factory):
    """A small validation on sqlite run twice side by side, with --quiet and by default (stderr not a terminal):
    per run its output directory and finished process."""
    started = {}
    for name, flags in (("quiet", ["--quiet"]), ("default", [])):
        out = tmp_path_factory.mktemp(name)
        command = [sys.executable, "-m", "spark_jobs.validate_backends", "--backends", "sqlite", "--messages", "200",
                   "--driver-memory", "1g", "--out", str(out), *flags]
        started[name] = out, command, subprocess.Popen(command, cwd=ROOT, env=spark_environment(),
                                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finished = {}
    for name, (out, command, process) in started.items():
        stdout, stderr = process.communicate(timeout=600)
        finished[name] = out, subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    return finished


def test_quiet_prints_the_results_and_nothing_on_stderr(small_validations):
    out, finished = small_validations["quiet"]
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert finished.stderr == ""
    assert finished.stdout.splitlines()[0].startswith("backend    published")
    assert finished.stdout.splitlines()[-1] == "verdict: pass"
    assert f"report: {out / 'report.html'}" in finished.stdout
    assert (out / "spark.log").is_file()  # what the Spark JVM said instead


def test_by_default_without_a_terminal_the_steps_and_the_runs_are_plain_lines(small_validations):
    out, finished = small_validations["default"]
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert finished.stdout.splitlines()[-1] == "verdict: pass"
    assert "\r" not in finished.stderr and "\x1b" not in finished.stderr
    ours = [line for line in finished.stderr.splitlines()
            if line.startswith(("[1/1] sqlite:", "Spark job", "report "))]
    expected = [
        r"\[1/1\] sqlite: workload started",
        r"\[1/1\] sqlite: done, published 200/200, confirmed 200/200, delivered [\d,]+ in \d+ s"
        r" \([\d,]+ published/s\), crashes 0",
        r"\[1/1\] sqlite: export started",
        r"\[1/1\] sqlite: exported \d+ stored messages in \d+\.\d s",
        r"Spark job over sqlite",
        r"Spark job done in \d+\.\d s",
        r"report started",
        r"report written in \d+\.\d s",
    ]
    # A run of 200 messages may be short of the first periodic line: any there are are plain status lines.
    periodic = [line for line in ours if " | " in line]
    assert all(re.fullmatch(r"\[1/1\] sqlite: published [\d,]+/200, .* msgs/s.*", line) for line in periodic)
    ours = [line for line in ours if line not in periodic]
    # The Spark job names each of its steps as it ends: the session, then the analysis' steps in order.
    steps = [line for line in ours if line.startswith("Spark job: ")]
    assert [re.fullmatch(r"Spark job: (.+) done in \d+\.\d s", line).group(1) for line in steps] == [
        "session", *STEPS], steps
    ours = [line for line in ours if line not in steps]
    assert len(ours) == len(expected), ours
    for line, pattern in zip(ours, expected):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_quiet_and_progress_together_are_a_usage_error(tmp_path):
    command = [sys.executable, "-m", "spark_jobs.validate_backends", "--backends", "sqlite", "--quiet", "--progress",
               "--out", str(tmp_path / "report")]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 2
    assert "not allowed with argument" in finished.stderr
    assert finished.stdout == ""
    assert not (tmp_path / "report").exists()
