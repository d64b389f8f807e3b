"""The brokerd_cluster_* metrics of a cluster's nodes (real candidates on a real etcd, each node's /metrics on
loopback, read as a Prometheus server reads them), and their absence on a node on its own."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer
from twisted.trial import unittest

from backends.memory import MemoryStore
from brokerd.http.prometheus import registry_for
from brokerd.model.broker import Broker
from tests.support.broker import wait_until
from tests.support.cluster_api import start_cluster
from tests.support.etcd import needs_etcd, start_etcd
from tests.support.metrics import value

CLUSTER_FAMILIES = ("brokerd_cluster_leader", "brokerd_cluster_leader_changes_total",
                    "brokerd_cluster_in_sync_replicas", "brokerd_cluster_members", "brokerd_cluster_follower_lag_bytes",
                    "brokerd_cluster_follower_lag_operations", "brokerd_cluster_in_sync_alarm")


def samples_of(text):
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


@defer.inlineCallbacks
def scrape(node, path=""):
    return samples_of((yield node.metrics(path)))


@needs_etcd
class ClusterMetricsTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)

    @defer.inlineCallbacks
    def test_the_leader_says_it_leads_and_gives_each_followers_lag(self):
        figures = [{"node": "b", "acked": 10, "in_sync": True, "lag_operations": 3, "lag_bytes": 700, "paused": False,
                    "pauses": 0},
                   {"node": "c", "acked": 2, "in_sync": False, "lag_operations": 11, "lag_bytes": 9000, "paused": True,
                    "pauses": 4}]
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c", followers=figures)
        yield nodes["a"].candidate.put_in_sync_set(["a", "b"])
        yield wait_until(lambda: nodes["b"].status.in_sync_set() == ["a", "b"]
                         and nodes["a"].status.in_sync_set() == ["a", "b"])
        leader = yield scrape(nodes["a"])
        self.assertEqual(value(leader, "brokerd_cluster_leader"), 1)
        self.assertEqual(value(leader, "brokerd_cluster_leader_changes_total"), 1)
        self.assertEqual(value(leader, "brokerd_cluster_in_sync_replicas"), 2)
        self.assertEqual(value(leader, "brokerd_cluster_members"), 3)
        self.assertEqual(value(leader, "brokerd_cluster_in_sync_alarm"), 0)
        nodes["a"].broker.in_sync_alarm.measured(1, 2)  # as the leader's in-sync set tells it
        blocked = yield scrape(nodes["a"])
        self.assertEqual(value(blocked, "brokerd_cluster_in_sync_alarm"), 1)
        nodes["a"].broker.in_sync_alarm.measured(2, 2)
        self.assertEqual(value(leader, "brokerd_cluster_follower_lag_bytes", node="brokerd@b"), 700)
        self.assertEqual(value(leader, "brokerd_cluster_follower_lag_bytes", node="brokerd@c"), 9000)
        self.assertEqual(value(leader, "brokerd_cluster_follower_lag_operations", node="brokerd@c"), 11)
        self.assertEqual(value(leader, "rabbitmq_identity_info", rabbitmq_node="brokerd@a", rabbitmq_cluster="c1",
                               brokerd_version=leader["rabbitmq_identity_info"][0][0]["brokerd_version"]), 1)
        follower = yield scrape(nodes["b"], "/per-object")
        self.assertEqual(value(follower, "brokerd_cluster_leader"), 0)
        self.assertEqual(value(follower, "brokerd_cluster_in_sync_replicas"), 2)
        self.assertNotIn("brokerd_cluster_follower_lag_bytes", follower)  # only the leader knows the lag
        detailed = yield scrape(nodes["b"], "/detailed?family=queue_coarse_metrics")
        self.assertEqual(detailed["rabbitmq_identity_info"][0][0]["rabbitmq_cluster"], "c1")

    @defer.inlineCallbacks
    def test_a_takeover_is_counted_and_the_stopped_node_leaves_the_members(self):
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c")
        yield nodes["a"].stop()
        yield wait_until(lambda: nodes["b"].candidate.is_leader() or nodes["c"].candidate.is_leader())
        new = "b" if nodes["b"].candidate.is_leader() else "c"
        other = "c" if new == "b" else "b"
        yield wait_until(lambda: nodes[other].status.leader_name() == new)
        for name, leads in ((new, 1), (other, 0)):
            samples = yield scrape(nodes[name])
            self.assertEqual(value(samples, "brokerd_cluster_leader"), leads, name)
            self.assertEqual(value(samples, "brokerd_cluster_leader_changes_total"), 2, name)
            self.assertEqual(value(samples, "brokerd_cluster_members"), 2, name)


class SingleNodeMetricsTests(unittest.TestCase):
    def test_a_node_on_its_own_gives_no_cluster_family_and_is_its_own_cluster(self):
        broker = Broker(MemoryStore(), None)
        samples = samples_of(generate_latest(registry_for(broker, node="brokerd@solo")).decode())
        self.assertEqual([name for name in CLUSTER_FAMILIES if name in samples], [])
        labels = samples["rabbitmq_identity_info"][0][0]
        self.assertEqual((labels["rabbitmq_node"], labels["rabbitmq_cluster"]), ("brokerd@solo", "brokerd@solo"))
