"""Failover of a three-node cluster under load: what a crash of the leader costs, and loses.

    python -m benchmarks.cluster_failover [--kills 50] [--backend chunked] [--interval 4]
        [--ttl 3] [--min-isr 2] [--json]

Starts etcd (Debian's etcd-server, on free loopback ports) and three ``twistd -n brokerd
--cluster-etcd ...`` nodes on fresh data directories, then runs a load through pika against
whichever node serves: a publisher sending persistent messages to a durable quorum queue, each
confirmed before the next, and a consumer acknowledging every delivery. Every --interval seconds
the current leader is killed with SIGKILL and started again (it comes back as a follower); the
next kill waits until the cluster has a leader again and every node is back in the in-sync set.
Clients reconnect to whichever node serves, trying each node's address in turn.

At the end the load stops, the queue is drained from the last leader, and it reports: confirmed
messages lost (neither acknowledged nor in the queue: must be 0), acknowledged messages that came
back (an acknowledgement is not confirmed to the consumer, so one in flight at a kill may come
back; one the leader took in before a publish that the same leader then confirmed must not: its
stream keeps their order), deliveries flagged redelivered, leaders that stepped down without a
kill (their lease not renewed in time on a loaded machine: a leadership ends there too), and
the time from each kill to the first confirm after it (p50 and max).
"""

import argparse
import base64
import bisect
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pika
from pika.exceptions import AMQPError

from brokerd.testing import BrokerProcess, poll_until

QUEUE = "benchmark-failover"
CLUSTER = "bench"
NAMES = ("a", "b", "c")
WAIT_SECONDS = 60.0


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Etcd:
    """A private single-member etcd on free loopback ports, in C{root}."""

    def __init__(self, root):
        client, peer = free_port(), free_port()
        self.url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self.log = open(os.path.join(root, "etcd.log"), "wb")
        self.process = subprocess.Popen(
            [shutil.which("etcd") or "/usr/bin/etcd", "--name", "bench",
             "--data-dir", os.path.join(root, "etcd"), "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls", peer_url,
             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"bench={peer_url}",
             "--log-level", "warn"], stdout=self.log, stderr=subprocess.STDOUT)
        poll_until(self._up, WAIT_SECONDS, f"etcd at {self.url}")

    def _up(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"etcd exited with status {self.process.returncode}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as answer:
                return json.load(answer).get("health") == "true" or None
        except OSError:
            return None

    def value(self, key):
        """The value (bytes) of C{key} over etcd's HTTP gateway, or None (also when down)."""
        request = urllib.request.Request(
            self.url + "/v3/kv/range", method="POST",
            data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode())
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                kvs = json.load(answer).get("kvs") or []
        except (OSError, ValueError):
            return None
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT_SECONDS)
        self.log.close()


class Node:
    """One brokerd node: its command, and the L{BrokerProcess} of its current run."""

    def __init__(self, root, name, etcd, args):
        self.name = name
        self.data_dir = os.path.join(root, name)
        self.log = open(os.path.join(root, f"{name}.log"), "a", encoding="utf-8")
        self.args = ["--data-dir", self.data_dir, "--native", "none", "--cluster-etcd", etcd.url,
                     "--cluster-name", CLUSTER, "--node-name", name,
                     "--replication", "tcp:0:interface=127.0.0.1", *args]
        self.process = None

    def start(self):
        os.makedirs(self.data_dir, exist_ok=True)
        self.process = BrokerProcess(self.args, cwd=self.data_dir, log=self.log)

    def lines(self):
        """The latest incarnation's lines (a leader that steps down re-executes itself)."""
        output = list(self.process.output) if self.process else []
        starts = [i for i, line in enumerate(output) if "starts again as a follower" in line]
        return output[starts[-1] + 1:] if starts else output

    def serves(self):
        mark = f"node {self.name} serves as the leader of cluster {CLUSTER}"
        return self.process.process.poll() is None and any(mark in line for line in self.lines())

    def amqp_address(self):
        mark = f"node {self.name} joined cluster {CLUSTER} (amqp=tcp:"
        for line in self.lines():
            if mark in line:
                host, port = line.split(mark, 1)[1].split()[0].rstrip(")").rsplit(":", 1)
                return host, int(port)
        return None

    def kill(self):
        if self.process is not None and self.process.process.poll() is None:
            self.process.kill()

    def close(self):
        self.kill()
        self.log.close()


