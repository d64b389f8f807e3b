"""
A brokerd cluster for tests and benchmarks: a private etcd (L{tests.support.etcd.EtcdProcess})
and N ``twistd -n brokerd --cluster-etcd ...`` nodes, each a L{brokerd.testing.BrokerProcess}
with its own data directory, backend and log file (every line of every incarnation, kept in
the cluster's directory for a failure to be read after), plus the pika clients the cluster
tests drive it with: a publisher with confirms that follows the cluster across failovers,
and a reader of everything a queue holds.

A node is an incarnation at a time: a node that stops leading re-executes itself as a follower
in the same process (it logs "starts again as a follower"), and L{Node.restart} starts a new
process; what a node says (its client addresses, whether it serves) is read from its latest
incarnation's lines only. L{ClusterProcesses.leader} trusts a node's word that it serves only
when etcd's leader key, read over etcd's HTTP gateway, names it too.
"""

import base64
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request

import pika
import pytest
from pika.exceptions import AMQPError

from brokerd.testing import BrokerProcess, poll_until
from tests.support.etcd import EtcdProcess

TTL = 3  # the lease of the tests' nodes, in seconds
TAKEOVER_MARGIN = 3.0  # seconds past the lease's TTL a new leader may take to serve
MAX_LAG = 2  # the tests' --cluster-max-lag-seconds
LAG_MARGIN = 3.0  # seconds past MAX_LAG a stopped follower may stay in the in-sync set

CLUSTER = "c"
JOINED = "node {name} joined cluster {cluster} ("
SERVES = "node {name} serves as the leader of cluster {cluster}"
STARTS_AGAIN = "starts again as a follower"
START_SECONDS = 30.0
CONNECT_SECONDS = 2.0
NOISE = "_HTTP11ClientFactory"  # a line per request to etcd


