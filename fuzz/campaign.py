"""Fuzz a real broker with hostile input in both protocols, checking after each
input that it is alive, serves a well-behaved client, and keeps its memory.

    python -m fuzz --seconds 600 --seed 1 --backend chunked

Starts ``twistd brokerd`` (AMQP and native listeners on loopback port 0), then
until the time is up: takes the next seeded input (L{fuzz.inputs}),
sends it over a fresh socket (after a guest login if it needs one), reads what
comes back with a short deadline, closes, and runs a canary client in each
protocol (L{fuzz.canary}). A broker that died is counted and
restarted on the same data directory; a canary failure is counted with the
input before it. At the end the broker is SIGKILLed and restarted on its data
directory: it must start and serve (poisoned durable state must never stop a
restart). Exit status 1 on any death, traceback in the broker log or canary
failure, or a peak RSS above the watermark plus --rss-margin.
The broker runs this checkout's code, or that of the tree PYTHONPATH names first.
"""

import argparse
import collections
import json
import os
import pathlib
import shutil
import socket
import sys
import tempfile
import time

from brokerd.testing import BrokerProcess
from brokerd.units import parse_size
from fuzz import canary
from fuzz.canary import CanaryFailed
from fuzz.inputs import PROTOCOLS, InputStream
from fuzz.report import BrokerLog, format_summary
from fuzz.wire import ReplyScanner, Session

QUIET_SECONDS = 0.2  # after sending, stop reading once the broker has said nothing for this long
READ_SECONDS = 1.0  # and stop reading this long after sending at the latest
LOGIN_SECONDS = 3.0  # for the guest login before an input that needs one
CANARY_SECONDS = 3.0  # for one canary, start to close
RECOVERY_SECONDS = 15.0  # a broker whose canary failed gets this long to serve again before it is restarted
RECOVERY_ATTEMPTS = 5  # canary pairs tried in that time (each waits CANARY_SECONDS at most)
START_SECONDS = 60.0  # for a broker to start listening
RESTART_CANARIES = 200  # canaries after the final restart, until the shared queue is drained
ROOT = pathlib.Path(__file__).resolve().parent.parent
RSS_RISE_NOTED = 16 << 20  # an input that raises the broker's peak RSS by this much is named in the summary
DEFAULT_WATERMARK = "256M"
DEFAULT_RSS_MARGIN = "128M"  # resident memory a broker may use beyond its watermark (interpreter, code, caches)


