"""A workload run against a three-node brokerd cluster (docs/clustering.rst), one more
L{IBrokerUnderTest<spark_jobs.brokers.IBrokerUnderTest>}: L{ClusterBrokerd}.

The runner starts a private etcd (L{spark_jobs.etcd_server}) and three ``twistd -n brokerd``
nodes of one cluster, each on its own backend (the same for all, or mixed), data directory
(C{data/n1}, C{data/n2}, C{data/n3}) and fixed loopback ports, so that a node started again
keeps its addresses. The clients talk to the leader. A crash point SIGKILLs the current
leader and starts it again at once (it rejoins as a follower); the run goes on once another
node serves as the leader, and the time that took is recorded as the failover's. At the end
the followers stop first, then the leader, so that leadership stays put, and the export
reads the final leader's store (L{export_source}).
"""

import json
import re
import signal
import time
from dataclasses import dataclass

from zope.interface import implementer

from brokerd.loadgen.process_cpu import cpu_seconds
from brokerd.testing import BrokerProcess
from spark_jobs import events
from spark_jobs.brokers import (
    BROKER_START_TIMEOUT,
    BROKER_STOP_TIMEOUT,
    IBrokerUnderTest,
    WorkloadFailed,
)
from spark_jobs.etcd_server import EtcdFailed, EtcdServer, free_port

NODES = ("n1", "n2", "n3")
CLUSTER_NAME = "validation"
ETCD_DIRECTORY = "etcd"  # in the run's data directory, beside the nodes'
DEFAULT_LEASE_TTL = 3.0  # seconds: each failover takes about this long, plus a second
DEFAULT_MIN_ISR = 1  # as brokerd's own default
LEADER_POLL = 0.05  # seconds between looks at the nodes' output for the leader's line
LEADS = re.compile(r"node (\S+) serves as the leader of cluster ")
FOLLOWS_AGAIN = re.compile(r"node (\S+) starts again as a follower")
TAIL_LINES = 15  # of each node, in error messages


@dataclass(frozen=True)
class ClusterSpec:
    """
    A C{--cluster} of the validation: its run's label, the backend string of each node
    (L{NODES}, in order), and the nodes' C{--cluster-lease-ttl} and C{--cluster-min-isr}.
    """

    label: str
    backends: tuple
    lease_ttl: float = DEFAULT_LEASE_TTL
    min_isr: int = DEFAULT_MIN_ISR


class _NodeLog:
    """The run's broker log as one node writes to it: each line starts with the node's name."""

    def __init__(self, log, name):
        self._log = log
        self._prefix = f"[{name}] "

    def write(self, text):
        self._log.write(self._prefix + text)

    def flush(self):
        self._log.flush()


class _Node:
    """One node of the cluster: its name, backend, data directory, fixed ports and process."""

    def __init__(self, name, backend, data_dir):
        self.name = name
        self.backend = backend
        self.data_dir = data_dir
        self.amqp_port = free_port()
        self.replication_port = free_port()
        self.process = None

    def arguments(self, etcd_url, spec):
        return [f"--backend={self.backend}", "--data-dir", str(self.data_dir),
                "--amqp", f"tcp:{self.amqp_port}:interface=127.0.0.1", "--native", "none",
                "--cluster-etcd", etcd_url, "--cluster-name", CLUSTER_NAME,
                "--node-name", self.name,
                "--replication", f"tcp:{self.replication_port}:interface=127.0.0.1",
                "--cluster-lease-ttl", f"{spec.lease_ttl:g}",
                "--cluster-min-isr", str(spec.min_isr)]

    def leads(self):
        """Whether this node's latest word on its role is that it serves as the leader."""
        for line in reversed(self.process.output):
            if LEADS.search(line):
                return True
            if FOLLOWS_AGAIN.search(line):
                return False
        return False

    def cpu_seconds(self):
        return cpu_seconds(self.process.process.pid) if self.process is not None else None


