"""How a store keeps delayed messages: delays with random due times, a reopen,
then paging through everything by due time, straight through the store (no
broker, no network).

    python -m benchmarks.delayed_store --backend chunked --messages 1000000 --max-delay 3600000

Phases:

  delay    N messages delayed for a random 0..max-delay ms, one sync per --batch;
  reopen   the store closed and opened again: seconds until it answers, and
           the resident memory (VmRSS) right after;
  page     delayed_after in windows of --window from the start, each message
           released, one sync per window, until nothing is left; every key is
           checked to come after the one before.

Prints rates, the reopen time and the peak resident memory of the process
(ru_maxrss); --json prints one JSON object instead.
"""

import argparse
import json
import random
import resource
import shutil
import tempfile
import time

from twisted.internet import defer, task

from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy

EXCHANGE = ("/", "delayed-benchmark")
FOREVER = (1 << 63) - 1


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="chunked", help="backend string, as for --backend (default chunked)")
    parser.add_argument("--sync", default="always", help="always, interval:MS or none (default always)")
    parser.add_argument("--messages", type=int, default=100_000, help="delayed messages (default 100000)")
    parser.add_argument("--max-delay", type=int, default=3_600_000, help="longest delay in ms (default 3600000)")
    parser.add_argument("--size", type=int, default=100, help="body bytes per message (default 100)")
    parser.add_argument("--batch", type=int, default=10_000, help="delays per sync (default 10000)")
    parser.add_argument("--window", type=int, default=1000, help="messages per delayed_after window (default 1000)")
    parser.add_argument("--seed", type=int, default=1, help="of the random due times (default 1)")
    parser.add_argument("--data-dir", default=None, help="where the store keeps its files (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


def resident_kib(field="VmRSS"):
    """A figure of the process's memory now from /proc/self/status (VmRSS: resident; RssAnon: resident
    but not file-backed, which leaves out the chunk files a store maps), in KiB; 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@defer.inlineCallbacks
def measure(arguments, reactor):
    data_dir = arguments.data_dir or tempfile.mkdtemp(prefix="brokerd-delayed-bench-")
    policy = SyncPolicy.parse(arguments.sync)
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, content_type="text/plain")
    message = Message(EXCHANGE[1], "bench", properties, b"x" * arguments.size)
    rolls = random.Random(arguments.seed)
    now = int(time.time() * 1000)
    results = {"backend": arguments.backend, "sync": arguments.sync, "messages": arguments.messages,
               "max_delay_ms": arguments.max_delay, "size": arguments.size}
    store = registry.make_store(arguments.backend, data_dir, policy, reactor=reactor)
    try:
        yield store.open()
        started = time.perf_counter()
        left = arguments.messages
        while left:
            count = min(left, arguments.batch)
            for _ in range(count):
                store.delay(message, EXCHANGE, now + rolls.randrange(arguments.max_delay + 1))
            left -= count
            yield store.sync()
        results["delay_per_s"] = arguments.messages / (time.perf_counter() - started)
        results["delayed_rss_mib"] = resident_kib() / 1024
        results["delayed_anon_mib"] = resident_kib("RssAnon") / 1024
        started = time.perf_counter()
        if store.durable:  # a store that is not durable stands for itself after a "reopen"
            yield store.close()
            store = registry.make_store(arguments.backend, data_dir, policy, reactor=reactor)
            yield store.open()
        results["reopen_s"] = time.perf_counter() - started
        results["reopen_rss_mib"] = resident_kib() / 1024
        results["reopen_anon_mib"] = resident_kib("RssAnon") / 1024
        results["delayed_after_reopen"] = store.stats()["delayed"]

        started, cursor, seen = time.perf_counter(), None, 0
        while True:
            window = yield store.delayed_after(cursor, FOREVER, arguments.window)
            if not window:
                break
            for item in window:
                key = (item.due, item.handle)
                if cursor is not None and key <= cursor:
                    raise AssertionError(f"window out of order: {key} after {cursor}")
                cursor = key
                store.release(item.handle)
            seen += len(window)
            yield store.sync()
        results["page_per_s"] = seen / (time.perf_counter() - started)
        results["paged"] = seen
        results["paged_rss_mib"] = resident_kib() / 1024
        results["paged_anon_mib"] = resident_kib("RssAnon") / 1024
        results["delayed_at_end"] = store.stats()["delayed"]
        if seen != arguments.messages or results["delayed_at_end"] != 0:
            raise AssertionError(f"paged through {seen} of {arguments.messages}; {results['delayed_at_end']} left")
    finally:
        yield store.close()
        if arguments.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


def report(results, as_json):
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"{results['messages']} delayed messages of {results['size']} bytes over {results['max_delay_ms']} ms,"
          f" {results['backend']}, sync={results['sync']}:")
    def memory(phase):
        return (f"(then RSS {results[phase + '_rss_mib']:,.0f} MiB, {results[phase + '_anon_mib']:,.0f} MiB of it"
                " not file-backed)")

    print(f"  delay   {results['delay_per_s']:>12,.0f} msg/s {memory('delayed')}")
    print(f"  reopen  {results['reopen_s']:>12,.2f} s     {memory('reopen')}")
    print(f"  page    {results['page_per_s']:>12,.0f} msg/s {memory('paged')}")
    print("          (windows of delayed_after from the start, each message released, a sync per window)")
    print(f"  peak RSS {results['peak_rss_mib']:>11,.0f} MiB   (pages of mapped files included)")


def main(reactor, argv=None):
    arguments = parse_arguments(argv)
    return measure(arguments, reactor).addCallback(report, arguments.json)


if __name__ == "__main__":
    task.react(main)
