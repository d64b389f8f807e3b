"""How long a leader's reactor stalls while it sends a follower a full snapshot of its stores.

    python -m benchmarks.replication_snapshot --messages 1000000 --size 100

The leader (this process) stores --messages messages of --size bytes in one
durable queue through a StoreTap, then serves replication on 127.0.0.1; a
follower in a child process (its own store, so its work does not count
against the leader's reactor) connects with an empty store and is told to
resync. While the snapshot starts and runs, the leader publishes one message
and acks one old message every --tick seconds, and records the gap between
ticks: the longest gap past the tick is the longest time publishing paused.

Prints the snapshot's position and duration, its rate, the longest and 99th
percentile tick gaps while it ran, how long taking the snapshot's view took
(the one blocking step: copying the taps' maps), and the leader's peak
resident memory, and the longest pause of Python's garbage collector in that
time (which grows with the heap, whatever replication does); --json prints one
JSON object instead.
"""

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from twisted.internet import defer, endpoints, reactor, task

from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.replication import snapshot as snapshot_module
from brokerd.replication.applier import StoreApplier
from brokerd.replication.follower import ReplicationClient
from brokerd.replication.leader import ReplicationServer
from brokerd.replication.stream import OutboundStream
from brokerd.replication.tap import StoreTap
from brokerd.storage.durability import SyncPolicy
from brokerd.storage.registry import make_store

SECRET = b"benchmark secret"
QUEUE = ("/", "snapshot-benchmark")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages stored (default 1000000)")
    parser.add_argument("--size", type=int, default=100, help="body bytes per message (default 100)")
    parser.add_argument("--backend", default="chunked", help="the leader's backend (default chunked)")
    parser.add_argument("--follower-backend", default="chunked", help="the follower's (default chunked)")
    parser.add_argument("--tick", type=float, default=0.001, help="seconds between publishes (default 0.001)")
    parser.add_argument("--data-dir", default=None, help="where both stores live (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--follow", metavar="PORT", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def open_store(backend, path, follower=False):
    """A store as a node opens it: a follower's commits on its reactor thread, and no cache."""
    policy = SyncPolicy("always").on_reactor() if follower else SyncPolicy("always")
    store = make_store(backend, path, policy, reactor=reactor, replica=follower)
    return store.open().addCallback(lambda _: store)


@defer.inlineCallbacks
def follow(arguments):
    """The child: an empty follower that resyncs from the leader, until the leader stops it."""
    store = yield open_store(arguments.follower_backend, arguments.data_dir, follower=True)
    applier = StoreApplier({"": store})
    yield applier.open()
    client = ReplicationClient(applier, SECRET, "benchmark-follower")
    endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", arguments.follow)
    yield endpoint.connect(client)
    yield client.when_lost()
    try:
        yield applier.flush()  # a commit may be running: let it end before the store closes
    finally:
        yield store.close()


@defer.inlineCallbacks
def fill(tap, count, size):
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT)
    tap.save_queue(messages_pb2.QueueRecord(vhost="/", name=QUEUE[1], durable=True))
    handles, body = [], b"b" * size
    for number in range(count):
        handles.append(tap.append(Message("", QUEUE[1], properties, body), [QUEUE]))
        if number % 20000 == 19999:
            yield tap.sync()
    yield tap.sync()
    return handles


class Ticks:
    """Publishes and acks every tick; keeps the gaps between ticks."""

    def __init__(self, tap, handles, tick):
        self.tap, self.handles, self.tick = tap, handles, tick
        self.properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT)
        self.gaps = []
        self.last = time.perf_counter()
        self.loop = task.LoopingCall(self.turn)

    def turn(self):
        now = time.perf_counter()
        self.gaps.append(now - self.last)
        self.last = now
        self.tap.append(Message("", QUEUE[1], self.properties, b"during the snapshot"), [QUEUE])
        if self.handles:
            self.tap.ack(QUEUE, self.handles.pop())