class Node:
    """
    One node of a L{ClusterProcesses}: its options, its data directory and log file, and the
    L{BrokerProcess} of its current run (None before L{start} and after L{kill} or L{stop}).
    """

    def __init__(self, cluster, name, backend, options):
        self.cluster = cluster
        self.name = name
        self.backend = backend
        self.options = list(options)
        self.data_dir = os.path.join(cluster.root, name)
        self.log_path = os.path.join(cluster.root, f"{name}.log")
        self.process = None
        self.runs = 0
        self._log = None

    def command(self, etcd_url=None):
        """The brokerd options of this node (etcd at C{etcd_url}, by default the cluster's)."""
        settings = self.cluster.settings
        return [
            "--backend", self.backend, "--data-dir", self.data_dir, "--native", "none",
            "--cluster-etcd", etcd_url or self.cluster.etcd.url,
            "--cluster-name", settings["cluster_name"], "--node-name", self.name,
            "--replication", "tcp:0:interface=127.0.0.1",
            "--cluster-lease-ttl", str(settings["ttl"]),
            "--cluster-min-isr", str(settings["min_isr"]),
            "--cluster-max-lag-seconds", str(settings["max_lag_seconds"]),
            *self.options,
        ]

    def start(self, etcd_url=None):
        """Starts a new run of this node (it must not be running); returns self."""
        assert not self.running(), f"node {self.name} is already running"
        os.makedirs(self.data_dir, exist_ok=True)
        if self._log is None:
            self._log = open(self.log_path, "a", encoding="utf-8")
        self.runs += 1
        self._log.write(f"--- run {self.runs} of node {self.name}\n")
        self.process = BrokerProcess(self.command(etcd_url), cwd=self.data_dir, log=self._log)
        return self

    def running(self):
        return self.process is not None and self.process.process.poll() is None

    @property
    def pid(self):
        return self.process.process.pid

    def lines(self):
        """What this node's latest incarnation printed: a leader that re-executed itself as a
        follower starts a new incarnation in the same process."""
        if self.process is None:
            return []
        output = list(self.process.output)
        starts = [index for index, line in enumerate(output) if STARTS_AGAIN in line]
        return output[starts[-1] + 1:] if starts else output

    def incarnations(self):
        """How many times this run of the node re-executed itself, plus one."""
        if self.process is None:
            return 0
        return 1 + sum(STARTS_AGAIN in line for line in list(self.process.output))

    def says_it_serves(self):
        marker = SERVES.format(name=self.name, cluster=self.cluster.settings["cluster_name"])
        return any(marker in line for line in self.lines())

    def addresses(self):
        """Label -> C{(host, port)} this incarnation announced when it joined, or None before."""
        marker = JOINED.format(name=self.name, cluster=self.cluster.settings["cluster_name"])
        for line in self.lines():
            if marker in line:
                words = line.split(marker, 1)[1].rstrip(")").split()
                pairs = (word.split("=", 1) for word in words)
                return {label: _host_port(value) for label, value in pairs}
        return None

    def wait_joined(self, timeout=START_SECONDS):
        """This incarnation's announced addresses, once it joined the cluster."""

        def joined():
            if not self.running():
                raise AssertionError(f"node {self.name} exited with status "
                                     f"{self.process.process.returncode}:\n{self.tail()}")
            return self.addresses()

        return poll_until(joined, timeout, f"join of node {self.name}")

    def amqp_address(self):
        """C{(host, port)} of this incarnation's AMQP port, or None before it joined."""
        addresses = self.addresses()
        return addresses.get("amqp") if addresses else None

    def tail(self, lines=40):
        """This run's last lines, less the etcd client's connection pool chatter."""
        if self.process is None:
            return "(not started)"
        said = [line for line in list(self.process.output) if NOISE not in line]
        return "\n".join(said[-lines:])

    # -- signals

    def kill(self):
        """SIGKILL (a crash), waited for."""
        if self.process is not None:
            self.resume()
            self.process.kill()

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.resume()
        return self.process.stop()

    def pause(self):
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self):
        if self.running():
            os.kill(self.pid, signal.SIGCONT)

    def restart(self, crash=True):
        """Kills (or stops) this node if it runs, and starts a new run of it."""
        if self.running():
            self.kill() if crash else self.stop()
        return self.start()

    def wipe(self):
        """Removes this node's data directory (the node must not be running)."""
        assert not self.running()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def close(self):
        if self.process is not None and self.process.process.poll() is None:
            self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


def _host_port(endpoint):
    _, host, port = endpoint.rsplit(":", 2)
    return host, int(port)


