"""What the benchmarks that measure several systems in one run share (L{benchmarks.cluster_throughput},
L{benchmarks.versus_rabbitmq}).

Systems (L{benchmarks.cluster_systems}) are started one after the other and all kept running; a
durable quorum queue is declared on each; then, round after round and in another order each round,
each system is measured with the client of L{benchmarks.amqp_throughput} while the others stay idle,
with the cores its nodes, the idle systems and the client kept busy. At the end, on a failure, on
Ctrl-C and on SIGTERM everything started is stopped and the working directory removed.
"""

import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

from pamqp import commands

from benchmarks.amqp_throughput import PHASES, QUEUE_TYPES, measure
from benchmarks.cluster_systems import StartFailed
from brokerd.loadgen.amqp_client import Connection, Loop
from brokerd.loadgen.amqp_codec import BenchmarkError
from brokerd.loadgen.process_cpu import cpu_seconds
from brokerd.testing import BrokerFailed

QUEUE_TYPE = "quorum"


class CpuMeter:
    """
    The cores each process of C{pids} (name -> pid, with its descendants) and this process kept
    busy from L{start} to L{stop}.
    """

    def __init__(self, pids):
        self.pids = pids

    def start(self):
        self.started_at = time.perf_counter()
        self.client = time.process_time()
        self.nodes = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return self

    def stop(self):
        """C{{"nodes": {name: cores}, "nodes_total": cores, "client": cores}} since L{start}."""
        elapsed = time.perf_counter() - self.started_at
        client = (time.process_time() - self.client) / elapsed
        nodes = {}
        for name, pid in self.pids.items():
            now = cpu_seconds(pid)
            nodes[name] = None if now is None or self.nodes[name] is None else (now - self.nodes[name]) / elapsed
        total = None if None in nodes.values() else sum(nodes.values())
        return {"nodes": nodes, "nodes_total": total, "client": client}


class PhaseMeter:
    """One phase's L{CpuMeter} of the measured system's nodes (C{pids}), with the cores the idle
    systems (C{idle_pids}) used meanwhile."""

    def __init__(self, pids, idle_pids):
        self.meters = CpuMeter(pids), CpuMeter(idle_pids)

    def start(self):
        for meter in self.meters:
            meter.start()
        return self

    def stop(self):
        measured, idle = (meter.stop() for meter in self.meters)
        measured["idle_systems"] = idle["nodes_total"]
        return measured


def run_round(address, pids, idle_pids, load, client_name, publish_only=False):
    """
    The phases of L{benchmarks.amqp_throughput.measure} (the publish phase alone with
    C{publish_only}) against C{address}, with C{load}'s messages, size, window, prefetch and
    ack_every; returns each phase's rate, the CPU of the system's nodes (C{pids}) and the client,
    and the cores the idle systems (C{idle_pids}) used meanwhile (C{PHASE_cpu}), with how many
    publishes were confirmed and messages consumed.
    """
    results = measure(*address, load.messages, load.size, load.window, load.prefetch, load.ack_every,
                      queue_type=QUEUE_TYPE, client_name=client_name, meter=lambda: PhaseMeter(pids, idle_pids),
                      publish_only=publish_only)
    for phase in PHASES[:1] if publish_only else PHASES:
        results[f"{phase}_cpu"] = results.pop(f"{phase}_broker_cpu")
    return results


def summarise(rounds, phases=PHASES):
    """Per phase: the median rate with the slowest and fastest round, and the median cores busy."""
    summary = {}
    for phase in phases:
        rates = [result[f"{phase}_per_s"] for result in rounds]
        cpu = [result[f"{phase}_cpu"] for result in rounds]
        summary[phase] = {
            "per_s": statistics.median(rates), "min_per_s": min(rates), "max_per_s": max(rates),
            "nodes_cpu": median_or_none([c["nodes_total"] for c in cpu]),
            "node_cpu": {name: median_or_none([c["nodes"][name] for c in cpu]) for name in cpu[0]["nodes"]},
            "client_cpu": statistics.median(c["client"] for c in cpu),
            "idle_systems_cpu": median_or_none([c["idle_systems"] for c in cpu]),
        }
    return summary


