"""The systems L{benchmarks.cluster_throughput} and L{benchmarks.versus_rabbitmq} compare, each
started on loopback and stopped again.

  - L{SingleBrokerd}: one ``twistd -n brokerd`` node, on the chunked backend unless told another;
  - L{BrokerdCluster}: a private etcd and three brokerd nodes in cluster mode (chunked,
    ``--cluster-min-isr 2``), ready once etcd's in-sync set names all three; the load goes
    to the leader's AMQP port;
  - L{RabbitMQCluster}: RabbitMQ nodes (Debian's ``rabbitmq-server``; three unless told another
    size, one being a node on its own) joined into one cluster, with their own Erlang cookie and
    port mapper, no plugins.

Each gives C{address} (where the load goes), C{pids} (node name -> the process whose CPU,
with its descendants', is the node's), C{replicas(queue)} (where the queue's copies are) and
C{stop()}, which ends everything it started and may be called at any point of a failed start.
"""

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from brokerd.testing import BrokerProcess, poll_until

START_SECONDS = 120.0  # a RabbitMQ node on a busy 2-core machine takes tens of seconds
STOP_SECONDS = 60.0
CLUSTER_SIZE = 3
RABBITMQ_BIN = "/usr/lib/rabbitmq/bin"
# rabbitmqctl's own distribution ports (RabbitMQ's default range): no node port may be among them.
RABBITMQ_CLI_PORTS = range(35672, 35683)


class StartFailed(Exception):
    """A system did not come up; the message says what was awaited and what the process said."""


def free_port(avoid=()):
    """A loopback port nothing listens on right now (etcd and RabbitMQ cannot be told port 0)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in avoid:
            return port


def parse_tcp(address):
    """C{(host, port)} of C{tcp:HOST:PORT}."""
    host, _, port = address.removeprefix("tcp:").rpartition(":")
    return host, int(port)


def wait_for(found, timeout, what):
    """L{poll_until}, failing with L{StartFailed}."""
    try:
        return poll_until(found, timeout, what, interval=0.2)
    except AssertionError as problem:
        raise StartFailed(str(problem)) from None


class SingleBrokerd:
    """One brokerd node on C{backend}: the figure a cluster, or RabbitMQ's one node, is compared with."""

    def __init__(self, root, backend="chunked", key="single", label="brokerd single"):
        self.backend = backend
        self.key, self.label = key, label
        self.directory = os.path.join(root, f"brokerd-single-{backend}")
        self.node = None
        self.address = None
        self.pids = {}
        self.store = None

    def start(self):
        os.makedirs(self.directory)
        self.node = BrokerProcess(["--backend", self.backend, "--data-dir", os.path.join(self.directory, "data"),
                                   "--native", "none"], self.directory)
        self.address = parse_tcp(self.node.wait_listening("AMQP", START_SECONDS))
        self.pids = {"brokerd": self.node.process.pid}
        # What the node says it runs on (logged before it listens): "chunked (OPTIONS), sync always".
        self.store = self.node.wait_for_output(" starting: .*, backend ").partition(", backend ")[2]

    def replicas(self, queue):
        """None: one node keeps the one copy."""
        return None

    def stop(self):
        if self.node is not None:
            self.node.stop(STOP_SECONDS)


