"""One brokerd node per backend beside one RabbitMQ node's quorum queue, in one run on this machine.

    python -m benchmarks.versus_rabbitmq --backends chunked,sqlite,filelog --rounds 3

Starts, on loopback (L{benchmarks.cluster_systems}), one brokerd node for each backend asked
for (fresh, in a data directory of its own, the backend's defaults otherwise) and one RabbitMQ
node (Debian's rabbitmq-server, no plugins, its own Erlang cookie, ports and port mapper), keeps
them all running and measures each in turn, round after round (each round in another order),
with the client of L{benchmarks.amqp_throughput} and the same load everywhere: persistent
messages to a durable queue declared with C{x-queue-type: quorum} (on RabbitMQ a quorum queue,
checked to have its node as member; on brokerd a durable queue like any other):

  publish with confirms (100 B)    --messages of --size bytes, at most --window unconfirmed,
                                   until the last confirm
  consume                          the queued ones, prefetch --prefetch, one multiple ack per
                                   --ack-every, until the last delivery
  both at once                     a consumer running while --messages more are published
  publish with confirms (64 KiB)   --large-messages of --large-size bytes, at most
                                   --large-window unconfirmed (--window unless told), then purged

Every message is checked to arrive once and in order, every publish to be confirmed.

Per backend the table gives, row by row, the msg/s of that brokerd node and of RabbitMQ (median
of the rounds, with the slowest and fastest), the ratio brokerd / RabbitMQ (above 1: brokerd is
ahead), the cores each kept busy (from /proc, the node with the processes it started) and the
cores of the load client (this process) while it measured brokerd / RabbitMQ. The systems not
being measured stay idle; the line under the tables says how many cores they used meanwhile.
Everything it started is stopped at the end, on failure, on Ctrl-C and on SIGTERM.
"""

import argparse
import re
import sys

from benchmarks.cluster_systems import RabbitMQCluster, SingleBrokerd
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

BACKENDS = ("chunked", "sqlite", "filelog")  # brokerd's durable backends
LARGE = "large_publish"  # the row of large messages, publishing alone
ROWS = (*PHASES, LARGE)
RABBITMQ = "rabbitmq"
CLIENT_NAME = "versus-rabbitmq"


def size_text(size):
    """C{100 B}, C{64 KiB}: a body size as the table names it."""
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def row_labels(report):
    return {"publish": f"publish with confirms ({size_text(report['size'])})", "consume": "consume",
            "together": "both at once", LARGE: f"publish with confirms ({size_text(report['large']['size'])})"}


def brokerd_key(backend):
    return f"brokerd/{backend}"


def large_load(options):
    """The load of the large-message row: the options with its count, size and window."""
    return argparse.Namespace(messages=options.large_messages, size=options.large_size, window=options.large_window,
                              prefetch=options.prefetch, ack_every=options.ack_every)


def measure_system(system, idle_pids, options):
    """One round of one system: the three phases with small messages, then publishing large ones."""
    results = run_round(system.address, system.pids, idle_pids, options, CLIENT_NAME)
    large = run_round(system.address, system.pids, idle_pids, large_load(options), CLIENT_NAME, publish_only=True)
    results[f"{LARGE}_per_s"], results[f"{LARGE}_cpu"] = large["publish_per_s"], large["publish_cpu"]
    results["large_confirmed"] = large["confirmed"]
    return results


def compare(options, root):
    """Starts a brokerd node per backend and RabbitMQ's node, measures them round after round; the report."""
    systems = [SingleBrokerd(root, backend, key=brokerd_key(backend), label=brokerd_key(backend))
               for backend in options.backends]
    if not options.no_rabbitmq:
        systems.append(RabbitMQCluster(root, size=1, label="RabbitMQ quorum"))
    replicas, rounds = measure_in_rounds(
        systems, options.rounds, lambda system, idle: measure_system(system, idle, options), CLIENT_NAME)
    return {
        "messages": options.messages, "size": options.size, "rounds": options.rounds, "queue_type": QUEUE_TYPE,
        "window": options.window, "prefetch": options.prefetch, "ack_every": options.ack_every,
        "large": {"messages": options.large_messages, "size": options.large_size, "window": options.large_window},
        "backends": options.backends,
        "systems": {system.key: {"label": system.label, "pids": system.pids, "replicas": replicas[system.key],
                                 "store": system.store if isinstance(system, SingleBrokerd) else None,
                                 "rounds": rounds[system.key], "summary": summarise(rounds[system.key], ROWS)}
                    for system in systems},
    }