def broker_path():
    """
    The PYTHONPATH the broker runs with: the caller's entries made absolute (the
    broker runs in another directory), then this checkout. So the broker is this
    checkout's unless PYTHONPATH names another tree, e.g. to fuzz a released one.
    """
    entries = [os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return [*entries, str(ROOT)]


def broker_code():
    """Where the broker's C{brokerd} package comes from, for the summary."""
    return next((entry for entry in broker_path() if os.path.exists(os.path.join(entry, "brokerd", "__init__.py"))),
                "the installed brokerd")


class ManagedBroker:
    """The broker under test: one data directory, restarted as often as needed; tracks its peak RSS."""

    def __init__(self, backend, watermark, data_dir, workdir):
        self.backend = backend
        self.watermark = watermark
        self.data_dir = pathlib.Path(data_dir)
        self.workdir = workdir
        self.process = None
        self.log = BrokerLog()
        self.peak_rss = 0
        self.amqp_port = self.native_port = None
        self.starts = 0

    def start(self):
        """Start it; returns None, or the reason it did not start."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = BrokerProcess(
            [f"--backend={self.backend}", "--data-dir", str(self.data_dir), f"--memory-high-watermark={self.watermark}",
             "--amqp", "tcp:0:interface=127.0.0.1", "--native", "tcp:0:interface=127.0.0.1"],
            cwd=self.workdir,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(broker_path())),
        )
        self.starts += 1
        self.log.attach(self.process.output)
        try:
            self.amqp_port = _port(self.process.wait_listening("AMQP", timeout=START_SECONDS))
            self.native_port = _port(self.process.wait_listening("native protocol", timeout=START_SECONDS))
        except AssertionError:
            self.kill()
            lines = [line for line in self.process.output if "#critical]" in line or "Traceback" in line]
            return (lines or self.process.output[-1:] or ["no output"])[0]
        return None

    def alive(self):
        return self.process is not None and self.process.process.poll() is None

    def exit_status(self):
        return self.process.process.poll()

    def sample_rss(self):
        """Fold the process's peak resident memory (VmHWM, VmRSS) into C{peak_rss}."""
        if not self.alive():
            return
        try:
            status = pathlib.Path(f"/proc/{self.process.process.pid}/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith(("VmHWM:", "VmRSS:")):
                self.peak_rss = max(self.peak_rss, int(line.split()[1]) * 1024)

    def kill(self):
        if self.process is not None:
            self.sample_rss()
            self.process.kill()

    def stop(self):
        if self.process is not None and self.alive():
            self.sample_rss()
            self.process.stop()

    def move_data_aside(self):
        """Keep a data directory the broker cannot start from, for a post-mortem, and start from an empty one."""
        target = self.data_dir.with_name(f"{self.data_dir.name}.unstartable-{self.starts}")
        shutil.move(str(self.data_dir), str(target))
        return target


def _port(endpoint):
    return int(endpoint.rsplit(":", 1)[1])


class Fuzzer:
    """One seeded run against one broker; L{run} returns the results as a dict (see L{format_summary})."""

    def __init__(self, seconds, seed, backend="chunked", watermark=DEFAULT_WATERMARK, rss_margin=DEFAULT_RSS_MARGIN,
                 data_dir=None, protocols=PROTOCOLS, max_inputs=None, progress=None, only=None, out=sys.stdout):
        self.seconds = seconds
        self.seed = seed
        self.backend = backend
        self.watermark = parse_size(watermark)
        self.rss_margin = parse_size(rss_margin)
        self.protocols = tuple(protocols)
        self.max_inputs = max_inputs
        self.only = set(only or ())  # input numbers to send (the others are generated and skipped), to replay a finding
        self.progress = progress
        self.out = out
        self.workdir = tempfile.mkdtemp(prefix="brokerd-fuzz-")
        data_dir = pathlib.Path(data_dir) if data_dir else pathlib.Path(self.workdir) / "data"
        self.broker = ManagedBroker(backend, self.watermark, data_dir, self.workdir)
        self.stream = InputStream(seed, volume=self.watermark)
        self.inputs = collections.Counter()
        self.replies = collections.Counter()  # (protocol, reply code) -> count, from the closes inputs got
        self.deaths = []
        self.canary_failures = []
        self.restart = None
        self.slowest_canary = (0.0, None)  # seconds, the input before it
        self.rss_raisers = []  # (MiB the peak RSS rose by, input), for the inputs that raised it most

    # -- the run

    def run(self):
        self.started = time.monotonic(), time.process_time()
        try:
            problem = self.broker.start()
            if problem is not None:
                self.deaths.append({"after": "start", "what": f"did not start: {problem}"})
                return self.results()
            self._canaries(None, setup=True)
            end = time.monotonic() + self.seconds
            next_progress = time.monotonic() + (self.progress or 0)
            while time.monotonic() < end and (self.max_inputs is None or sum(self.inputs.values()) < self.max_inputs):
                item = next(self.stream)
                if self.only and item.index > max(self.only):
                    break
                if item.protocol not in self.protocols or (self.only and item.index not in self.only):
                    continue
                self.fuzz_one(item)
                if self.progress and time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + self.progress
                    print(self.progress_line(), file=self.out, flush=True)
            self.restart_check()
            return self.results()
        finally:
            self.broker.stop()
            self.broker.log.scan()
            shutil.rmtree(self.workdir, ignore_errors=True)  # holds the data directory unless --data-dir chose one

    def fuzz_one(self, item):
        peak_before = self.broker.peak_rss
        self._fuzz_one(item)
        risen = self.broker.peak_rss - peak_before
        if risen >= RSS_RISE_NOTED and peak_before:
            self.rss_raisers = sorted([*self.rss_raisers, (risen // 2**20, item.describe())], reverse=True)[:5]

    def _fuzz_one(self, item):
        self.inputs[item.kind] += 1
        self.broker.log.current_input = item.describe()
        port = self.broker.amqp_port if item.protocol == "amqp" else self.broker.native_port
        held = []
        try:
            for _ in range(item.connections - 1):  # the same input over more sockets, held open
                held.append(Session(port))
                self._send_input(held[-1], item, quiet_seconds=0.0)
            held.append(Session(port))
            self._send_input(held[-1], item)
        except CanaryFailed as problem:
            self._canary_failed(item, f"guest login before the input failed: {problem}")
        except OSError:
            pass  # the broker refused or closed the socket on us: an answer like any other
        finally:
            for session in held:
                session.close()
        self.broker.sample_rss()
        if not self._check_alive(item):
            return
        self._canaries(item)
        self.broker.sample_rss()
        self.broker.log.scan()

    def _send_input(self, session, item, quiet_seconds=QUIET_SECONDS):
        if item.login:
            deadline = time.monotonic() + LOGIN_SECONDS
            if item.protocol == "amqp":
                canary.amqp_login(session, deadline)
            else:
                canary.native_login(session, deadline)
        if not item.read_while_sending:
            session.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        received = session.buffer + session.converse(
            item.chunks, item.send_seconds, quiet_seconds, item.send_seconds + READ_SECONDS,
            read_while_sending=item.read_while_sending)
        scan = ReplyScanner.amqp if item.protocol == "amqp" else ReplyScanner.native
        for code, _ in scan(received):
            self.replies[(item.protocol, code)] += 1

    def _check_alive(self, item):
        if self.broker.alive():
            return True
        status = self.broker.exit_status()
        self.broker.log.scan()
        self.deaths.append({"after": item.describe(), "what": f"exit status {status}",
                            "log": self.broker.process.output[-8:]})
        self._restart_after_death(item.describe())
        return False

    def _restart_after_death(self, after):
        problem = self.broker.start()
        if problem is not None:
            kept = self.broker.move_data_aside()
            self.deaths.append({"after": after, "what": f"restart failed: {problem}; data kept in {kept}"})
            problem = self.broker.start()
            if problem is not None:
                raise RuntimeError(f"the broker does not start even on an empty data directory: {problem}")
            self._canaries(None, setup=True)  # a fresh data directory: the shared queue again

    def _canaries(self, item, setup=False):
        """Both canaries; a failure is counted, then the broker gets time to serve again (else it is restarted)."""
        for run in (canary.amqp_canary, canary.native_canary):
            port = self.broker.amqp_port if run is canary.amqp_canary else self.broker.native_port
            started = time.monotonic()
            try:
                run(port, started + CANARY_SECONDS, setup=setup)
                took = time.monotonic() - started
                if took > self.slowest_canary[0]:
                    self.slowest_canary = (took, item.describe() if item else "setup")
            except CanaryFailed as problem:
                self._canary_failed(item, str(problem))
                self._recover(item)
                return

    def _recover(self, item):
        deadline = time.monotonic() + RECOVERY_SECONDS
        canary.purge_shared(self.broker.amqp_port, self.broker.native_port, min(deadline, time.monotonic() + 5))
        for _ in range(RECOVERY_ATTEMPTS):
            if time.monotonic() >= deadline or not self.broker.alive():
                break
            try:
                canary.amqp_canary(self.broker.amqp_port, time.monotonic() + CANARY_SECONDS)
                canary.native_canary(self.broker.native_port, time.monotonic() + CANARY_SECONDS)
                return
            except CanaryFailed:
                continue
        after = item.describe() if item else "setup"
        if not self.broker.alive():
            self.deaths.append({"after": after, "what": f"exit status {self.broker.exit_status()}",
                                "log": self.broker.process.output[-8:]})
        else:
            self.canary_failures[-1]["what"] += f"; still not serving after {RECOVERY_ATTEMPTS} more tries: restarted"
            self.broker.kill()
        self._restart_after_death(after)

    def _canary_failed(self, item, what):
        self.canary_failures.append({"after": item.describe() if item else "setup", "what": what})

    def restart_check(self):
        """SIGKILL, restart on the same data directory: it must start and serve both canaries."""
        self.broker.log.current_input = "restart check"
        self.broker.kill()
        problem = self.broker.start()
        if problem is not None:
            self.restart = f"FAILED: {problem}"
            self.deaths.append({"after": "restart check (SIGKILL, restart on the same data)",
                                "what": f"did not start: {problem}"})
            return
        recovered = next((line for line in self.broker.process.output if "recovered" in line), "")
        self.restart = "started: " + recovered.split("] ", 1)[-1]
        if "(0 unavailable)" not in recovered and "unavailable" in recovered:
            self.canary_failures.append({"after": "restart check", "what": f"durable state unavailable: {recovered}"})
        before = len(self.canary_failures)
        for run, port in ((canary.amqp_canary, self.broker.amqp_port), (canary.native_canary, self.broker.native_port)):
            for _ in range(RESTART_CANARIES):  # whatever the broker took must be deliverable after a restart
                try:
                    drained = run(port, time.monotonic() + CANARY_SECONDS * 2)
                except CanaryFailed as problem:
                    self.canary_failures.append({"after": "restart check", "what": str(problem)})
                    break
                if not drained:
                    break
        if len(self.canary_failures) > before:
            self.restart += "; canary FAILED"

    # -- results

    def results(self):
        log = self.broker.log
        return {
            "seed": self.seed, "backend": self.backend, "broker_code": broker_code(), "seconds": self.seconds,
            "protocols": list(self.protocols),
            "inputs": sum(self.inputs.values()), "inputs_by_kind": dict(sorted(self.inputs.items())),
            "deaths": len(self.deaths), "death_details": self.deaths,
            "tracebacks": log.traceback_count, "distinct_tracebacks": log.distinct(),
            "canary_failures": len(self.canary_failures), "canary_failure_details": self.canary_failures,
            "replies": {f"{protocol} {code or 'protocol-header'}": count
                        for (protocol, code), count in sorted(self.replies.items())},
            "peak_rss": self.broker.peak_rss, "watermark": self.watermark, "rss_margin": self.rss_margin,
            "rss_raisers": [{"mib": mib, "input": described} for mib, described in self.rss_raisers],
            "slowest_canary_seconds": round(self.slowest_canary[0], 3), "slowest_canary_after": self.slowest_canary[1],
            "restart": self.restart,
            "wall_seconds": round(time.monotonic() - self.started[0], 1),
            "fuzzer_cpu_seconds": round(time.process_time() - self.started[1], 1),
        }

    def progress_line(self):
        return (f"[{sum(self.inputs.values())} inputs] deaths {len(self.deaths)}, tracebacks "
                f"{self.broker.log.traceback_count}, canary failures {len(self.canary_failures)}, "
                f"peak RSS {self.broker.peak_rss / 2**20:.0f} MiB")


def failed(results):
    """True if the run found anything: a death, a traceback, a canary failure or too much memory."""
    return bool(results["deaths"] or results["tracebacks"] or results["canary_failures"] or rss_over(results))


def rss_over(results):
    return results["peak_rss"] > results["watermark"] + results["rss_margin"]


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="the same seed gives the same inputs (default 1)")
    parser.add_argument("--backend", default="chunked", help="the broker's --backend (default chunked)")
    parser.add_argument("--memory-high-watermark", default=DEFAULT_WATERMARK,
                        help="the broker's watermark; also scales the resource-abuse inputs"
                             f" (default {DEFAULT_WATERMARK})")
    parser.add_argument("--rss-margin", default=DEFAULT_RSS_MARGIN,
                        help="peak RSS allowed beyond the watermark before the run fails"
                             f" (default {DEFAULT_RSS_MARGIN})")
    parser.add_argument("--data-dir", help="the broker's data directory, kept afterwards (default: a temporary one)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="amqp, native or both (default both)")
    parser.add_argument("--max-inputs", type=int, help="stop after this many inputs, even before --seconds")
    parser.add_argument("--only", help="send only these inputs (comma-separated numbers from a summary) to replay them")
    parser.add_argument("--progress", type=float, help="print a progress line every this many seconds")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser


def main(argv=None):
    options = build_parser().parse_args(argv)
    protocols = [name.strip() for name in options.protocols.split(",") if name.strip()]
    fuzzer = Fuzzer(options.seconds, options.seed, options.backend, options.memory_high_watermark, options.rss_margin,
                    options.data_dir, protocols, options.max_inputs, options.progress,
                    [int(number) for number in options.only.split(",")] if options.only else None)
    results = fuzzer.run()
    print(json.dumps(results, indent=2) if options.json else format_summary(results), flush=True)
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
