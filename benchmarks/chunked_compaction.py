"""Disk use of the chunked store with a parked queue, with and without compaction.

    python -m benchmarks.chunked_compaction [--messages 200000] [--queues 5]
        [--parked-share 0.02] [--chunk-size 16M] [--batch 1000] [--compare] [--json]

Publishes N persistent messages (bodies of 64 bytes to 2 KiB, seeded) to Q
durable queues of one ChunkedStore (no broker, no network), one sync per
batch as a publisher's confirms would wait: a share of them (``--parked-share``,
2 % as the validation workload routes; 0 sends them round robin to all Q) to
the first queue, which is parked and keeps all its messages, the others round
robin to the rest, which are consumed (acked) one batch behind. Then it drains the consumed queues and commits until
compaction has settled. It prints the chunk files and their bytes on disk
against the body bytes held, and the sync (confirm) latency per batch
(median and 99th percentile), for the store as configured (``--compact-below``,
0 turns compaction off) or, with ``--compare``, both ways.
"""

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time

from twisted.internet import defer, task

from backends.chunked import backend
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.storage.durability import SyncPolicy

SETTLE_SECONDS = 60  # at most, after the queues are drained


def message(number, size):
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id=str(number))
    return Message("", "q", properties, b"x" * size)


@defer.inlineCallbacks
def run(reactor, arguments, compact_below):
    directory = tempfile.mkdtemp(prefix="brokerd-compaction-bench-")
    try:
        store = backend.make_store(directory, SyncPolicy.parse(arguments.sync), reactor=reactor,
                                   chunk_size=arguments.chunk_size, compact_below=str(compact_below),
                                   compact_after_seconds=str(arguments.compact_after))
        yield store.open()
        queues = [("/", f"q{number}") for number in range(arguments.queues)]
        for vhost, name in queues:
            store.save_queue(messages_pb2.QueueRecord(vhost=vhost, name=name, durable=True))
        sizes = random.Random(19)
        pending, latencies, parked_bytes = [], [], 0
        started = time.perf_counter()
        for first in range(0, arguments.messages, arguments.batch):
            batch = []
            for number in range(first, min(first + arguments.batch, arguments.messages)):
                size = sizes.randint(64, 2048)
                if arguments.parked_share:
                    parked = sizes.random() < arguments.parked_share
                    queue = queues[0] if parked else queues[1 + number % (len(queues) - 1)]
                else:
                    queue = queues[number % len(queues)]
                handle = store.append(message(number, size), [queue])
                if queue == queues[0]:
                    parked_bytes += size
                else:
                    batch.append((queue, handle))
            for queue, handle in pending:
                store.ack(queue, handle)
            pending = batch
            began = time.perf_counter()
            yield store.sync()
            latencies.append(time.perf_counter() - began)
        for queue, handle in pending:
            store.ack(queue, handle)
        yield store.sync()
        published = time.perf_counter() - started
        deadline = time.monotonic() + SETTLE_SECONDS
        last = None
        while time.monotonic() < deadline:
            yield task.deferLater(reactor, 0.2, lambda: None)
            yield store.sync()
            figures = (store.stats()["append_position"], store.stats()["chunks"])
            if figures == last and store.stats()["compacted_chunks"] or not compact_below and figures == last:
                break
            last = figures
        stats = store.stats()
        yield store.close()
        latencies.sort()
        return {
            "compact_below": compact_below,
            "messages": arguments.messages,
            "parked_body_bytes": parked_bytes,
            "held_body_bytes": stats["bytes"],
            "chunks": stats["chunks"],
            "bytes_on_disk": stats["bytes_on_disk"],
            "compacted_chunks": stats["compacted_chunks"],
            "compacted_bytes": stats["compacted_bytes"],
            "publish_seconds": round(published, 2),
            "sync_ms_median": round(statistics.median(latencies) * 1000, 2),
            "sync_ms_p99": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def show(row):
    return (f"compact_below={row['compact_below']:>2}%: {row['chunks']} chunks, {row['bytes_on_disk'] / 1e6:.1f} MB on"
            f" disk for {row['held_body_bytes'] / 1e6:.1f} MB held ({row['compacted_chunks']} chunks compacted,"
            f" {row['compacted_bytes'] / 1e6:.1f} MB moved); publish {row['publish_seconds']} s, sync per batch"
            f" median {row['sync_ms_median']} ms, p99 {row['sync_ms_p99']} ms")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queues", type=int, default=5, help="the first is parked, the others consumed")
    parser.add_argument("--parked-share", type=float, default=0.02, help="of the messages, to the parked queue")
    parser.add_argument("--chunk-size", default="16M")
    parser.add_argument("--batch", type=int, default=1000, help="messages per sync")
    parser.add_argument("--sync", default="always")
    parser.add_argument("--compact-below", type=int, default=25)
    parser.add_argument("--compact-after", type=int, default=1,
                        help="compact_after_seconds (the option's default is 5)")
    parser.add_argument("--compare", action="store_true", help="run with compaction off, then as configured")
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args(argv)
    settings = [0, arguments.compact_below] if arguments.compare else [arguments.compact_below]

    @defer.inlineCallbacks
    def measure(reactor):
        for compact_below in settings:
            row = yield run(reactor, arguments, compact_below)
            print(json.dumps(row) if arguments.json else show(row), flush=True)

    task.react(measure)


if __name__ == "__main__":
    main()
