"""
Leadership with nodes as processes of their own (tests/support/cluster_node.py) that a test stops,
resumes and kills: takeover when the leader is stopped, and the stopped leader, resumed, stepping
down before it confirms anything; a killed node's name free again once its lease expires.
"""

import os
import signal
import sys

from twisted.internet import defer, protocol, reactor
from twisted.trial import unittest

from brokerd.cluster.clock import SteadyClock
from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.view import ClusterKeys, NodeInfo
from tests.support.broker import wait_until
from tests.support.etcd import needs_etcd, start_etcd
from tests.support.paths import ROOT

TTL = 2


class NodeProcess(protocol.ProcessProtocol):
    """One tests.support.cluster_node process; C{lines} holds (time, word, rest) of each line it printed."""

    def __init__(self, testcase, url, name):
        self.name = name
        self.lines = []
        self._partial = b""
        self.ended = defer.Deferred()
        self.transport = reactor.spawnProcess(
            self, sys.executable, [sys.executable, "-m", "tests.support.cluster_node", url, "c", name, str(TTL)],
            env=dict(os.environ, PYTHONPATH=str(ROOT)), path=str(ROOT),
        )
        testcase.addCleanup(self.kill)

    def outReceived(self, data):
        *whole, self._partial = (self._partial + data).split(b"\n")
        for line in whole:
            stamp, _, rest = line.decode().partition(" ")
            word, _, rest = rest.partition(" ")
            self.lines.append((float(stamp), word, rest))

    errReceived = outReceived

    def processEnded(self, reason):
        self.ended.callback(None)

    def said(self, word):
        return [line for line in self.lines if line[1] == word]

    def signal(self, name):
        os.kill(self.transport.pid, name)

    def kill(self):
        if not self.ended.called:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        return self.ended


@needs_etcd
class LeaderProcessTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)
        self.clock = SteadyClock(reactor)

    @defer.inlineCallbacks
    def test_a_leader_stopped_past_its_lease_is_replaced_and_resumed_steps_down_before_confirming(self):
        a = NodeProcess(self, self.etcd.url, "a")
        yield wait_until(lambda: a.said("confirm"), timeout=15)
        b = NodeProcess(self, self.etcd.url, "b")
        yield wait_until(lambda: b.said("started"), timeout=15)
        a.signal(signal.SIGSTOP)
        stopped_at = self.clock.seconds()
        yield wait_until(lambda: b.said("elected"), timeout=TTL + 5)
        elected_at = b.said("elected")[0][0]
        # etcd expires the lease at most TTL s after a's last keepalive, and revokes it on its next tick.
        self.assertLess(elected_at - stopped_at, TTL + 1.5)
        seen_before_resume = len(a.lines)
        a.signal(signal.SIGCONT)
        yield wait_until(lambda: a.said("ended"), timeout=10)
        first_after_resume = a.lines[seen_before_resume]
        self.assertEqual(first_after_resume[1], "stepped-down", a.lines[seen_before_resume:])
        self.assertIn("no keepalive", first_after_resume[2])
        # The two leaders' confirm windows never overlap: a's last confirm came before b took the lead.
        self.assertLess(a.said("confirm")[-1][0], elected_at)
        self.assertEqual(a.said("elected"), a.said("elected")[:1])
        yield wait_until(lambda: b.said("confirm"), timeout=5)

    @defer.inlineCallbacks
    def test_a_killed_nodes_name_is_taken_again_once_its_lease_expired(self):
        old = NodeProcess(self, self.etcd.url, "n1")
        yield wait_until(lambda: old.said("confirm"), timeout=15)
        yield old.kill()
        client = EtcdClient(reactor, self.etcd.url, timeout=2.0)
        again = Candidate(client, self.clock, ClusterKeys("c"), NodeInfo("n1"), ttl=TTL, retry_seconds=0.1)
        self.addCleanup(again.stop)
        yield again.start()
        yield wait_until(again.is_leader, timeout=TTL + 2)

    @defer.inlineCallbacks
    def test_a_second_process_with_a_live_nodes_name_fails_naming_it(self):
        first = NodeProcess(self, self.etcd.url, "n1")
        yield wait_until(lambda: first.said("confirm"), timeout=15)
        second = NodeProcess(self, self.etcd.url, "n1")
        yield wait_until(lambda: second.said("failed"), timeout=TTL + 15)
        self.assertIn("node name 'n1' is taken in cluster 'c'", second.said("failed")[0][2])
        self.assertEqual(first.said("stepped-down"), [])
