"""What a node shows of its cluster (ClusterStatus), with real candidates on a real etcd: every node seen, who
leads, the in-sync set, the leader changes each node saw, and the followers' lag on the leader."""

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.status import ClusterStatus, FollowerLag, NodeStatus
from brokerd.cluster.view import ClusterKeys, NodeInfo
from tests.support.broker import wait_until
from tests.support.cluster_api import start_cluster
from tests.support.etcd import needs_etcd, start_etcd


def lag(node, operations, size, **more):
    return {"node": node, "acked": 100 - operations, "in_sync": True, "lag_operations": operations,
            "lag_bytes": size, "paused": False, "pauses": 0, **more}


@needs_etcd
class ClusterStatusTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)

    @defer.inlineCallbacks
    def test_each_node_lists_every_node_with_the_leader_running_and_its_addresses(self):
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c")
        for name, node in nodes.items():
            seen = node.status.nodes()
            self.assertEqual([status.name for status in seen], ["a", "b", "c"], name)
            self.assertEqual([status.leader for status in seen], [True, False, False], name)
            self.assertEqual([status.running for status in seen], [True, True, True], name)
            self.assertEqual(seen[1].addresses, {"amqp": "tcp:127.0.0.1:b"})
            self.assertEqual(node.status.leader_name(), "a")
            self.assertEqual(node.status.leader_changes, 1, name)  # the leader found at start counts
            self.assertIsNotNone(node.status.leader_elected_at)
        self.assertTrue(nodes["a"].status.is_leader())
        self.assertFalse(nodes["b"].status.is_leader())

    @defer.inlineCallbacks
    def test_the_in_sync_set_is_read_from_etcd_and_the_leader_is_always_in_it(self):
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c")
        self.assertEqual([status.in_sync for status in nodes["b"].status.nodes()], [True, False, False])
        yield nodes["a"].candidate.put_in_sync_set(["a", "b"])
        yield wait_until(lambda: nodes["c"].status.in_sync_set() == ["a", "b"])
        self.assertEqual([status.in_sync for status in nodes["c"].status.nodes()], [True, True, False])

    @defer.inlineCallbacks
    def test_a_stopped_leader_is_listed_not_running_and_the_takeover_is_counted(self):
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c")
        first = nodes["b"].status.leader_elected_at
        yield nodes["a"].stop()
        yield wait_until(lambda: nodes["b"].candidate.is_leader() or nodes["c"].candidate.is_leader())
        new = "b" if nodes["b"].candidate.is_leader() else "c"
        for name in ("b", "c"):
            yield wait_until(lambda: nodes[name].status.leader_name() == new)
            seen = {status.name: status for status in nodes[name].status.nodes()}
            self.assertEqual(sorted(seen), ["a", "b", "c"])  # a node seen once stays listed
            self.assertFalse(seen["a"].running)
            self.assertFalse(seen["a"].leader)
            self.assertEqual(seen["a"].addresses, {"amqp": "tcp:127.0.0.1:a"})
            self.assertTrue(seen[new].leader)
            self.assertEqual(nodes[name].status.leader_changes, 2)
            self.assertEqual(nodes[name].status.running_members(), ["b", "c"])
        self.assertGreater(nodes["b"].status.leader_elected_at, first)

    @defer.inlineCallbacks
    def test_the_leader_shows_each_followers_lag_and_a_follower_shows_none(self):
        figures = [lag("b", 3, 4096), lag("c", 250, 1_000_000, in_sync=False, paused=True, pauses=2)]
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c", followers=figures)
        on_leader = {status.name: status for status in nodes["a"].status.nodes()}
        self.assertEqual([(on_leader[name].lag_operations, on_leader[name].lag_bytes) for name in "abc"],
                         [(0, 0), (3, 4096), (250, 1_000_000)])
        self.assertEqual(nodes["a"].status.followers()[1],
                         FollowerLag("c", -150, False, 250, 1_000_000, True, 2))
        on_follower = {status.name: status for status in nodes["b"].status.nodes()}
        self.assertEqual([(on_follower[name].lag_operations, on_follower[name].lag_bytes) for name in "abc"],
                         [(0, 0), (None, None), (None, None)])
        self.assertEqual(nodes["b"].status.followers(), [])
        # The figures are read when asked: the list is the replication's own, updated in place.
        figures[0] = lag("b", 0, 0)
        self.assertEqual(nodes["a"].status.nodes()[1],
                         NodeStatus("b", True, False, False, {"amqp": "tcp:127.0.0.1:b"}, 0, 0))

    @defer.inlineCallbacks
    def test_a_node_named_only_in_the_in_sync_set_is_listed_not_running(self):
        nodes = yield start_cluster(self, self.etcd, "a", "b")
        yield nodes["a"].candidate.put_in_sync_set(["a", "b", "z"])
        yield wait_until(lambda: nodes["b"].status.in_sync_set() == ["a", "b", "z"])
        self.assertEqual(nodes["b"].status.nodes()[-1], NodeStatus("z", False, False, True, {}, None, None))


class LeaderChangeCountTests(unittest.TestCase):
    """The count follows etcd's leader_changes_seen_total: a leader lost and taken again is a new one."""

    def setUp(self):
        client = EtcdClient(reactor, "http://127.0.0.1:1", timeout=1.0)  # never started: nothing is asked
        self.clock = task.Clock()
        self.status = ClusterStatus("c1", "a", Candidate(client, self.clock, ClusterKeys("c1"), NodeInfo("a")),
                                    clock=self.clock)

    def test_changes_count_each_new_leader_and_a_leader_regained_after_none(self):
        a, b = NodeInfo("a"), NodeInfo("b")
        for when, info in ((1, a), (2, None), (3, a), (4, b), (5, b)):
            self.clock.advance(when - self.clock.seconds())
            self.status.on_leader(info)
        self.assertEqual(self.status.leader_changes, 3)
        self.assertEqual(self.status.leader_elected_at, 4)
        self.status.on_leader(None)
        self.assertIsNone(self.status.leader_elected_at)

    def test_a_follower_entry_of_the_wrong_type_is_refused_with_its_field(self):
        with self.assertRaisesRegex(ValueError, "follower 'b': lag_bytes is not int"):
            FollowerLag.of({"node": "b", "lag_bytes": "12"})
        with self.assertRaisesRegex(ValueError, "in_sync is not bool"):
            FollowerLag.of({"node": "b", "in_sync": 1})
        with self.assertRaisesRegex(ValueError, "without a node name"):
            FollowerLag.of({"lag_bytes": 1})