def ratios(report):
    """Per backend and row: brokerd's msg/s over RabbitMQ's (None without RabbitMQ)."""
    systems = report["systems"]
    rabbitmq = systems.get(RABBITMQ)
    return {backend: {row: None if rabbitmq is None else
                      systems[brokerd_key(backend)]["summary"][row]["per_s"] / rabbitmq["summary"][row]["per_s"]
                      for row in ROWS}
            for backend in report["backends"]}


def print_table(report):
    systems, labels = report["systems"], row_labels(report)
    rabbitmq = systems.get(RABBITMQ)
    large = report["large"]
    print(f"persistent messages to a durable {report['queue_type']} queue: {report['messages']:,} of"
          f" {report['size']:,} bytes per phase, {large['messages']:,} of {large['size']:,} bytes in the last row;"
          f" window {report['window']:,} ({large['window']:,} in the last row), prefetch {report['prefetch']:,},"
          f" ack every {report['ack_every']:,}; {report['rounds']} round{'s' if report['rounds'] > 1 else ''}")
    print("msg/s: median of the rounds (slowest-fastest); cores busy: median, from /proc;"
          " client cores: while measuring brokerd / RabbitMQ")
    for backend in report["backends"]:
        brokerd = systems[brokerd_key(backend)]
        print()
        print(f"{'row':<32}{brokerd['label'] + ' msg/s':>28}{'RabbitMQ quorum msg/s':>28}{'ratio':>7}"
              f"{'brokerd cores busy':>20}{'RabbitMQ cores busy':>21}{'client cores':>15}")
        for row in ROWS:
            ours = brokerd["summary"][row]
            theirs = None if rabbitmq is None else rabbitmq["summary"][row]
            ratio = report["ratios"][backend][row]
            client = f"{cores(ours['client_cpu'])} / {'n/a' if theirs is None else cores(theirs['client_cpu'])}"
            print(f"{labels[row]:<32}{rate(ours):>28}{rate(theirs):>28}{'n/a' if ratio is None else f'{ratio:.2f}':>7}"
                  f"{cores(ours['nodes_cpu']):>20}{'n/a' if theirs is None else cores(theirs['nodes_cpu']):>21}"
                  f"{client:>15}")
        print(f"{brokerd['label']} runs on {re.sub(r' [(].*[)]', '', brokerd['store'])}")
    idle = [system["summary"][row]["idle_systems_cpu"] for system in systems.values() for row in ROWS]
    if len(systems) > 1 and None not in idle:
        print(f"\nthe systems not measured used at most {max(idle):.2f} cores meanwhile (median of the rounds)")
    if rabbitmq is not None:
        print(f"{rabbitmq['label']}: {rabbitmq['replicas']}")


def rate(row):
    return "n/a" if row is None else f"{row['per_s']:,.0f} ({row['min_per_s']:,.0f}-{row['max_per_s']:,.0f})"


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="chunked",
                        help="brokerd backends to measure, a node each, comma-separated, of: " + ", ".join(BACKENDS))
    parser.add_argument("--no-rabbitmq", action="store_true", help="measure brokerd alone (no RabbitMQ node)")
    add_load_arguments(parser)
    parser.add_argument("--large-messages", type=int, default=5000, help="messages of the large-message row")
    parser.add_argument("--large-size", type=int, default=65536, help="body bytes of the large-message row")
    parser.add_argument("--large-window", type=int,
                        help="most unconfirmed publishes in the large-message row (default: --window)")
    return parser


def parse_options(argv):
    parser = build_parser()
    options = parser.parse_args(argv)
    options.backends = listed_names(parser, "--backends", options.backends, BACKENDS)
    if options.large_window is None:
        options.large_window = options.window
    if min(options.size, options.large_size) < 8:
        parser.error("--size and --large-size must be at least 8 (the body starts with the message number)")
    if min(options.messages, options.rounds, options.window, options.prefetch, options.ack_every,
           options.large_messages, options.large_window) < 1:
        parser.error("--messages, --rounds, --window, --prefetch, --ack-every, --large-messages and --large-window"
                     " must be positive")
    check_ack_every(parser, options)
    return options


def main(argv=None):
    options = parse_options(argv)
    report = run_benchmark("versus_rabbitmq", compare, options, prefix="brokerd-versus-rabbitmq-")
    if report is None:
        return None
    report["ratios"] = ratios(report)
    return print_report(report, options, print_table)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