class Etcd:
    """A one-member etcd on free loopback ports, for the brokerd cluster; its data in C{directory}."""

    def __init__(self, directory):
        self.directory = directory
        self.process = None
        self.url = None

    def start(self):
        os.makedirs(self.directory)
        client, peer = free_port(), free_port()
        self.url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        command = [
            shutil.which("etcd") or "etcd", "--name", "bench", "--data-dir", os.path.join(self.directory, "data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"bench={peer_url}", "--log-level", "warn",
        ]
        with open(os.path.join(self.directory, "etcd.log"), "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._healthy, START_SECONDS, f"healthy etcd at {self.url}")

    def _healthy(self):
        if self.process.poll() is not None:
            with open(os.path.join(self.directory, "etcd.log"), errors="replace") as log:
                raise StartFailed(f"etcd exited with status {self.process.returncode}:\n{log.read()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as answer:
                return True if json.load(answer).get("health") == "true" else None
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def get(self, key):
        """The value of C{key} (text) through etcd's v3 JSON gateway, or None when it is absent."""
        request = urllib.request.Request(
            self.url + "/v3/kv/range", data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            kvs = json.load(answer).get("kvs") or []
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class BrokerdCluster:
    """
    Three brokerd nodes in cluster mode on one private etcd. Ready once a leader serves and
    etcd's C{isr} key names all three nodes (so every confirm waits for the followers' copies).
    """

    key, label = "cluster", "brokerd cluster"
    name = "bench"

    def __init__(self, root, min_isr=2):
        self.directory = os.path.join(root, "brokerd-cluster")
        self.min_isr = min_isr
        self.etcd = Etcd(os.path.join(self.directory, "etcd"))
        self.nodes = {}
        self.address = None
        self.pids = {}
        self.in_sync = None

    def start(self):
        self.etcd.start()
        for number in range(1, CLUSTER_SIZE + 1):
            name = f"n{number}"
            directory = os.path.join(self.directory, name)
            os.makedirs(directory)
            self.nodes[name] = BrokerProcess([
                "--backend", "chunked", "--data-dir", os.path.join(directory, "data"), "--native", "none",
                "--cluster-etcd", self.etcd.url, "--cluster-name", self.name, "--node-name", name,
                "--replication", "tcp:0:interface=127.0.0.1", "--cluster-min-isr", str(self.min_isr),
            ], directory)
        # etcd is part of what the cluster costs: its CPU counts with the nodes'.
        self.pids = {**{name: node.process.pid for name, node in self.nodes.items()}, "etcd": self.etcd.process.pid}
        self.in_sync = wait_for(self._all_in_sync, START_SECONDS, f"in-sync set of all {CLUSTER_SIZE} nodes in etcd")
        leader = json.loads(self.etcd.get(f"/brokerd/{self.name}/leader"))
        node = self.nodes[leader["name"]]
        try:
            node.wait_for_output(f"node {leader['name']} serves as the leader", START_SECONDS)
        except AssertionError as problem:
            raise StartFailed(str(problem)) from None
        self.leader = leader["name"]
        self.address = parse_tcp(leader["addresses"]["amqp"])

    def _all_in_sync(self):
        for name, node in self.nodes.items():
            if node.process.poll() is not None:
                raise StartFailed(f"brokerd node {name} exited with status {node.process.returncode}:\n{node.tail()}")
        value = self.etcd.get(f"/brokerd/{self.name}/isr")
        in_sync = sorted(json.loads(value)) if value else []
        return in_sync if in_sync == sorted(self.nodes) else None

    def replicas(self, queue):
        """The in-sync set and the leader: a cluster replicates every durable queue to that set."""
        return f"in-sync set {', '.join(self.in_sync)}, leader {self.leader}"

    def stop(self):
        for node in self.nodes.values():  # all at once: a follower left alone would only wait for a leader
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            node.stop(STOP_SECONDS)
        self.etcd.stop()


class RabbitMQCluster:
    """
    C{size} RabbitMQ nodes on loopback, C{benchN-PID@localhost}, each with its own ports, data, logs
    and pid file, sharing a fresh Erlang cookie (in the C{HOME} they all run with) and a port
    mapper (epmd) of their own on a free port, so nothing is shared with other nodes on the
    machine. The others join node 1. Run as the C{rabbitmq} user when started by root.
    """

    key = "rabbitmq"

    def __init__(self, root, bin_dir=RABBITMQ_BIN, size=CLUSTER_SIZE, label="RabbitMQ cluster"):
        self.directory = os.path.join(root, "rabbitmq")
        self.bin_dir = bin_dir
        self.label = label
        self.user = "rabbitmq" if os.geteuid() == 0 else None
        self.epmd_port = free_port()
        self.nodes = [f"bench{number}-{os.getpid()}@localhost" for number in range(1, size + 1)]
        self.processes = {}
        self.address = None
        self.pids = {}
        self.members = None

    def _environment(self, **extra):
        home = self.directory
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LANG": "C.UTF-8",
                "ERL_EPMD_PORT": str(self.epmd_port),
                "RABBITMQ_CONF_ENV_FILE": os.path.join(home, "rabbitmq-env.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(home, "enabled_plugins"), **extra}

    def _prepare(self):
        os.makedirs(self.directory)
        files = {".erlang.cookie": secrets.token_hex(20), "enabled_plugins": "[].\n", "rabbitmq-env.conf": ""}
        for name, text in files.items():
            with open(os.path.join(self.directory, name), "w") as file:
                file.write(text)
        os.chmod(os.path.join(self.directory, ".erlang.cookie"), 0o400)

    def start(self):
        if not os.access(os.path.join(self.bin_dir, "rabbitmq-server"), os.X_OK):
            raise StartFailed(f"no RabbitMQ here ({self.bin_dir}/rabbitmq-server): install rabbitmq-server")
        self._prepare()
        taken, environments = set(RABBITMQ_CLI_PORTS), []
        for number, node in enumerate(self.nodes, 1):
            directory = os.path.join(self.directory, f"node{number}")
            os.makedirs(os.path.join(directory, "log"))
            amqp = free_port(taken)
            taken.add(amqp)
            distribution = free_port(taken)
            taken.add(distribution)
            with open(os.path.join(directory, "rabbitmq.conf"), "w") as config:
                config.write(f"listeners.tcp.default = 127.0.0.1:{amqp}\nlog.console = false\n")
            environment = self._environment(
                RABBITMQ_NODENAME=node, RABBITMQ_NODE_PORT=str(amqp), RABBITMQ_DIST_PORT=str(distribution),
                RABBITMQ_MNESIA_BASE=os.path.join(directory, "mnesia"),
                RABBITMQ_LOG_BASE=os.path.join(directory, "log"),
                RABBITMQ_PID_FILE=os.path.join(directory, "pid"),
                RABBITMQ_CONFIG_FILE=os.path.join(directory, "rabbitmq.conf"))
            if number == 1:
                self.address = ("127.0.0.1", amqp)
            environments.append((node, directory, environment))
        self._chown()
        for node, directory, environment in environments:
            with open(os.path.join(directory, "server.out"), "wb") as output:
                # Its own session: a Ctrl-C at the terminal reaches the benchmark, which stops the node.
                self.processes[node] = subprocess.Popen(
                    [os.path.join(self.bin_dir, "rabbitmq-server")], cwd=self.directory, env=environment,
                    stdout=output, stderr=subprocess.STDOUT, user=self.user, start_new_session=True)
        self.pids = {f"bench{number}": process.pid for number, process in enumerate(self.processes.values(), 1)}
        for node, (_, _, environment) in zip(self.nodes, environments):
            port = int(environment["RABBITMQ_NODE_PORT"])
            wait_for(lambda: self._listening(node, port), START_SECONDS, f"RabbitMQ node {node} on port {port}")
            self.ctl(node, "await_startup")
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", self.nodes[0])
            self.ctl(node, "start_app", timeout=START_SECONDS)
        status = json.loads(self.ctl(self.nodes[0], "cluster_status", "--formatter", "json"))
        if sorted(status.get("running_nodes", [])) != sorted(self.nodes):
            raise StartFailed(f"RabbitMQ cluster runs {status.get('running_nodes')}, not {self.nodes}")

    def _listening(self, node, port):
        """True once C{node} takes AMQP connections (its listener opens last as it boots)."""
        process = self.processes[node]
        if process.poll() is not None:
            server_out = os.path.join(self.directory, f"node{self.nodes.index(node) + 1}", "server.out")
            with open(server_out, errors="replace") as output:
                raise StartFailed(f"RabbitMQ node {node} exited with {process.returncode}:\n{output.read()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return None
        return True

    def queue_members(self, queue):
        """The nodes RabbitMQ says hold C{queue} (its C{members}), or raises when it has no such queue."""
        listing = json.loads(self.ctl(self.nodes[0], "list_queues", "name", "type", "members", "--formatter", "json"))
        for row in listing:
            if row["name"] == queue:
                return sorted(row["members"]) if row["type"] == "quorum" else []
        raise StartFailed(f"RabbitMQ lists no queue {queue!r}: {listing}")

    def replicas(self, queue):
        """The quorum queue C{queue}'s members, which must be every node (L{StartFailed} otherwise)."""
        members = self.queue_members(queue)
        if members != sorted(self.nodes):
            raise StartFailed(f"the quorum queue's members are {members}, not all of {self.nodes}")
        return f"quorum queue members {', '.join(members)}"

    def ctl(self, node, *arguments, timeout=STOP_SECONDS):
        """C{rabbitmqctl -n NODE ARGUMENTS} with the cluster's cookie; its output, or L{StartFailed}."""
        command = [os.path.join(self.bin_dir, "rabbitmqctl"), "-n", node, *arguments]
        try:
            done = subprocess.run(command, cwd=self.directory, env=self._environment(), user=self.user,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StartFailed(f"{' '.join(command)} took over {timeout:.0f} s") from None
        if done.returncode != 0:
            raise StartFailed(f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout

    def _chown(self):
        if self.user is None:
            return
        for where, directories, files in os.walk(self.directory):
            for name in [where, *(os.path.join(where, entry) for entry in directories + files)]:
                shutil.chown(name, self.user, self.user)

    def stop(self):
        # SIGTERM makes rabbitmq-server stop its node properly; then anything left in its session goes.
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        if os.path.isdir(self.directory):
            subprocess.run([shutil.which("epmd") or "epmd", "-port", str(self.epmd_port), "-kill"],
                           env=self._environment(), user=self.user, capture_output=True, timeout=STOP_SECONDS)


# What cluster_throughput --systems names, by the keys they report under.
SYSTEMS = {"single": SingleBrokerd, "cluster": BrokerdCluster, "rabbitmq": RabbitMQCluster}
