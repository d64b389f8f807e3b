"""Nodes of a cluster in this process, for the tests of what the management API, the metrics and the
dashboard show of it: each node a real Candidate on a real etcd, a ClusterStatus chained to it, a broker
on a memory store, its management API and its Prometheus metrics served on 127.0.0.1, port 0.

Everything is served by this process's reactor, so a test asks through a thread (L{ClusterNode.get},
L{ClusterNode.metrics}) or a child process (L{rabbitmqadmin}), never with a blocking call on the reactor.
"""

import os
import urllib.request

from twisted.internet import defer, reactor, threads, utils

from backends.memory import MemoryStore
from brokerd.access.commands import AccessCommands
from brokerd.access.database import AccessDatabase
from brokerd.cluster.clock import SteadyClock
from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.status import ClusterStatus
from brokerd.cluster.view import ClusterKeys, NodeInfo
from brokerd.http.prometheus import metrics_site
from brokerd.http.server import ApiContext, make_site
from brokerd.model.broker import Broker
from tests.support.broker import wait_until
from tests.support.httpapi import RABBITMQADMIN, Api

TTL = 2
CLUSTER = "c1"


class ClusterNode:
    """
    One node: C{candidate}, C{status}, C{broker}, and its API (C{api}, an L{Api} whose calls block: use
    L{get}) and metrics (C{metrics_url}) listening on loopback. L{stop} leaves the cluster (the candidate
    revokes its lease) and closes the listeners; it is also done at the test's cleanup.
    """

    def __init__(self, testcase, client, name, followers=None, min_in_sync=None, cluster=CLUSTER):
        self.name = name
        self.followers = followers if followers is not None else []  # the leader's replication figures
        self.candidate = Candidate(
            client, SteadyClock(reactor), ClusterKeys(cluster), NodeInfo(name, {"amqp": f"tcp:127.0.0.1:{name}"}),
            ttl=TTL, retry_seconds=0.1, on_leader=lambda info: self.status.on_leader(info),
        )
        self.status = ClusterStatus(cluster, name, self.candidate, lambda: list(self.followers),
                                    min_in_sync=min_in_sync)
        self.broker = Broker(MemoryStore(), reactor)
        access = AccessDatabase.in_memory()
        context = ApiContext(self.broker, access, AccessCommands(self.broker, access), cluster=self.status)
        self._ports = [reactor.listenTCP(0, make_site(context), interface="127.0.0.1"),
                       reactor.listenTCP(0, metrics_site(self.broker, access, cluster=self.status),
                                         interface="127.0.0.1")]
        self.api = Api(f"tcp:127.0.0.1:{self._ports[0].getHost().port}")
        self.metrics_url = f"http://127.0.0.1:{self._ports[1].getHost().port}/metrics"
        self._stopped = False
        testcase.addCleanup(self.stop)

    @defer.inlineCallbacks
    def stop(self):
        if self._stopped:
            return
        self._stopped = True
        yield self.candidate.stop()
        for port in self._ports:
            yield port.stopListening()
        self.broker.stop()

    def get(self, path):
        """A Deferred of the JSON answer of C{path} (200 expected), asked from a thread."""
        return threads.deferToThread(self.api.get, path)

    def request(self, method, path, body=None, user=None):
        """A Deferred of C{(status, JSON or None)} of C{path}, asked from a thread (as C{user}, a
        C{(name, password)}, instead of guest if given)."""
        api = self.api.as_user(*user) if user is not None else self.api
        return threads.deferToThread(lambda: api.request(method, path, body)[:2])

    def metrics(self, path=""):
        """A Deferred of the text of C{/metrics} + C{path}, scraped from a thread."""
        def scrape():
            with urllib.request.urlopen(self.metrics_url + path, timeout=10) as answer:
                return answer.read().decode()
        return threads.deferToThread(scrape)

    def rabbitmqadmin(self, *arguments):
        """A Deferred of C{(output, error output, exit code)} of RabbitMQ's rabbitmqadmin run against this
        node's API as guest."""
        port = self._ports[0].getHost().port
        return utils.getProcessOutputAndValue(
            RABBITMQADMIN, ["--host", "127.0.0.1", "--port", str(port), "--username", "guest",
                            "--password", "guest", *arguments], env=dict(os.environ))


@defer.inlineCallbacks
def start_cluster(testcase, etcd, *names, followers=None, min_in_sync=None):
    """C{names} started one after the other on C{etcd} (the first leads), once each knows the leader:
    a dict of L{ClusterNode}s by name. C{followers}: the first node's replication figures (a list)."""
    client = EtcdClient(reactor, etcd.url, timeout=2.0)
    nodes = {}
    for index, name in enumerate(names):
        nodes[name] = ClusterNode(testcase, client, name, followers if index == 0 else None, min_in_sync)
        yield nodes[name].candidate.start()
        if index == 0:
            yield wait_until(nodes[name].candidate.is_leader)
    yield wait_until(lambda: all(len(node.candidate.view.members) == len(names) and node.status.leader_name()
                                 for node in nodes.values()))
    return nodes
