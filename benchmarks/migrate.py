"""How fast ``brokerd-admin migrate`` moves a store to another backend, and
in how much memory.

    python -m benchmarks.migrate --messages 1000000 --from chunked --to sqlite

Phases:

  fill     N persistent messages of --size bytes written into a fresh store of
           the --from backend through its own API (no broker), spread over
           --queues durable queues, every --shared-every-th one for two queues
           at once, every 100th with a delivery count; one sync per 10000;
  migrate  ``brokerd-admin migrate`` run on that directory as a process
           of its own, as users run it: its copy and check times (from its
           report), its wall time, and its peak resident memory (ru_maxrss of
           that process alone).

Prints queued messages per second and MB/s of bodies for the copy and for the
whole run (copy, reopen and check), the migration's CPU time (which says more
than its wall time on a busy machine) and peak RSS; --json prints one
JSON object instead. The fill's time is not counted.
"""

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from twisted.internet import defer, task

from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy

FILL_SYNC_EVERY = 10_000
TIMES = re.compile(r"copied in (?P<copy>[\d.]+) s, checked in (?P<check>[\d.]+) s")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", default="chunked", help="source backend string (default chunked)")
    parser.add_argument("--to", dest="target", default="sqlite", help="target backend string (default sqlite)")
    parser.add_argument("--messages", type=int, default=100_000, help="messages written (default 100000)")
    parser.add_argument("--size", type=int, default=100, help="body bytes per message (default 100)")
    parser.add_argument("--queues", type=int, default=4, help="durable queues (default 4)")
    parser.add_argument("--shared-every", type=int, default=10,
                        help="every Nth message goes to two queues (default 10; 0: none)")
    parser.add_argument("--data-dir", default=None, help="where the stores keep their files (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


@defer.inlineCallbacks
def fill(arguments, data_dir, reactor):
    """Write the source store; returns the number of queue entries (messages counted per queue holding them)."""
    store = registry.make_store(arguments.source, data_dir, SyncPolicy("none"), reactor=reactor)
    yield store.open()
    queues = [("/", f"migrate-bench-{number}") for number in range(arguments.queues)]
    for vhost, name in queues:
        store.save_queue(messages_pb2.QueueRecord(vhost=vhost, name=name, durable=True,
                                                  arguments=dict_to_table({"x-max-priority": 5})))
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, content_type="text/plain",
                                              priority=1)
    body = b"x" * arguments.size
    entries = 0
    try:
        for number in range(arguments.messages):
            first = number % len(queues)
            held = [queues[first]]
            if arguments.shared_every and number % arguments.shared_every == 0 and len(queues) > 1:
                held.append(queues[(first + 1) % len(queues)])
            handle = store.append(Message("", held[0][1], properties, body), held)
            entries += len(held)
            if number % 100 == 0:
                store.returned(held[0], handle, 1)
            if number % FILL_SYNC_EVERY == FILL_SYNC_EVERY - 1:
                yield store.sync()
        yield store.sync()
    finally:
        yield store.close()
    return entries


def run_migration(arguments, data_dir):
    """Run the command as a process of its own: its report and wall seconds."""
    command = [sys.executable, "-m", "brokerd.admin", "migrate", "--data-dir", data_dir, "--from", arguments.source,
               "--to", arguments.target, "--quiet"]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    output, errors = process.communicate()
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"the migration failed ({process.returncode}): {errors.strip()}")
    return output, wall


@defer.inlineCallbacks
def measure(arguments, reactor):
    data_dir = arguments.data_dir or tempfile.mkdtemp(prefix="brokerd-migrate-bench-")
    try:
        entries = yield fill(arguments, data_dir, reactor)
        output, wall = run_migration(arguments, data_dir)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # of the one child: the migration
    finally:
        if arguments.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    times = TIMES.search(output)
    if times is None:
        raise SystemExit(f"no timing in the migration's report: {output!r}")
    copy, check = float(times["copy"]), float(times["check"])
    megabytes = entries * arguments.size / 1e6
    return {
        "from": arguments.source, "to": arguments.target, "messages": arguments.messages, "entries": entries,
        "size": arguments.size, "queues": arguments.queues,
        "copy_s": copy, "check_s": check, "wall_s": wall,
        "copy_per_s": entries / copy if copy else 0.0, "copy_mb_per_s": megabytes / copy if copy else 0.0,
        "wall_per_s": entries / wall, "wall_mb_per_s": megabytes / wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def report(results, as_json):
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"{results['messages']} messages of {results['size']} bytes ({results['entries']} queued, over"
          f" {results['queues']} queues), {results['from']} -> {results['to']}:")
    print(f"  copy          {results['copy_per_s']:>10,.0f} msg/s {results['copy_mb_per_s']:>7,.1f} MB/s"
          f"  ({results['copy_s']:.1f} s)")
    print(f"  whole run     {results['wall_per_s']:>10,.0f} msg/s {results['wall_mb_per_s']:>7,.1f} MB/s"
          f"  ({results['wall_s']:.1f} s: start, copy, reopen and check {results['check_s']:.1f} s)")
    print(f"  CPU time      {results['cpu_s']:>10,.1f} s   (of the migration process, all its threads)")
    print(f"  peak RSS      {results['peak_rss_mib']:>10,.0f} MiB (the migration process)")


def main(reactor, argv=None):
    arguments = parse_arguments(argv)
    return measure(arguments, reactor).addCallback(report, arguments.json)


if __name__ == "__main__":
    task.react(main)