class Cluster:
    """etcd and three nodes in a temporary directory."""

    def __init__(self, root, backend, ttl, min_isr):
        self.etcd = Etcd(root)
        args = ["--backend", backend, "--cluster-lease-ttl", str(ttl), "--cluster-min-isr",
                str(min_isr), "--cluster-max-lag-seconds", "2"]
        self.nodes = [Node(root, name, self.etcd, args) for name in NAMES]

    def leader(self):
        """The node etcd's leader key names, if it says it serves."""
        value = self.etcd.value(f"/brokerd/{CLUSTER}/leader")
        name = json.loads(value)["name"] if value else None
        return next((node for node in self.nodes if node.name == name and node.serves()), None)

    def wait_leader(self, other_than=None):
        return poll_until(lambda: (lambda node: node if node not in (None, other_than) else None)(
            self.leader()), WAIT_SECONDS, "a leader")

    def wait_all_in_sync(self):
        wanted = sorted(NAMES)
        poll_until(lambda: True if sorted(json.loads(self.etcd.value(f"/brokerd/{CLUSTER}/isr")
                                                     or b"[]")) == wanted else None,
                   WAIT_SECONDS, "every node in the in-sync set")

    def addresses(self):
        return [address for node in self.nodes if node.process is not None
                and node.process.process.poll() is None and (address := node.amqp_address())]

    def close(self):
        for node in self.nodes:
            node.close()
        self.etcd.stop()


SYNC_EVERY = 20  # acks between the consumer's round trips that show they were taken in
STEP_DOWN = "starts again as a follower"  # what a leader that lost its lease logs


class StepDowns(threading.Thread):
    """Notes when a node logs that it stepped down (a leadership that ended without a kill)."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stopping = threading.Event()
        self.times = []
        self._seen = {}  # id of a node's BrokerProcess -> step-downs seen in its output

    def run(self):
        while not self.stopping.wait(0.05):
            for node in self.cluster.nodes:
                process = node.process
                if process is None:
                    continue
                count = sum(STEP_DOWN in line for line in list(process.output))
                if count > self._seen.get(id(process), 0):
                    self._seen[id(process)] = count
                    self.times.append(time.monotonic())


def connect(address):
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=address[0], port=address[1], connection_attempts=1, socket_timeout=2, heartbeat=0))


class Client(threading.Thread):
    """A connection to whichever node serves, made again after each failure."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def run(self):
        turn = 0
        while not self.stopping.is_set():
            addresses = self.cluster.addresses()
            if not addresses:
                self.stopping.wait(0.05)
                continue
            turn += 1
            try:
                connection = connect(addresses[turn % len(addresses)])
            except (AMQPError, OSError):
                self.stopping.wait(0.05)
                continue
            try:
                channel = connection.channel()
                channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
                self.work(connection, channel)
            except (AMQPError, OSError):
                pass
            finally:
                try:
                    connection.close()
                except (AMQPError, OSError):
                    pass


class Publisher(Client):
    """Publishes with confirms, one message at a time; notes each confirm's time."""

    def __init__(self, cluster):
        super().__init__(cluster)
        self.number = 0
        self.confirmed = {}  # body -> monotonic time of its confirm
        self.sent = {}  # body -> monotonic time it was sent, for the confirmed ones

    def work(self, connection, channel):
        channel.confirm_delivery()
        while not self.stopping.is_set():
            body = f"m-{self.number}"
            self.number += 1
            sent = time.monotonic()
            channel.basic_publish("", QUEUE, body.encode(), pika.BasicProperties(delivery_mode=2))
            with self.lock:
                self.confirmed[body] = time.monotonic()
                self.sent[body] = sent


class Consumer(Client):
    """
    Consumes and acknowledges every delivery; notes the bodies acked and the redeliveries.
    Every SYNC_EVERY acks (and when idle) a basic.qos round trip on the same channel shows
    that the node took the acks in: an ack is known taken in from then on (C{taken}).
    """

    def __init__(self, cluster):
        super().__init__(cluster)
        self.acked = {}  # body -> monotonic time of its first ack
        self.taken = {}  # body -> when its ack was known taken in by the serving node
        self.again = []  # (body, when its first ack was taken in, or None) of each acked
        self.redelivered = 0

    def work(self, connection, channel):
        channel.basic_qos(prefetch_count=50)
        pending = []
        for method, _, body in channel.consume(QUEUE, inactivity_timeout=0.2):
            if self.stopping.is_set():
                break
            if method is not None:
                channel.basic_ack(method.delivery_tag)
                with self.lock:
                    self.redelivered += method.redelivered
                    body = body.decode()
                    if body in self.acked:
                        self.again.append((body, self.taken.get(body)))
                    else:
                        self.acked[body] = time.monotonic()
                        pending.append(body)
            if pending and (method is None or len(pending) >= SYNC_EVERY):
                channel.basic_qos(prefetch_count=50)  # answered after the acks before it
                with self.lock:
                    now = time.monotonic()
                    for body in pending:
                        self.taken[body] = now
                pending = []


def drain(address):
    connection = connect(address)
    channel = connection.channel()
    bodies = []
    while True:
        method, _, body = channel.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        bodies.append(body.decode())
    connection.close()
    return bodies