class GarbageCollections:
    """The longest pause of Python's cyclic garbage collector (which a large heap lengthens)."""

    def __init__(self):
        self.longest, self._started = 0.0, None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.longest = max(self.longest, time.perf_counter() - self._started)

    def stop(self):
        gc.callbacks.remove(self._callback)


def timed_views():
    """Wrap Snapshot so that the time its constructor blocks (the view copy) is kept."""
    taken = []
    original = snapshot_module.Snapshot.__init__

    def init(self, *args, **kwargs):
        started = time.perf_counter()
        original(self, *args, **kwargs)
        taken.append(time.perf_counter() - started)
    snapshot_module.Snapshot.__init__ = init
    return taken


@defer.inlineCallbacks
def lead(arguments, directory):
    stream = OutboundStream(64 * 1024 * 1024)
    leader_store = yield open_store(arguments.backend, os.path.join(directory, "leader"))
    tap = StoreTap(leader_store, stream)
    started = time.perf_counter()
    handles = yield fill(tap, arguments.messages, arguments.size)
    filled = time.perf_counter() - started
    server = ReplicationServer(stream, SECRET, "benchmark", reactor=reactor, history=())
    port = yield endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(server)
    views = timed_views()
    ticks = Ticks(tap, handles, arguments.tick)
    follower_dir = os.path.join(directory, "follower")
    os.makedirs(follower_dir)
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.replication_snapshot",
                              "--follow", str(port.getHost().port), "--data-dir", follower_dir,
                              "--follower-backend", arguments.follower_backend])
    collections = GarbageCollections()
    try:
        ticks.loop.start(arguments.tick)
        while not server.followers or next(iter(server.followers)).mode != "snapshot":
            yield task.deferLater(reactor, 0.001, lambda: None)
        link = next(iter(server.followers))
        began, position = time.perf_counter(), link.snapshot.position
        while link.acked < position:
            yield task.deferLater(reactor, 0.01, lambda: None)
        took = time.perf_counter() - began
        gaps = sorted(ticks.gaps)  # from before the follower's handshake to its last ack
    finally:
        collections.stop()
        if ticks.loop.running:
            ticks.loop.stop()
        yield port.stopListening()
        for link in tuple(server.followers):  # the child closes its store and exits
            link.transport.loseConnection()
        for _ in range(3000):
            if child.poll() is not None:
                break
            yield task.deferLater(reactor, 0.01, lambda: None)
        else:
            child.kill()
            child.wait()
        yield tap.close()
    return {
        "messages": arguments.messages, "size": arguments.size, "backend": arguments.backend,
        "follower_backend": arguments.follower_backend, "fill_seconds": round(filled, 2),
        "snapshot_position": position, "snapshot_seconds": round(took, 2),
        "snapshot_messages_per_second": round(arguments.messages / took),
        "view_seconds": round(views[0], 4) if views else None,
        "max_tick_gap_ms": round(gaps[-1] * 1000, 1) if gaps else None,
        "p99_tick_gap_ms": round(gaps[int(len(gaps) * 0.99)] * 1000, 1) if gaps else None,
        "ticks": len(gaps), "tick_ms": arguments.tick * 1000,
        "max_gc_pause_ms": round(collections.longest * 1000, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main(argv=None):
    arguments = parse_arguments(argv)
    if arguments.follow:
        task.react(lambda _: follow(arguments))
        return
    directory = arguments.data_dir or tempfile.mkdtemp(prefix="brokerd-snapshot-benchmark-")
    results = {}

    def run(_):
        return lead(arguments, directory).addCallback(results.update)
    try:
        task.react(run)
    except SystemExit as stopped:
        if stopped.code:
            raise
    finally:
        if arguments.data_dir is None:
            shutil.rmtree(directory, True)
    if arguments.json:
        print(json.dumps(results))
    else:
        for name, value in results.items():
            print(f"{name:30} {value}")


if __name__ == "__main__":
    main()