class ClusterProcesses:
    """
    etcd and the nodes of one cluster, all in C{root}; L{close} ends every process it started.

    @ivar nodes: name -> L{Node}, in the order they were added.
    """

    def __init__(self, root, *, cluster_name=CLUSTER, ttl=3, min_isr=1, max_lag_seconds=5,
                 etcd=None):
        """
        @param root: the directory of the cluster's files: a folder per cluster name in it.
        @param etcd: a running L{EtcdProcess} of another cluster to share (it stays that
            cluster's to stop), or None for one of its own.
        """
        self.root = os.path.join(str(root), cluster_name)
        os.makedirs(self.root, exist_ok=True)
        self.settings = dict(cluster_name=cluster_name, ttl=ttl, min_isr=min_isr,
                             max_lag_seconds=max_lag_seconds)
        self._own_etcd = etcd is None
        self.etcd = EtcdProcess() if etcd is None else etcd
        self.nodes = {}

    def start(self, names=("a", "b", "c"), backends=None, options=()):
        """Starts etcd and one node per name (each with the backend C{backends[name]}, chunked
        by default): the first alone, until it serves, so that it leads, then the others, until
        they joined; returns self."""
        if self._own_etcd:
            self.etcd.start()
        first, *others = [self.add(name, (backends or {}).get(name, "chunked"), options)
                          for name in names]
        first.start()
        self.wait_leader()
        for node in others:
            node.start()
        for node in others:
            node.wait_joined()
        return self

    def add(self, name, backend="chunked", options=()):
        """A new L{Node} of this cluster, not started."""
        node = self.nodes[name] = Node(self, name, backend, options)
        return node

    def __getitem__(self, name):
        return self.nodes[name]

    # -- etcd, read over its HTTP gateway

    def etcd_value(self, key):
        """The value (bytes) of C{key} under this cluster's root in etcd, or None."""
        path = f"/brokerd/{self.settings['cluster_name']}/{key}".encode()
        request = urllib.request.Request(
            self.etcd.url + "/v3/kv/range", method="POST",
            data=json.dumps({"key": base64.b64encode(path).decode()}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=CONNECT_SECONDS) as answer:
            kvs = json.load(answer).get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def leader_name(self):
        """The node etcd's leader key names, or None."""
        value = self.etcd_value("leader")
        return json.loads(value)["name"] if value else None

    def in_sync_set(self):
        """etcd's in-sync set (a sorted list of names), or None."""
        value = self.etcd_value("isr")
        return sorted(json.loads(value)) if value else None

    # -- leadership

    def leader(self):
        """The node whose latest incarnation logged that it serves as leader and that etcd's
        leader key names, or None."""
        try:
            name = self.leader_name()
        except (OSError, urllib.error.URLError, ValueError):
            return None
        node = self.nodes.get(name)
        return node if node is not None and node.running() and node.says_it_serves() else None

    def wait_leader(self, timeout=START_SECONDS, other_than=None):
        """The leader (see L{leader}) once there is one other than node C{other_than}."""

        def found():
            node = self.leader()
            return node if node is not None and node is not other_than else None

        try:
            return poll_until(found, timeout, "leader" + (
                f" other than {other_than.name}" if other_than is not None else ""))
        except AssertionError as problem:
            raise AssertionError(f"{problem}\n{self.describe()}") from None

    def wait_in_sync_set(self, names, timeout=START_SECONDS):
        """Waits until etcd's in-sync set is exactly C{names}."""
        wanted = sorted(names)
        try:
            return poll_until(lambda: True if self.in_sync_set() == wanted else None, timeout,
                              f"in-sync set {wanted}")
        except AssertionError as problem:
            raise AssertionError(f"{problem}: it is {self.in_sync_set()}\n"
                                 f"{self.describe()}") from None

    def amqp_address(self, node):
        """C{(host, port)} of C{node}'s AMQP port (a L{Node} or a name)."""
        node = self.nodes[node] if isinstance(node, str) else node
        return node.amqp_address()

    def amqp_addresses(self):
        """The AMQP addresses of every node's current incarnation (those that joined)."""
        return [address for address in (node.amqp_address() for node in self.nodes.values()
                                        if node.running()) if address]

    def followers(self, leader):
        return [node for node in self.nodes.values() if node is not leader]

    def describe(self, lines=25):
        """Each node's last lines and log file, for a failure's message."""
        parts = [f"cluster files in {self.root}"]
        for node in self.nodes.values():
            parts.append(f"--- node {node.name} ({node.log_path}):\n{node.tail(lines)}")
        return "\n".join(parts)

    def close(self):
        """Kills every node (resumed first, should one be paused) and etcd."""
        for node in self.nodes.values():
            node.close()
        if self._own_etcd:
            self.etcd.stop()


@pytest.fixture
def make_cluster(tmp_path):
    """Makes L{ClusterProcesses} in the test's directory (kept after a failure, as pytest keeps
    its last runs') and ends all their processes at teardown."""
    made = []

    def make(**settings):
        cluster = ClusterProcesses(tmp_path, **settings)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


# -- clients


def connect(address, timeout=CONNECT_SECONDS, blocked_timeout=30):
    """A pika BlockingConnection to C{(host, port)} as guest, one attempt; pika drops it once
    blocked (connection.blocked) for C{blocked_timeout} seconds (None: never)."""
    host, port = address
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=host, port=port, connection_attempts=1, socket_timeout=timeout,
        blocked_connection_timeout=blocked_timeout, heartbeat=0))


def declare(channel, queue, arguments=None):
    channel.queue_declare(queue, durable=True, arguments=arguments)


