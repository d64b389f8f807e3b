"""Kill the broker with SIGKILL under load, restart it, and check what came back.

L{CrashLoop} runs the cycles, on the command line and in tests/backends/test_crash_recovery.py:

    python -m crashloop --backend filelog --kills 100
"""

import argparse
import importlib.util
import json
import os
import pathlib
import random
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

from brokerd.loadgen.amqp_codec import BenchmarkError
from brokerd.storage.registry import available_backends
from brokerd.testing import BrokerProcess
from crashloop.check import QUEUE, check_recovery, drain
from crashloop.logs import ACKED_LOG, ACKS_SENT_LOG, CONFIRMED_LOG, read_confirmed, read_ids

ROOT = pathlib.Path(__file__).resolve().parent.parent
DURABLE_BACKENDS = ("filelog", "sqlite", "chunked")
# What a broker prints when something failed in it (twistd log levels, tracebacks).
FAILURE_MARKS = ("Traceback", "Unhandled", "#critical]", "#error]")
RECOVERED = re.compile(r"recovered .* \((?P<unavailable>\d+) unavailable\), .* and (?P<messages>\d+) messages from")
DEADLINE = 60.0  # seconds for any one wait on a subprocess


class CrashCheckFailed(AssertionError):
    """What came back after a crash is not what the broker promised, or a step of the cycle failed."""


def backend_installed(name):
    """
    True if backend C{name} is registered and its module exists (a package
    directory without its __init__.py, still being written, does not count).
    A backend that exists but fails to load is not skipped: that is a failure.
    """
    entry = available_backends().get(name)
    if entry is None:
        return False
    module = entry.value.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    return spec is not None and spec.origin is not None


class LineReader:
    """Lines from a subprocess's stdout pipe, each wait bounded by a deadline (no sleeping)."""

    def __init__(self, pipe):
        self.fd = pipe.fileno()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        self.buffer = b""
        self.eof = False

    def next_line(self, deadline):
        """The next line (without its newline), None at end of output; raises TimeoutError after C{deadline}."""
        while b"\n" not in self.buffer:
            if self.eof:
                if self.buffer:
                    line, self.buffer = self.buffer, b""
                    return line.decode()
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no output line before the deadline")
            if self.selector.select(remaining):
                data = os.read(self.fd, 65536)
                if data:
                    self.buffer += data
                else:
                    self.eof = True
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def close(self):
        self.selector.close()


def broker_failures(output, start=0):
    return [line for line in output[start:] if any(mark in line for mark in FAILURE_MARKS)]


def tail(lines, count=25):
    return "\n".join(lines[-count:])


