"""A brokerd cluster beside one brokerd node and a RabbitMQ cluster, in one run on this machine.

    python -m benchmarks.cluster_throughput --messages 100000 --rounds 3

Starts, on loopback (L{benchmarks.cluster_systems}):

  single    one brokerd node, chunked backend
  cluster   three brokerd nodes in cluster mode on a private etcd, chunked, --cluster-min-isr 2;
            measured once etcd's in-sync set names all three, the load on the leader's AMQP port
  rabbitmq  three RabbitMQ nodes (Debian's rabbitmq-server) joined into one cluster; the queue
            is a quorum queue with a member on each node

and runs on each, round after round (each round in another order), the three phases of
L{benchmarks.amqp_throughput} with its client and the same parameters everywhere: publish N
persistent messages with confirms, consume them, then both at once, on a durable queue declared
with C{x-queue-type: quorum}. Every message is checked to arrive once and in order, every publish
to be confirmed.

The table gives, per phase, each system's msg/s (median of the rounds, with the slowest and
fastest), the ratios brokerd cluster / RabbitMQ cluster and brokerd cluster / single brokerd, and
the cores busy: all of a system's nodes summed, read from /proc (each node with the processes it
started), with each node's share, then the load client's own (this process). Everything it
started is stopped at the end, on failure and on Ctrl-C too.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

from pamqp import commands

from benchmarks.amqp_throughput import QUEUE_TYPES, measure
from benchmarks.cluster_systems import SYSTEMS, StartFailed
from brokerd.loadgen.amqp_client import Connection, Loop
from brokerd.loadgen.amqp_codec import BenchmarkError
from brokerd.loadgen.process_cpu import cpu_seconds
from brokerd.testing import BrokerFailed

PHASES = ("publish", "consume", "together")
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


def run_round(address, pids, idle_pids, options):
    """
    The three phases against C{address}, by L{benchmarks.amqp_throughput.measure}; returns each
    phase's rate, the CPU of the system's nodes (C{pids}) and the client, and the cores the idle
    systems (C{idle_pids}) used meanwhile, with how many publishes were confirmed and messages
    consumed.
    """
    results = measure(*address, options.messages, options.size, options.window, options.prefetch,
                      options.ack_every, queue_type=QUEUE_TYPE, client_name="cluster-benchmark",
                      meter=lambda: PhaseMeter(pids, idle_pids))
    for phase in PHASES:
        results[f"{phase}_cpu"] = results.pop(f"{phase}_broker_cpu")
    return results


def summarise(rounds):
    """Per phase: the median rate with the slowest and fastest round, and the median cores busy."""
    summary = {}
    for phase in PHASES:
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


def ratios(systems):
    """Per phase: brokerd cluster / RabbitMQ cluster and brokerd cluster / single brokerd (None without one)."""
    def ratio(phase, numerator, denominator):
        if numerator not in systems or denominator not in systems:
            return None
        return systems[numerator]["summary"][phase]["per_s"] / systems[denominator]["summary"][phase]["per_s"]

    return {phase: {"cluster_to_rabbitmq": ratio(phase, "cluster", "rabbitmq"),
                    "cluster_to_single": ratio(phase, "cluster", "single")} for phase in PHASES}


def print_table(report):
    systems = report["systems"]
    print(f"{report['messages']:,} persistent messages of {report['size']} bytes per phase to a durable"
          f" {report['queue_type']} queue, {report['rounds']} round{'s' if report['rounds'] > 1 else ''};"
          f" msg/s: median (slowest-fastest)")
    header = f"{'phase':<9}" + "".join(f"{system['label']:>26}" for system in systems.values())
    print(header + f"{'cluster/RabbitMQ':>18}{'cluster/single':>16}")
    for phase in PHASES:
        line = f"{phase:<9}"
        for system in systems.values():
            row = system["summary"][phase]
            figure = f"{row['per_s']:,.0f} ({row['min_per_s']:,.0f}-{row['max_per_s']:,.0f})"
            line += f"{figure:>26}"
        phase_ratios = report["ratios"][phase]
        line += "".join(f"{'n/a' if value is None else f'{value:.2f}':>{width}}" for value, width in
                        ((phase_ratios["cluster_to_rabbitmq"], 18), (phase_ratios["cluster_to_single"], 16)))
        print(line)
    print("cores busy, median of the rounds (from /proc, each node with the processes it started)")
    print(f"{'phase':<9}{'system':<18}{'nodes':>6}   {'each node':<44}{'client':>6}")
    for phase in PHASES:
        for index, system in enumerate(systems.values()):
            row = system["summary"][phase]
            nodes = "  ".join(f"{name} {cores(value)}" for name, value in row["node_cpu"].items())
            print(f"{phase if index == 0 else '':<9}{system['label']:<18}{cores(row['nodes_cpu']):>6}   {nodes:<44}"
                  f"{cores(row['client_cpu']):>6}")
    idle = [system["summary"][phase]["idle_systems_cpu"] for system in systems.values() for phase in PHASES]
    if len(systems) > 1 and None not in idle:
        print(f"the systems not measured used at most {max(idle):.2f} cores meanwhile (median of the rounds)")
    for system in systems.values():
        if system["replicas"]:
            print(f"{system['label']}: {system['replicas']}")


def cores(value):
    return "n/a" if value is None else f"{value:.2f}"


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="messages per phase")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each system is measured once per round")
    parser.add_argument("--size", type=int, default=100, help="body bytes (at least 8)")
    parser.add_argument("--window", type=int, default=2000, help="most unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--systems", default="single,cluster,rabbitmq",
                        help="which to compare, comma-separated, of: " + ", ".join(SYSTEMS))
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def parse_options(argv):
    parser = build_parser()
    options = parser.parse_args(argv)
    options.systems = [name.strip() for name in options.systems.split(",") if name.strip()]
    unknown = [name for name in options.systems if name not in SYSTEMS]
    if unknown or not options.systems or len(set(options.systems)) != len(options.systems):
        parser.error(f"--systems: give each of {', '.join(SYSTEMS)} at most once, not {unknown or options.systems}")
    if options.size < 8:
        parser.error("--size must be at least 8 (the body starts with the message number)")
    if min(options.messages, options.rounds, options.window, options.prefetch, options.ack_every) < 1:
        parser.error("--messages, --rounds, --window, --prefetch and --ack-every must be positive")
    if options.ack_every > options.prefetch:
        parser.error("--ack-every larger than --prefetch would stall the consumer")
    return options


def compare(options, root):
    """Starts the systems one after the other, measures them round after round; the report."""
    started = []
    try:
        for key in options.systems:
            system = SYSTEMS[key](root)
            started.append(system)
            print(f"starting {system.label}", file=sys.stderr, flush=True)
            system.start()
            print(f"{system.label} up: " + ", ".join(f"{name} pid {pid}" for name, pid in system.pids.items()),
                  file=sys.stderr, flush=True)
        replicas = declare_and_check_replicas(started)
        rounds = {system.key: [] for system in started}
        for number in range(options.rounds):
            shift = number % len(started)
            for system in started[shift:] + started[:shift]:
                idle = {f"{other.key}/{name}": pid for other in started if other is not system
                        for name, pid in other.pids.items()}
                print(f"round {number + 1}: {system.label}", file=sys.stderr, flush=True)
                rounds[system.key].append(run_round(system.address, system.pids, idle, options))
    finally:
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            for system in reversed(started):
                system.stop()
        finally:
            signal.signal(signal.SIGINT, interrupt)
    return {
        "messages": options.messages, "size": options.size, "rounds": options.rounds, "queue_type": QUEUE_TYPE,
        "window": options.window, "prefetch": options.prefetch, "ack_every": options.ack_every,
        "systems": {system.key: {"label": system.label, "pids": system.pids, "replicas": replicas[system.key],
                                 "rounds": rounds[system.key], "summary": summarise(rounds[system.key])}
                    for system in started},
    }


def declare_and_check_replicas(systems):
    """
    Declares the queue on each system before measuring; says where its copies are: the brokerd
    cluster's in-sync set, the RabbitMQ quorum queue's members (which must be all three nodes).
    """
    kind, replicas = QUEUE_TYPES[QUEUE_TYPE], {}
    for system in systems:
        connection = Connection(Loop(), *system.address, "cluster-benchmark-declare")
        connection.open()
        connection.rpc(kind.declare(), commands.Queue.DeclareOk)
        connection.close()
        replicas[system.key] = None
        if system.key == "cluster":
            replicas[system.key] = f"in-sync set {', '.join(system.in_sync)}, leader {system.leader}"
        elif system.key == "rabbitmq":
            members = system.queue_members(kind.queue)
            if members != sorted(system.nodes):
                raise StartFailed(f"the quorum queue's members are {members}, not all of {system.nodes}")
            replicas[system.key] = f"quorum queue members {', '.join(members)}"
    return replicas


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # kill PID stops what was started, as Ctrl-C does
    root = tempfile.mkdtemp(prefix="brokerd-cluster-bench-")
    print(f"working in {root}", file=sys.stderr, flush=True)
    os.chmod(root, 0o755)  # the RabbitMQ nodes may run as another user
    try:
        report = compare(options, root)
    except (BenchmarkError, BrokerFailed, StartFailed, OSError) as problem:
        print(f"cluster_throughput: {problem}", file=sys.stderr)
        return None
    except KeyboardInterrupt:
        print("cluster_throughput: interrupted; everything it started is stopped", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report["ratios"] = ratios(report["systems"])
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