class ConfirmedPublisher(threading.Thread):
    """
    Publishes persistent messages C{"{prefix}-{n}"} with confirms to C{queue} (durable, declared
    on every connection), one at a time, over a connection to the first address of
    C{addresses()} that serves; a connection that fails is replaced by one to the next address
    that serves, and the message it carried counts as unconfirmed (neither confirmed nor lost).

    @ivar confirmed: (body, monotonic time of its confirm, address) of every confirmed message.
    @ivar unconfirmed: bodies whose publish was in flight when a connection failed.
    """

    def __init__(self, addresses, queue, prefix="m", limit=None, arguments=None, pause=0.0):
        super().__init__(daemon=True, name=f"publisher-{prefix}")
        self.addresses = addresses
        self.queue = queue
        self.prefix = prefix
        self.limit = limit
        self.arguments = arguments
        self.pause = pause
        self.confirmed = []
        self.served_by = []  # the node that served each confirm (connection.start's "node")
        self.unconfirmed = []
        self.failures = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self):
        number = 0
        turn = 0
        while not self.stopping.is_set() and (self.limit is None or number < self.limit):
            candidates = self.addresses()
            if not candidates:
                self.stopping.wait(0.05)
                continue
            address = candidates[turn % len(candidates)]
            turn += 1
            try:
                connection = connect(address)
            except (AMQPError, OSError):
                self.stopping.wait(0.05)  # a follower closes the connection; try the next
                continue
            served_by = serving_node(connection)
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                declare(channel, self.queue, self.arguments)
                while not self.stopping.is_set() and (self.limit is None or number < self.limit):
                    body = f"{self.prefix}-{number}"
                    number += 1
                    try:
                        channel.basic_publish("", self.queue, body.encode(),
                                              pika.BasicProperties(delivery_mode=2))
                    except (AMQPError, OSError) as problem:
                        with self._lock:
                            self.unconfirmed.append(body)
                            self.failures.append((time.monotonic(), repr(problem)))
                        raise
                    with self._lock:
                        self.confirmed.append((body, time.monotonic(), address))
                        self.served_by.append(served_by)
                    if self.pause:
                        self.stopping.wait(self.pause)
            except (AMQPError, OSError):
                continue
            finally:
                _close_quietly(connection)

    def confirm_times_of(self, node_name):
        """The monotonic times of the confirms node C{node_name} sent, through whichever node."""
        with self._lock:
            return [when for (_, when, _), node in zip(self.confirmed, self.served_by)
                    if node == f"brokerd@{node_name}"]

    def confirmed_bodies(self):
        with self._lock:
            return {body for body, _, _ in self.confirmed}

    def confirms(self):
        with self._lock:
            return len(self.confirmed)

    def first_confirm_after(self, moment):
        """The monotonic time of the first confirm after C{moment}, or None."""
        with self._lock:
            return next((when for _, when, _ in self.confirmed if when > moment), None)

    def wait_confirms(self, count, timeout=START_SECONDS):
        """Waits until C{count} messages are confirmed in all."""
        poll_until(lambda: True if self.confirms() >= count else None, timeout,
                   f"{count} confirms (got {self.confirms()})")

    def finish(self, timeout=START_SECONDS):
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), "the publisher did not stop"


def serving_node(connection):
    """The node that serves a pika connection (a relaying follower passes the leader's answer)."""
    node = connection._impl.server_properties.get("node")
    return node.decode() if isinstance(node, bytes) else node


def _close_quietly(connection):
    try:
        if connection.is_open:
            connection.close()
    except (AMQPError, OSError):
        pass


def read_queue(address, queue, ack=True, limit=None):
    """Every message C{queue} holds at C{address}, taken with basic.get: a list of (body,
    redelivered); acked when C{ack}, else left unacked (and the connection left open: the
    caller gets it as the second value, to close)."""
    connection = connect(address)
    channel = connection.channel()
    taken = []
    while limit is None or len(taken) < limit:
        method, _, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            break
        taken.append((body.decode(), method.redelivered))
        if ack:
            channel.basic_ack(method.delivery_tag)
    if ack:
        connection.close()
        return taken, None
    return taken, connection
