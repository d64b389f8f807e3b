"""Persistent-message throughput of the durable backends under each --sync mode, through the broker.

    python -m benchmarks.store_throughput [--backends sqlite,filelog,chunked]
        [--sync always,interval:100,none] [--messages N] [--json]

For each backend, sync mode and message size (N bodies of 100 bytes, then N/10
of 64 KiB) it starts ``twistd -n brokerd --backend=B --sync=S`` on a fresh data
directory and measures, over AMQP with the pipelining raw-socket client of
L{brokerd.loadgen.amqp_client}:

  publish   N persistent messages (delivery mode 2) to a durable queue with
            publisher confirms, at most --window unconfirmed; the rate counts
            until the last confirm. The broker's resident memory (VmRSS) holding
            the backlog is read then. The broker is then stopped with SIGTERM and
            the "fsyncs" and "commits" of its "store stats at stop" log line are
            divided by the publish time (each size gets its own broker, so the
            counts are that phase's alone); with --kill it is SIGKILLed instead,
            as a crash, and those two columns are left empty;
  recover   the broker restarted on the same directory: seconds until it
            listens again with every message recovered, and its resident
            memory (VmRSS) then;
  consume   the recovered messages with prefetch --prefetch and one multiple
            basic.ack per --ack-every deliveries, each checked for number and
            order; the rate counts until the last delivery (--no-consume skips
            the restart and this phase).

MB/s is body bytes (10^6) per second. Next to each phase's figure it prints how
many cores the broker process kept busy over that phase (CPU seconds from /proc
over the phase's wall seconds: 1.0 is one core busy throughout; for the recovery,
all the restarted broker's CPU until it listens). ``--profile DIR`` runs each publishing
broker under twistd's cProfile and saves its stats in DIR. The store alone,
without broker or network, is measured by L{benchmarks.store_direct_throughput}.
"""

import argparse
import json
import pathlib
import re
import shutil
import sys
import tempfile
import time

from pamqp import commands

from benchmarks.amqp_throughput import Consumer, Publisher, parse_address
from brokerd.loadgen.amqp_client import Connection, Loop
from brokerd.loadgen.amqp_codec import PERSISTENT_PROPERTIES, BenchmarkError
from brokerd.loadgen.process_cpu import CpuWindow, cpu_seconds, format_cores
from brokerd.testing import BrokerProcess

QUEUE = "benchmark-store"
SIZES = (("100 B", 100, 1), ("64 KiB", 64 * 1024, 10))  # label, body bytes, divisor of N
STATS = re.compile(r"store stats at stop: (?P<stats>\{.*\})")
WAIT_SECONDS = 600  # for a broker to start (recovery included) or stop


class StoreBroker:
    """A broker subprocess with one backend and sync mode on one data directory."""

    def __init__(self, backend, sync, data_dir, profile=None):
        twistd_args = [f"--profile={profile}", "--profiler=cprofile", "--savestats"] if profile else []
        self.process = BrokerProcess(
            [f"--backend={backend}", "--data-dir", str(data_dir), f"--sync={sync}", "--native", "none",
             "--amqp", "tcp:0:interface=127.0.0.1", "--memory-high-watermark", "8G"],
            cwd=data_dir.parent,
            twistd_args=twistd_args,
        )
        self.pid = self.process.process.pid
        try:
            self.address = parse_address(self.process.wait_listening("AMQP", timeout=WAIT_SECONDS))
        except AssertionError as problem:
            self.process.kill()
            raise BenchmarkError(f"{backend} --sync={sync}: {problem}") from None

    def stop(self):
        """SIGTERM; returns the store stats the broker logged at stop."""
        status = self.process.stop(timeout=WAIT_SECONDS)
        for line in reversed(self.process.output):
            found = STATS.search(line)
            if found:
                return json.loads(found["stats"])
        raise BenchmarkError(f"the broker exited with {status} without logging its store stats:\n" + self.tail())

    def fail(self, error):
        """Kill the broker; a BenchmarkError saying C{error} with its last log lines."""
        self.process.kill()
        return BenchmarkError(f"{error}\nlast lines of the broker:\n{self.tail()}")

    def tail(self):
        return "\n".join(self.process.output[-30:])