def median_or_none(values):
    return None if None in values or not values else statistics.median(values)


def cores(value):
    return "n/a" if value is None else f"{value:.2f}"


def measure_in_rounds(systems, rounds, measure_system, client_name):
    """
    Starts C{systems} one after the other, declares the queue on each and asks each where its
    copies are, then measures them round after round, each round in another order:
    C{measure_system(system, idle_pids)} gives one round's figures of C{system} while the others
    (C{idle_pids}: C{"KEY/NODE"} -> pid) stay idle. Stops every system it started, whatever happens.

    @return: C{(replicas, rounds)}, each a dict by system key (rounds: the list of figures)
    """
    started = []
    try:
        for system in systems:
            started.append(system)
            print(f"starting {system.label}", file=sys.stderr, flush=True)
            system.start()
            print(f"{system.label} up: " + ", ".join(f"{name} pid {pid}" for name, pid in system.pids.items()),
                  file=sys.stderr, flush=True)
        replicas = declare_queue(started, client_name)
        results = {system.key: [] for system in started}
        for number in range(rounds):
            shift = number % len(started)
            for system in started[shift:] + started[:shift]:
                idle = {f"{other.key}/{name}": pid for other in started if other is not system
                        for name, pid in other.pids.items()}
                print(f"round {number + 1}: {system.label}", file=sys.stderr, flush=True)
                results[system.key].append(measure_system(system, idle))
    finally:
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            for system in reversed(started):
                system.stop()
        finally:
            signal.signal(signal.SIGINT, interrupt)
    return replicas, results


def declare_queue(systems, client_name):
    """Declares the measured queue on each system before measuring; where each keeps its copies."""
    kind, replicas = QUEUE_TYPES[QUEUE_TYPE], {}
    for system in systems:
        connection = Connection(Loop(), *system.address, f"{client_name}-declare")
        connection.open()
        connection.rpc(kind.declare(), commands.Queue.DeclareOk)
        connection.close()
        replicas[system.key] = system.replicas(kind.queue)
    return replicas


def add_load_arguments(parser):
    """The options of the load each round runs, as the benchmarks of several systems share them."""
    parser.add_argument("--messages", type=int, default=100_000, help="messages per phase")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each system is measured once per round")
    parser.add_argument("--size", type=int, default=100, help="body bytes (at least 8)")
    parser.add_argument("--window", type=int, default=2000, help="most unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def listed_names(parser, option, text, known):
    """The names in C{text}, a comma-separated C{option}: each of C{known} at most once, or the parser's error."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names or len(set(names)) != len(names):
        parser.error(f"{option}: give each of {', '.join(known)} at most once, not {unknown or names}")
    return names


def check_ack_every(parser, options):
    if options.ack_every > options.prefetch:
        parser.error("--ack-every larger than --prefetch would stall the consumer")


def print_report(report, options, print_table):
    """Prints C{report} as JSON with --json, else as C{print_table} lays it out; returns it."""
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return report


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_benchmark(name, compare, options, prefix):
    """
    C{compare(options, root)} in a fresh working directory C{root} (named C{PREFIX...}), removed afterwards;
    its report, or None once it said on stderr why there is none (a system that did not start,
    a failed check, Ctrl-C or SIGTERM, which stop what was started as a failure does).
    """
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # kill PID stops what was started, as Ctrl-C does
    root = tempfile.mkdtemp(prefix=prefix)
    print(f"working in {root}", file=sys.stderr, flush=True)
    os.chmod(root, 0o755)  # the RabbitMQ nodes may run as another user
    try:
        return compare(options, root)
    except (BenchmarkError, BrokerFailed, StartFailed, OSError) as problem:
        print(f"{name}: {problem}", file=sys.stderr)
        return None
    except KeyboardInterrupt:
        print(f"{name}: interrupted; everything it started is stopped", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(root, ignore_errors=True)