@implementer(IBrokerUnderTest)
class ClusterBrokerd:
    """Three brokerd nodes of one cluster and their etcd, started by the runner (see the
    module's description); each incarnation is a leader."""

    kind = events.CLUSTER_RUN
    can_crash = True

    def __init__(self, spec, data_dir, cwd, label=None):
        self.spec = spec
        self.data_dir = data_dir
        self.cwd = cwd
        self.label = label or spec.label
        self.login = {"host": "127.0.0.1", "username": "guest", "password": "guest",
                      "virtual_host": "/"}
        self.nodes = [_Node(name, backend, data_dir / name)
                      for name, backend in zip(NODES, spec.backends, strict=True)]
        self.etcd = EtcdServer(data_dir / ETCD_DIRECTORY)
        self.leader = None
        self.failovers = []
        self.stop_status = {}
        self._killed = None  # (node, time.time(), monotonic) of the last crash
        self._cpu_base = 0.0  # CPU seconds of the nodes that outlived the last crash, by then

    def start(self, log):
        if self.nodes[0].process is None:
            self._start_cluster(log)
        self.leader = self._wait_for_leader()
        if self._killed is not None:
            killed, at, began = self._killed
            self.failovers.append({"killed": killed, "leader": self.leader.name, "t": at,
                                   "seconds": round(time.monotonic() - began, 3)})
            self._killed = None
        return self.leader.amqp_port

    def _start_cluster(self, log):
        try:
            etcd_url = self.etcd.start()
        except EtcdFailed as problem:
            raise WorkloadFailed(f"{self.label}: {problem}") from None
        for node in self.nodes:
            node.data_dir.mkdir(parents=True, exist_ok=True)
            node.process = BrokerProcess(node.arguments(etcd_url, self.spec), self.cwd,
                                         log=_NodeLog(log, node.name))

    def _wait_for_leader(self):
        deadline = time.monotonic() + BROKER_START_TIMEOUT
        while True:
            self.check()
            leaders = [node for node in self.nodes if node.leads()]
            if leaders:
                return leaders[0]
            if time.monotonic() > deadline:
                raise WorkloadFailed(f"{self.label}: no node served as the leader within"
                                     f" {BROKER_START_TIMEOUT:.0f} s; their last lines:\n"
                                     f"{self.tail()}")
            time.sleep(LEADER_POLL)

    def crash(self):
        """SIGKILLs the leader and starts it again on its data directory and ports."""
        killed = self.leader
        killed.process.kill()
        self._killed = (killed.name, time.time(), time.monotonic())
        self._cpu_base = sum(node.cpu_seconds() or 0.0 for node in self.nodes
                             if node is not killed)
        killed.process.restart(crash=True)
        self.leader = None

    def prepare(self, topology):
        """Nothing to do: new data directories hold nothing."""

    def finish(self, topology):
        """Stops the followers, then the leader (so that it stays the leader, and its store is the
        one exported), each cleanly, then etcd."""
        leader = next((node for node in self.nodes if node.leads()), self.leader)
        self.leader = leader
        for node in [*(node for node in self.nodes if node is not leader), leader]:
            status = node.process.stop(BROKER_STOP_TIMEOUT)
            self.stop_status[node.name] = status
            if status not in (0, -signal.SIGTERM):
                self.etcd.stop()
                raise WorkloadFailed(f"{self.label}: node {node.name} stopped with status"
                                     f" {status}; its last lines:\n{node.process.tail()}")
        self.etcd.stop()

    def check(self):
        for node in self.nodes:
            if node.process is not None and node.process.process.poll() is not None:
                raise WorkloadFailed(f"{self.label}: node {node.name} exited with status"
                                     f" {node.process.process.returncode};"
                                     f" its last lines:\n{node.process.tail()}")

    def abandon(self):
        for node in self.nodes:
            if node.process is not None:
                node.process.kill()
        self.etcd.stop()

    def tail(self):
        parts = [f"--- {node.name}:\n{node.process.tail(TAIL_LINES)}"
                 for node in self.nodes if node.process is not None]
        return "\n".join(parts) or "(the cluster was not started)"

    def describe(self):
        leader = self.leader.name if self.leader is not None else None
        return {"kind": self.kind, "backends": [node.backend for node in self.nodes],
                "leader": leader, "lease_ttl": self.spec.lease_ttl, "min_isr": self.spec.min_isr,
                "nodes": [{"name": node.name, "backend": node.backend,
                           "data_dir": str(node.data_dir.relative_to(self.data_dir.parent)),
                           "amqp_port": node.amqp_port,
                           "replication_port": node.replication_port,
                           "broker_command": node.process.command if node.process else None}
                          for node in self.nodes],
                "failovers": self.failovers, "broker_stop_status": self.stop_status}

    def cpu_seconds(self):
        """The CPU seconds of every node since the last crash (the killed node's run again from
        0), those of the survivors until then taken off; None when a node is gone."""
        used = [node.cpu_seconds() for node in self.nodes]
        if None in used:
            return None
        return sum(used) - self._cpu_base


def export_source(run_dir):
    """
    C{(backend, data directory)} of the store a cluster run's export reads: the final
    leader's, as its run.json names it.

    @raise ValueError: run.json is unreadable or names no leader among its nodes.
    """
    try:
        facts = json.loads((run_dir / events.RUN_FILE).read_text(encoding="utf-8"))
        nodes = {node["name"]: node for node in facts["nodes"]}
        leader = nodes[facts["leader"]]
        return leader["backend"], run_dir / leader["data_dir"]
    except (OSError, ValueError, KeyError, TypeError) as problem:
        raise ValueError(f"the run.json of the cluster run in {run_dir} names no final leader"
                         f" whose store could be exported: {problem!r}") from None
