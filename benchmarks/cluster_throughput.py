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
import sys

from benchmarks.cluster_systems import SYSTEMS
from benchmarks.side_by_side import (
    PHASES,
    QUEUE_TYPE,
    add_load_arguments,
    check_ack_every,
    cores,
    listed_names,
    measure_in_rounds,
    print_report,
    run_benchmark,
    run_round,
    summarise,
)

CLIENT_NAME = "cluster-benchmark"


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


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_arguments(parser)
    parser.add_argument("--systems", default="single,cluster,rabbitmq",
                        help="which to compare, comma-separated, of: " + ", ".join(SYSTEMS))
    return parser


def parse_options(argv):
    parser = build_parser()
    options = parser.parse_args(argv)
    options.systems = listed_names(parser, "--systems", options.systems, SYSTEMS)
    if options.size < 8:
        parser.error("--size must be at least 8 (the body starts with the message number)")
    if min(options.messages, options.rounds, options.window, options.prefetch, options.ack_every) < 1:
        parser.error("--messages, --rounds, --window, --prefetch and --ack-every must be positive")
    check_ack_every(parser, options)
    return options


def compare(options, root):
    """Starts the systems one after the other, measures them round after round; the report."""
    systems = [SYSTEMS[key](root) for key in options.systems]
    replicas, rounds = measure_in_rounds(
        systems, options.rounds,
        lambda system, idle: run_round(system.address, system.pids, idle, options, CLIENT_NAME), CLIENT_NAME)
    return {
        "messages": options.messages, "size": options.size, "rounds": options.rounds, "queue_type": QUEUE_TYPE,
        "window": options.window, "prefetch": options.prefetch, "ack_every": options.ack_every,
        "systems": {system.key: {"label": system.label, "pids": system.pids, "replicas": replicas[system.key],
                                 "rounds": rounds[system.key], "summary": summarise(rounds[system.key])}
                    for system in systems},
    }


def main(argv=None):
    options = parse_options(argv)
    report = run_benchmark("cluster_throughput", compare, options, prefix="brokerd-cluster-bench-")
    if report is None:
        return None
    report["ratios"] = ratios(report["systems"])
    return print_report(report, options, print_table)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