class CrashLoop:
    """
    A chain of crash cycles on one data directory. Each cycle:

      1. with the broker running, start L{crashloop.client} in its own
         process: publishers send persistent messages with confirms to a durable
         queue while a consumer acks most of what it gets, logging the confirmed
         ids and the acks known to be durable (see L{crashloop.roles});
      2. SIGKILL the broker once the client has seen a seeded random number of
         confirms (read from the client's progress lines, with a deadline);
      3. restart the broker on the same data directory, drain the queue and check:
         every confirmed message that was never acked is delivered again; no
         durably acked message comes back (one acked without proof of durability
         may or may not: its ack may have ridden on any later commit); every body
         passes its checksum and keeps its properties; nothing comes back twice or
         was never published; each publisher's messages come back in publish
         order. The drain acks everything and makes its acks durable (a confirmed
         marker publish on the same channel), so the next cycle starts from an
         empty queue and a message of an earlier cycle coming back is a failure.
         The messages acked without proof that came back are counted per cycle.

    The same code runs a few cycles per backend in tests/backends/test_crash_recovery.py
    and hundreds from the command line. A failed check stops the loop, raising
    L{CrashCheckFailed} with what went wrong and both brokers' last log lines,
    and leaves the data directory in place.

    @ivar results: one dict of figures per completed cycle.
    """

    def __init__(self, backend, workdir, seed, sync="always", max_kill_confirms=4000, publishers=2,
                 messages=50_000, say=None):
        self.backend = backend
        self.workdir = pathlib.Path(workdir)
        self.data_dir = self.workdir / "data"
        self.seed = seed
        self.sync = sync
        self.max_kill_confirms = max_kill_confirms
        self.publishers = publishers
        self.messages = messages
        self.say = say or (lambda text: None)
        self.rng = random.Random(f"crash-loop/{backend}/{seed}")
        # What the client of the last cycle logged; the checks after its restart compare against it.
        self.run_number = 0
        self.confirmed = {}  # publisher -> [(first, last)]
        self.sent = {}  # publisher -> published
        self.durably_acked = set()
        self.acks_sent = set()
        self.broker = None
        self.killed_output = []
        self.results = []
        self.final_stats = None

    # -- the broker

    def start_broker(self):
        """Start the broker on the data directory; returns seconds until it listened (recovery included)."""
        started = time.monotonic()
        self.broker = BrokerProcess(
            [f"--backend={self.backend}", "--data-dir", str(self.data_dir), f"--sync={self.sync}",
             "--native", "none", "--amqp", "tcp:0:interface=127.0.0.1"],
            cwd=self.workdir,
        )
        try:
            address = self.broker.wait_listening("AMQP", timeout=DEADLINE * 2)
        except AssertionError as problem:
            self.broker.kill()
            raise self.failure("the broker did not start", str(problem)) from None
        _, self.host, port = address.split(":")
        self.port = int(port)
        return time.monotonic() - started

    def failure(self, what, *details):
        text = [f"{self.backend} (seed {self.seed}, --sync={self.sync}), cycle {len(self.results) + 1}: {what}"]
        text.extend(details)
        if self.killed_output:
            text.append("last lines of the killed broker:\n" + tail(self.killed_output))
        if self.broker is not None:
            text.append("last lines of the running broker:\n" + tail(self.broker.output))
        text.append(f"data directory: {self.data_dir}")
        return CrashCheckFailed("\n".join(text))

    # -- the loop

    def run(self, kills):
        """Run C{kills} crash cycles, then stop the broker cleanly; returns the per-cycle figures."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_broker()
        try:
            self.drain_and_check()  # declares the queues; nothing to find yet
            for _ in range(kills):
                self.results.append(self.cycle(len(self.results) + 1))
                self.say(self.describe(self.results[-1]))
        except BaseException:
            if self.broker is not None:
                self.broker.kill()
            raise
        status = self.broker.stop()
        stats = [line for line in self.broker.output if "store stats at stop:" in line]
        if not stats:
            raise self.failure(f"the broker stopped with status {status} without logging its store stats")
        self.final_stats = json.loads(stats[-1].split("store stats at stop:", 1)[1])
        bad = broker_failures(self.broker.output)
        if bad:
            raise self.failure("the last broker logged failures", *bad)
        return self.results

    def cycle(self, run):
        target = self.rng.randint(1, self.max_kill_confirms)
        consume_after = self.rng.randint(0, target // 2)
        out = self.workdir / f"run-{run}"
        out.mkdir()
        with open(out / "client.stderr", "w") as stderr:
            client = subprocess.Popen(
                [sys.executable, "-m", "crashloop.client", "--host", self.host, "--port", str(self.port),
                 "--queue", QUEUE, "--out", str(out), "--run", str(run), "--seed", str(self.rng.getrandbits(32)),
                 "--publishers", str(self.publishers), "--messages", str(self.messages),
                 "--consume-after", str(consume_after)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr,
            )
        reader = LineReader(client.stdout)
        try:
            progress = self.wait_for_confirms(reader, target)
            self.broker.kill()
            summary = self.client_summary(reader, client, out)
        except BaseException:
            if client.poll() is None:
                client.kill()
                client.wait(DEADLINE)
            raise
        finally:
            reader.close()
            client.stdout.close()
        self.killed_output = list(self.broker.output)
        bad = broker_failures(self.killed_output)
        if bad:
            raise self.failure("the broker logged failures before it was killed", *bad)
        if summary.get("corrupt") or summary.get("problems"):
            raise self.failure("the client saw bad deliveries before the crash",
                               *summary.get("corrupt", []), *summary.get("problems", []))
        self.run_number = run
        self.sent = {int(publisher): figures["sent"] for publisher, figures in summary["publishers"].items()}
        self.confirmed = {}
        for publisher, first, last, acked in read_confirmed(out / CONFIRMED_LOG):
            if acked:
                self.confirmed.setdefault(publisher, []).append((first, last))
        self.durably_acked = read_ids(out / ACKED_LOG)
        self.acks_sent = read_ids(out / ACKS_SENT_LOG)
        restart_seconds = self.start_broker()
        warnings = [line for line in self.broker.output if "#warn]" in line]
        recovered, acked_came_back = self.drain_and_check()
        return {
            "run": run,
            "kill_target": target,
            "confirmed_at_kill": progress[0],
            "confirmed": sum(f["confirmed"] for f in summary["publishers"].values()),
            "published": sum(f["sent"] for f in summary["publishers"].values()),
            "delivered": summary.get("delivered", 0),
            "acks_sent": len(self.acks_sent),
            "acked_durable": len(self.durably_acked),
            "held_unacked": summary.get("held", 0),
            "recovered": recovered,
            "acked_came_back": acked_came_back,
            "restart_s": restart_seconds,
            # What the store said about the crash at its restart (torn tails dropped, say), and
            # whether the killed broker had logged compactions: context for the figures, not checks.
            "restart_warnings": len(warnings),
            "restart_warning_lines": warnings[:5],
            "compactions_before_kill": sum("compact" in line for line in self.killed_output),
        }

    def wait_for_confirms(self, reader, target):
        """Read the client's progress until it has seen C{target} confirms (or ended); returns the last counts."""
        deadline = time.monotonic() + DEADLINE
        counts = (0, 0, 0)
        while True:
            try:
                line = reader.next_line(deadline)
            except TimeoutError:
                raise self.failure(f"the client did not reach {target} confirms in {DEADLINE:.0f} s;"
                                   f" last progress {counts}") from None
            if line is None or not line.startswith("progress "):
                if line is not None:
                    reader.buffer = line.encode() + b"\n" + reader.buffer  # the summary: keep it
                return counts
            counts = tuple(int(word) for word in line.split()[1:])
            if counts[0] >= target:
                return counts

    def client_summary(self, reader, client, out):
        """Wait for the client to end (the broker is gone) and return its JSON summary."""
        deadline = time.monotonic() + DEADLINE
        last = None
        try:
            while (line := reader.next_line(deadline)) is not None:
                last = line
        except TimeoutError:
            raise self.failure(f"the client did not end within {DEADLINE:.0f} s of the kill") from None
        status = client.wait(DEADLINE)
        stderr = (out / "client.stderr").read_text()
        if last is None or not last.startswith("{"):
            raise self.failure(f"the client exited with {status} without a summary", stderr)
        summary = json.loads(last)
        if status != 0:
            raise self.failure(f"the client failed ({summary['ended']}): {summary['detail']}", stderr)
        return summary

    def drain_and_check(self):
        """
        Drain the running broker's queue and check it; returns how many
        messages came back, and how many of them the client had acked (acks
        not proven durable, which may come back).
        """
        recovered_lines = [line for line in self.broker.output if RECOVERED.search(line)]
        if recovered_lines and int(RECOVERED.search(recovered_lines[-1])["unavailable"]):
            raise self.failure("the restarted broker marked a queue unavailable", recovered_lines[-1])
        try:
            deliveries = drain(self.host, self.port)
        except (BenchmarkError, OSError) as error:
            raise self.failure(f"draining the queue failed: {error}") from None
        problems, seen = check_recovery(deliveries, self.run_number, self.confirmed, self.sent, self.durably_acked,
                                        self.acks_sent)
        if problems:
            raise self.failure(f"{len(problems)} problems in the {len(deliveries)} messages that came back",
                               *problems[:30])
        bad = broker_failures(self.broker.output)
        if bad:
            raise self.failure("the restarted broker logged failures", *bad)
        return len(deliveries), len(seen & self.acks_sent)

    @staticmethod
    def describe(result):
        return (
            "cycle {run:>3}: killed at {confirmed_at_kill} confirms (target {kill_target}); published {published},"
            " confirmed {confirmed}, delivered {delivered}, acked {acks_sent} (durably {acked_durable}),"
            " held {held_unacked};"
            " {recovered} came back ({acked_came_back} of them acked, not durably), restart {restart_s:.2f} s,"
            " {restart_warnings} warnings at restart,"
            " {compactions_before_kill} compactions logged before the kill".format(**result)
        )


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="durable backend: " + ", ".join(DURABLE_BACKENDS))
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sync", default="always", help="always, interval:MS or none")
    parser.add_argument("--max-kill-confirms", type=int, default=4000,
                        help="each kill comes after a random 1..this many confirms")
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--workdir", help="where the data directory and client logs go (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory after a successful run")
    parser.add_argument("--json", action="store_true", help="print the per-cycle figures as JSON at the end")
    return parser


def main(argv=None):
    options = build_parser().parse_args(argv)
    workdir = pathlib.Path(options.workdir or tempfile.mkdtemp(prefix=f"brokerd-crash-{options.backend}-"))
    def say(text):
        print(text, file=sys.stderr if options.json else sys.stdout, flush=True)

    loop = CrashLoop(options.backend, workdir, options.seed, options.sync, options.max_kill_confirms,
                     options.publishers, say=say)
    started = time.monotonic()
    try:
        results = loop.run(options.kills)
    except CrashCheckFailed as failure:
        print(f"crash_loop: FAILED\n{failure}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    summary = {
        "backend": options.backend,
        "sync": options.sync,
        "seed": options.seed,
        "kills": len(results),
        "confirmed": sum(r["confirmed"] for r in results),
        "durably_acked": sum(r["acked_durable"] for r in results),
        "came_back": sum(r["recovered"] for r in results),
        "acked_came_back": sum(r["acked_came_back"] for r in results),
        "mean_restart_s": sum(r["restart_s"] for r in results) / max(len(results), 1),
        "max_restart_s": max((r["restart_s"] for r in results), default=0.0),
        "restarts_with_warnings": sum(1 for r in results if r["restart_warnings"]),
        "compactions_before_kills": sum(r["compactions_before_kill"] for r in results),
        "elapsed_s": elapsed,
        "final_store_stats": loop.final_stats,
    }
    if options.json:
        print(json.dumps({"summary": summary, "cycles": results}, indent=2))
    else:
        print(f"{summary['kills']} kills of the {options.backend} broker (--sync={options.sync}) in"
              f" {elapsed:.1f} s: {summary['confirmed']} confirmed, {summary['durably_acked']} durably acked,"
              f" {summary['came_back']} came back, {summary['acked_came_back']} of them acked"
              f" ({summary['acked_came_back'] / max(summary['kills'], 1):.1f} per kill, none durably);"
              f" restart mean {summary['mean_restart_s']:.2f} s,"
              f" max {summary['max_restart_s']:.2f} s; {summary['restarts_with_warnings']} restarts logged warnings,"
              f" {summary['compactions_before_kills']} compactions logged before kills; every check passed")
    if not options.keep and not options.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
