"""How fast a store takes persistent messages: batches of appends then one
sync, then the same for acks, straight through IMessageStore (no broker, no
network). Prints msgs/s, MB/s and fsyncs/s per phase.

    python -m benchmarks.store_direct_throughput --backend sqlite --size 100 --messages 200000
"""

import argparse
import json
import shutil
import tempfile
import time

from twisted.internet import defer, task

from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy

QUEUE = ("/", "bench")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sqlite", help="backend string, as for --backend (default sqlite)")
    parser.add_argument("--sync", default="always", help="always, interval:MS or none (default always)")
    parser.add_argument("--size", type=int, default=100, help="body bytes per message (default 100)")
    parser.add_argument("--messages", type=int, default=100_000, help="messages in all (default 100000)")
    parser.add_argument("--batch", type=int, default=1000, help="appends or acks per sync (default 1000)")
    parser.add_argument("--data-dir", default=None, help="where the store keeps its files (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


@defer.inlineCallbacks
def timed(store, batches, operation):
    """Run C{operation(batch)} then one sync per batch; returns (seconds, fsyncs)."""
    fsyncs = store.stats().get("fsyncs", 0)
    started = time.perf_counter()
    for batch in batches:
        operation(batch)
        yield store.sync()
    return time.perf_counter() - started, store.stats().get("fsyncs", 0) - fsyncs


@defer.inlineCallbacks
def measure(arguments, reactor):
    data_dir = arguments.data_dir or tempfile.mkdtemp(prefix="brokerd-store-bench-")
    store = registry.make_store(arguments.backend, data_dir, SyncPolicy.parse(arguments.sync), reactor=reactor)
    yield store.open()
    store.save_queue(messages_pb2.QueueRecord(vhost=QUEUE[0], name=QUEUE[1], durable=True))
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT,
                                              content_type="application/octet-stream")
    message = Message("amq.direct", QUEUE[1], properties, b"x" * arguments.size)
    counts = [arguments.batch] * (arguments.messages // arguments.batch)
    handles = []

    def append(count):
        handles.append([store.append(message, [QUEUE]) for _ in range(count)])

    def ack(batch):
        for handle in batch:
            store.ack(QUEUE, handle)

    results = {"backend": arguments.backend, "sync": arguments.sync, "size": arguments.size, "messages": sum(counts)}
    try:
        for phase, batches, operation in (("append", counts, append), ("ack", handles, ack)):
            seconds, fsyncs = yield timed(store, batches, operation)
            results[f"{phase}_per_s"] = results["messages"] / seconds
            results[f"{phase}_mb_per_s"] = results["messages"] * arguments.size / seconds / 1e6
            results[f"{phase}_fsyncs_per_s"] = fsyncs / seconds
    finally:
        yield store.close()
        if arguments.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    return results


def main(reactor, argv=None):
    arguments = parse_arguments(argv)
    measuring = measure(arguments, reactor)

    def report(results):
        if arguments.json:
            print(json.dumps(results, indent=2))
            return
        print(f"{results['messages']} messages of {results['size']} bytes, {results['backend']},"
              f" sync={results['sync']}:")
        for phase in ("append", "ack"):
            print(
                f"  {phase:<7} {results[phase + '_per_s']:>10,.0f} msg/s {results[phase + '_mb_per_s']:>9,.1f} MB/s"
                f" {results[phase + '_fsyncs_per_s']:>8,.0f} fsyncs/s"
            )

    return measuring.addCallback(report)


if __name__ == "__main__":
    task.react(main)