def publish(address, count, size, window, broker_pid=None):
    """
    Publish C{count} persistent C{size}-byte messages with confirms to the durable
    queue; returns the seconds it took and the cores process C{broker_pid} kept busy.
    """
    loop = Loop()
    connection = Connection(loop, *address, "store-benchmark-publisher")
    try:
        connection.open()
        connection.rpc(commands.Queue.Declare(queue=QUEUE, durable=True), commands.Queue.DeclareOk)
        connection.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        publisher = Publisher(connection, count, size, window, 0, 1, queue=QUEUE, properties=PERSISTENT_PROPERTIES)
        broker_cpu = CpuWindow(broker_pid).start()
        started = time.perf_counter()
        publisher.start()
        loop.run_until(
            lambda: publisher.done,
            lambda: f"publishing, {publisher.sent} sent, {publisher.confirmed} confirmed",
            lambda: publisher.confirmed,
        )
        broker_cores = broker_cpu.cores_busy()
        elapsed = publisher.finished_at - started
        connection.close()
    finally:
        connection.shut()
    return elapsed, broker_cores


def consume(address, count, size, prefetch, ack_every, broker_pid=None):
    """
    Consume and ack the C{count} recovered messages, checking number and order;
    returns the seconds it took and the cores process C{broker_pid} kept busy.
    """
    loop = Loop()
    connection = Connection(loop, *address, "store-benchmark-consumer")
    try:
        connection.open()
        declared = connection.rpc(commands.Queue.Declare(queue=QUEUE, durable=True), commands.Queue.DeclareOk)
        if declared.message_count != count:
            raise BenchmarkError(f"{declared.message_count} messages recovered, {count} were confirmed")
        connection.rpc(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        consumer = Consumer(connection, count, size, ack_every, 0, queue=QUEUE)
        broker_cpu = CpuWindow(broker_pid).start()
        started = time.perf_counter()
        consumer.start()
        loop.run_until(
            lambda: consumer.done, lambda: f"consuming, {consumer.received} received", lambda: consumer.received
        )
        broker_cores = broker_cpu.cores_busy()
        elapsed = consumer.finished_at - started
        consumer.cancel()
        connection.close()
    finally:
        connection.shut()
    return elapsed, broker_cores


def measure(backend, sync, label, size, count, options, workdir):
    """One row: publish (and the fsync figures), then, unless told not to, recover and consume."""
    name = f"{backend}-{sync.replace(':', '-')}-{size}"
    data_dir = workdir / name
    profile = None
    if options.profile:
        profile = pathlib.Path(options.profile).resolve() / f"{name}.cprofile"
        profile.parent.mkdir(parents=True, exist_ok=True)
    row = {"backend": backend, "sync": sync, "size": size, "label": label, "messages": count}
    broker = StoreBroker(backend, sync, data_dir, profile)
    try:
        seconds, publish_cores = publish(broker.address, count, size, options.window, broker.pid)
    except (BenchmarkError, OSError) as error:
        raise broker.fail(f"{name}, publishing: {error}") from None
    row["holding_rss_mb"] = resident_megabytes(broker.pid)
    if options.kill:
        broker.process.kill()
        stats = {}
    else:
        stats = broker.stop()
    row.update(
        publish_s=seconds,
        publish_per_s=count / seconds,
        publish_mb_per_s=count * size / seconds / 1e6,
        publish_broker_cpu=publish_cores,
        fsyncs=stats.get("fsyncs"),
        commits=stats.get("commits"),
        fsyncs_per_s=stats["fsyncs"] / seconds if "fsyncs" in stats else None,
        commits_per_s=stats["commits"] / seconds if "commits" in stats else None,
        store_stats=stats,
    )
    if profile:
        row["profile"] = str(profile)
    if not options.no_consume:
        started = time.perf_counter()
        broker = StoreBroker(backend, sync, data_dir)
        row["recover_s"] = time.perf_counter() - started
        recover_cpu = cpu_seconds(broker.pid)
        row["recover_broker_cpu"] = None if recover_cpu is None else recover_cpu / row["recover_s"]
        row["recovered_rss_mb"] = resident_megabytes(broker.process.process.pid)
        try:
            seconds, consume_cores = consume(broker.address, count, size, options.prefetch, options.ack_every,
                                             broker.pid)
        except (BenchmarkError, OSError) as error:
            raise broker.fail(f"{name}, consuming after the restart: {error}") from None
        broker.stop()
        row.update(consume_s=seconds, consume_per_s=count / seconds, consume_mb_per_s=count * size / seconds / 1e6,
                   consume_broker_cpu=consume_cores)
    shutil.rmtree(data_dir, ignore_errors=True)
    return row


def resident_megabytes(pid):
    """The resident set size of process C{pid}, in MB (10^6 bytes), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    raise BenchmarkError(f"no VmRSS for process {pid}")


def print_table(rows):
    """One line per row; each "cpu" column is the cores the broker kept busy in the phase before it, the first
    "RSS MB" the publishing broker's resident memory holding the backlog, the second the restarted one's."""
    header = (f"{'backend':<8} {'sync':<12} {'size':>6} {'messages':>8} {'publish msg/s':>13} {'MB/s':>7}"
              f" {'cpu':>4} {'RSS MB':>7} {'fsyncs/s':>8} {'commits/s':>9} {'msgs/commit':>11} {'recover s':>9}"
              f" {'cpu':>4} {'RSS MB':>7} {'consume msg/s':>13} {'cpu':>4}")
    print(header)
    print("-" * len(header))
    for row in rows:
        per_commit = f"{row['messages'] / row['commits']:>11,.1f}" if row["commits"] else f"{'-':>11}"
        fsyncs = f"{row['fsyncs_per_s']:>8,.0f}" if row["fsyncs_per_s"] is not None else f"{'-':>8}"
        commits = f"{row['commits_per_s']:>9,.0f}" if row["commits_per_s"] is not None else f"{'-':>9}"
        recover = f"{row['recover_s']:>9.2f}" if "recover_s" in row else f"{'-':>9}"
        rss = f"{row['recovered_rss_mb']:>7.0f}" if "recovered_rss_mb" in row else f"{'-':>7}"
        consume = f"{row['consume_per_s']:>13,.0f}" if "consume_per_s" in row else f"{'-':>13}"
        cores = {phase: f"{cores_column(row, phase):>4}" for phase in ("publish", "recover", "consume")}
        print(f"{row['backend']:<8} {row['sync']:<12} {row['label']:>6} {row['messages']:>8}"
              f" {row['publish_per_s']:>13,.0f} {row['publish_mb_per_s']:>7,.1f} {cores['publish']}"
              f" {row['holding_rss_mb']:>7.0f} {fsyncs} {commits} {per_commit} {recover} {cores['recover']}"
              f" {rss} {consume} {cores['consume']}")


def cores_column(row, phase):
    """The cores busy in C{phase}: a figure, n/a if unreadable, - if the phase did not run."""
    field = f"{phase}_broker_cpu"
    return format_cores(row[field]) if field in row else "-"


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,filelog,chunked", help="comma-separated backend names")
    parser.add_argument("--sync", default="always,interval:100,none", help="comma-separated --sync values")
    parser.add_argument("--messages", type=int, default=200_000, help="100-byte messages; N/10 of 64 KiB")
    parser.add_argument("--sizes", default="100,65536", help="which of the two sizes to run: 100 and/or 65536")
    parser.add_argument("--window", type=int, default=2000, help="most unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--no-consume", action="store_true", help="skip the restart and the consume phase")
    parser.add_argument("--kill", action="store_true",
                        help="SIGKILL the publishing broker (a crash) rather than stop it, before the restart")
    parser.add_argument("--profile", metavar="DIR", help="save a cProfile of each publishing broker in DIR")
    parser.add_argument("--workdir", help="where the data directories go (default: a new temp dir)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    return parser


def main(argv=None):
    parser = build_parser()
    options = parser.parse_args(argv)
    backends = [name for name in options.backends.split(",") if name]
    syncs = [mode for mode in options.sync.split(",") if mode]
    try:
        sizes = {int(size) for size in options.sizes.split(",") if size}
    except ValueError:
        sizes = None
    if not sizes or not sizes <= {size for _, size, _ in SIZES}:
        parser.error("--sizes takes 100 and/or 65536")
    if options.messages < 10 or options.window < 1 or options.ack_every < 1 or options.prefetch < 0:
        parser.error("--messages must be at least 10, --window and --ack-every positive, --prefetch not negative")
    if options.prefetch and options.ack_every > options.prefetch:
        parser.error("--ack-every larger than --prefetch would stall the consumer")
    workdir = pathlib.Path(options.workdir or tempfile.mkdtemp(prefix="brokerd-store-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    failed = False
    try:
        for backend in backends:
            for sync in syncs:
                for label, size, divisor in SIZES:
                    if size in sizes:
                        rows.append(measure(backend, sync, label, size, options.messages // divisor, options, workdir))
                        print(f"done: {backend} --sync={sync} {label}", file=sys.stderr, flush=True)
    except (BenchmarkError, OSError) as error:
        print(f"store_throughput: {error}", file=sys.stderr)
        failed = True
    finally:
        if not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    if rows:  # what was measured before a failure is still worth seeing
        if options.json:
            print(json.dumps(rows, indent=2))
        else:
            print_table(rows)
    return None if failed else rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