def run(arguments):
    root = tempfile.mkdtemp(prefix="brokerd-failover-")
    cluster = Cluster(root, arguments.backend, arguments.ttl, arguments.min_isr)
    publisher, consumer = Publisher(cluster), Consumer(cluster)
    try:
        for node in cluster.nodes:
            node.start()
        cluster.wait_leader()
        cluster.wait_all_in_sync()
        publisher.start()
        consumer.start()
        step_downs = StepDowns(cluster)
        step_downs.start()
        kill_to_confirm, kills = [], []
        for _ in range(arguments.kills):
            time.sleep(arguments.interval)  # the load runs between kills
            leader = cluster.wait_leader()
            killed_at = time.monotonic()
            leader.kill()
            kills.append(time.monotonic())  # dead from here on (what it took in until then counts)
            cluster.wait_leader(other_than=leader)
            poll_until(lambda: True if any(t > killed_at for t in list(publisher.confirmed.values()))
                       else None, WAIT_SECONDS, "a confirm after the kill")
            kill_to_confirm.append(min(t for t in list(publisher.confirmed.values()) if t > killed_at)
                                   - killed_at)
            leader.start()
            cluster.wait_all_in_sync()
        publisher.stopping.set()
        publisher.join(WAIT_SECONDS)
        consumer.stopping.set()
        consumer.join(WAIT_SECONDS)
        left = drain(cluster.wait_leader().amqp_address())
        step_downs.stopping.set()
    finally:
        cluster.close()
        if not arguments.keep:
            shutil.rmtree(root, ignore_errors=True)
    confirmed, acked = set(publisher.confirmed), set(consumer.acked)
    # An ack the leader had taken in before it took in a publish it then confirmed is as
    # durable as that publish (its stream keeps their order): such a message must not come
    # back. Known taken in: the consumer's basic.qos round trip after it; the publish sent
    # after that, and confirmed before the leadership ended (a kill, or a step-down when the
    # leader could not renew its lease): a confirm after that is another leader's, which
    # never saw the ack if the old one had not sent it on yet.
    published = sorted((publisher.sent[body], publisher.confirmed[body]) for body in publisher.sent)
    ends = sorted(kills + step_downs.times)
    sends = [sent for sent, _ in published]

    def durable(when):
        if when is None:
            return False
        later = bisect.bisect_right(sends, when)  # one at a time: the first confirms first
        if later == len(published):
            return False
        ended = ends[bisect.bisect_right(ends, when)] if ends and ends[-1] > when else None
        return ended is None or published[later][1] < ended
    wall = time.time() - time.monotonic()  # to read a monotonic time on the nodes' log clocks

    def describe(body):
        """What happened to a message that came back, in wall-clock seconds, for its logs."""
        taken = consumer.taken.get(body)
        later = bisect.bisect_right(sends, taken)
        return {"body": body, "acked": consumer.acked[body] + wall, "taken": taken + wall,
                "later_publish_sent": published[later][0] + wall,
                "later_publish_confirmed": published[later][1] + wall,
                "leadership_ended": [end + wall for end in ends if end > taken][:1],
                "again": sum(1 for again, _ in consumer.again if again == body),
                "left": body in left}

    came_back = {body for body, when in consumer.again if durable(when)}
    came_back |= {body for body in left if body in acked and durable(consumer.taken.get(body))}
    return {
        "backend": arguments.backend, "kills": len(kill_to_confirm),
        "confirmed": len(confirmed), "acked": len(acked), "left_in_queue": len(left),
        "confirmed_lost": len(confirmed - acked - set(left)),
        "durably_acked_came_back": len(came_back),
        "redelivered": consumer.redelivered,
        "step_downs": len(step_downs.times),
        "came_back_examples": [describe(body) for body in sorted(came_back)[:10]],
        "kill_to_confirm_p50_s": statistics.median(kill_to_confirm) if kill_to_confirm else None,
        "kill_to_confirm_max_s": max(kill_to_confirm, default=None),
        "files": root if arguments.keep else None,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=50, help="leaders to kill (default 50)")
    parser.add_argument("--backend", default="chunked", help="every node's --backend")
    parser.add_argument("--interval", type=float, default=4.0, help="seconds of load between kills")
    parser.add_argument("--ttl", type=int, default=3, help="--cluster-lease-ttl (default 3)")
    parser.add_argument("--min-isr", type=int, default=2, help="--cluster-min-isr (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data and logs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    arguments = parser.parse_args(argv)
    if shutil.which("etcd") is None and not os.access("/usr/bin/etcd", os.X_OK):
        parser.error("etcd (Debian's etcd-server) is not installed")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # runs the cleanup
    results = run(arguments)
    if arguments.json:
        print(json.dumps(results))
        return
    print(f"{results['kills']} kills of the leader ({results['backend']}): "
          f"{results['confirmed']} confirmed, {results['acked']} acked, "
          f"{results['left_in_queue']} left in the queue")
    print(f"confirmed messages lost: {results['confirmed_lost']}")
    print(f"durably acked messages that came back: {results['durably_acked_came_back']}")
    print(f"deliveries flagged redelivered: {results['redelivered']}")
    print(f"leaders that stepped down without a kill: {results['step_downs']}")
    if results["kills"]:
        print(f"kill to first confirm: p50 {results['kill_to_confirm_p50_s']:.2f} s,"
              f" max {results['kill_to_confirm_max_s']:.2f} s")


if __name__ == "__main__":
    main()
