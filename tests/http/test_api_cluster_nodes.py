"""/api/nodes, /api/nodes/NAME, /api/overview and brokerd's /api/cluster on the nodes of a cluster: real candidates
on a real etcd, each node's management API on loopback, read with urllib and RabbitMQ's rabbitmqadmin."""

import json
import pathlib

from twisted.internet import defer
from twisted.trial import unittest

from tests.support import api_types
from tests.support.broker import wait_until
from tests.support.cluster_api import start_cluster
from tests.support.etcd import eventually, needs_etcd, start_etcd
from tests.support.httpapi import RABBITMQADMIN

HERE = pathlib.Path(__file__).parent
REFERENCE = json.loads((HERE / "rabbitmq_api_types.json").read_text())["endpoints"]
NOT_PROVIDED = json.loads((HERE / "api_fields_not_provided.json").read_text())["groups"]
BROKERD_FIELDS = ("cluster_name", "leader", "in_sync", "replication_lag_bytes", "replication_lag_operations",
                  "in_sync_alarm")


def not_provided(endpoint):
    return {pattern: reason for group in NOT_PROVIDED if endpoint in group["endpoints"]
            for pattern, reason in group["fields"].items()}


def by_name(entries):
    return {entry["name"]: entry for entry in entries}


def lag(node, operations, size):
    return {"node": node, "acked": 7, "in_sync": True, "lag_operations": operations, "lag_bytes": size,
            "paused": False, "pauses": 1}


@needs_etcd
class ClusterNodesApiTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)

    @defer.inlineCallbacks
    def test_every_node_lists_the_three_nodes_in_rabbitmqs_shape_with_brokerds_fields(self):
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c", followers=[lag("b", 2, 300), lag("c", 9, 5000)])
        for name, node in nodes.items():
            answer = yield node.get("/api/nodes")
            entries = by_name(answer)
            self.assertEqual(sorted(entries), ["brokerd@a", "brokerd@b", "brokerd@c"], name)
            self.assertEqual({entry["cluster_name"] for entry in answer}, {"c1"})
            self.assertEqual([entries[f"brokerd@{n}"]["leader"] for n in "abc"], [True, False, False])
            self.assertEqual([entries[f"brokerd@{n}"]["running"] for n in "abc"], [True, True, True])
            self.assertEqual([entries[f"brokerd@{n}"]["in_sync"] for n in "abc"], [True, False, False])
            self.assertEqual({entry["type"] for entry in answer}, {"disc"})
            # Every field has RabbitMQ's type; brokerd's lag fields are null where this node cannot know them.
            problems = api_types.compare(REFERENCE["nodes"]["fields"], answer, not_provided("nodes"))
            self.assertEqual([line for line in problems if "replication_lag_" not in line], [], name)
            for entry in answer:
                self.assertEqual(set(BROKERD_FIELDS) - set(entry), set())
                for field in ("replication_lag_bytes", "replication_lag_operations"):
                    self.assertTrue(entry[field] is None or type(entry[field]) is int, (field, entry[field]))
            # The node's own entry has its own figures; another's keep their types, empty.
            own = entries[f"brokerd@{name}"]
            self.assertEqual([entry["in_sync_alarm"] for entry in answer], [False] * 3)  # min-isr 1 is met
            self.assertGreater(own["mem_used"], 0)
            self.assertGreater(own["fd_total"], 0)
            other = entries[f"brokerd@{'b' if name == 'a' else 'a'}"]
            self.assertEqual((other["mem_used"], other["os_pid"], other["applications"]), (0, "", []))
            overview = yield node.get("/api/overview")
            self.assertEqual((overview["node"], overview["cluster_name"]), (f"brokerd@{name}", "c1"))
            one = yield node.get(f"/api/nodes/brokerd@{name}")
            self.assertEqual((one["name"], one["leader"]), (f"brokerd@{name}", name == "a"))
        on_leader = by_name((yield nodes["a"].get("/api/nodes")))
        self.assertEqual([(on_leader[f"brokerd@{n}"]["replication_lag_operations"],
                           on_leader[f"brokerd@{n}"]["replication_lag_bytes"]) for n in "abc"],
                         [(0, 0), (2, 300), (9, 5000)])
        on_follower = by_name((yield nodes["c"].get("/api/nodes")))
        self.assertEqual([on_follower[f"brokerd@{n}"]["replication_lag_bytes"] for n in "abc"], [0, None, None])

    @defer.inlineCallbacks
    def test_an_unknown_node_is_not_found_as_rabbitmq_answers(self):
        nodes = yield start_cluster(self, self.etcd, "a", "b")
        status, body = yield nodes["b"].request("GET", "/api/nodes/brokerd@zz")
        self.assertEqual((status, body), (404, {"error": "Object Not Found", "reason": "Not Found"}))

    @defer.inlineCallbacks
    def test_rabbitmqadmin_lists_the_nodes_and_a_stopped_one_as_not_running(self):
        if RABBITMQADMIN is None:
            raise unittest.SkipTest("rabbitmqadmin is not installed")
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c")
        out, err, code = yield nodes["b"].rabbitmqadmin("-f", "tsv", "list", "nodes", "name", "type", "running")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.decode().splitlines(), ["name\ttype\trunning", "brokerd@a\tdisc\tTrue",
                                                     "brokerd@b\tdisc\tTrue", "brokerd@c\tdisc\tTrue"])
        out, err, code = yield nodes["c"].rabbitmqadmin("list", "nodes")  # its default columns
        self.assertEqual(code, 0, err)
        self.assertIn("brokerd@a", out.decode())
        yield nodes["a"].stop()
        yield wait_until(lambda: nodes["b"].status.leader_name() in ("b", "c"), timeout=10)
        out, err, code = yield nodes["b"].rabbitmqadmin("-f", "tsv", "list", "nodes", "name", "running")
        self.assertEqual(out.decode().splitlines()[1:],
                         ["brokerd@a\tFalse", "brokerd@b\tTrue", "brokerd@c\tTrue"])
        cluster = yield nodes["b"].get("/api/cluster")
        self.assertEqual(cluster["leader_changes"], 2)
        self.assertIn(cluster["leader"], ("brokerd@b", "brokerd@c"))
        self.assertEqual(cluster["running_nodes"], ["brokerd@b", "brokerd@c"])

    @defer.inlineCallbacks
    def test_the_cluster_page_gives_the_leader_the_in_sync_set_and_each_followers_lag(self):
        figures = [lag("b", 4, 512)]
        nodes = yield start_cluster(self, self.etcd, "a", "b", followers=figures, min_in_sync=2)
        yield nodes["a"].candidate.put_in_sync_set(["a", "b"])
        cluster = yield eventually(lambda: nodes["a"].get("/api/cluster"), lambda answer: len(answer["in_sync"]) == 2)
        elected_at = cluster.pop("leader_elected_at")
        self.assertIsInstance(elected_at, int)
        self.assertEqual(cluster, {
            "cluster_name": "c1", "node": "brokerd@a", "leader": "brokerd@a", "leader_changes": 1,
            "running_nodes": ["brokerd@a", "brokerd@b"], "in_sync": ["brokerd@a", "brokerd@b"], "min_in_sync": 2,
            "followers": [{"name": "brokerd@b", "acked": 7, "in_sync": True, "lag_operations": 4, "lag_bytes": 512,
                           "paused": False, "pauses": 1}],
        })
        on_follower = yield eventually(lambda: nodes["b"].get("/api/cluster"), lambda answer: answer["in_sync"])
        self.assertEqual((on_follower["node"], on_follower["leader"], on_follower["followers"]),
                         ("brokerd@b", "brokerd@a", []))
        self.assertEqual(on_follower["leader_elected_at"] // 60000, elected_at // 60000)  # the same minute

    @defer.inlineCallbacks
    def test_the_cluster_page_and_the_nodes_need_the_monitoring_tag(self):
        nodes = yield start_cluster(self, self.etcd, "a")
        status, _ = yield nodes["a"].request("PUT", "/api/users/watcher", {"password": "pw", "tags": "management"})
        self.assertEqual(status, 201)
        for path in ("/api/cluster", "/api/nodes", "/api/nodes/brokerd@a"):
            status, body = yield nodes["a"].request("GET", path, user=("watcher", "pw"))
            self.assertEqual((status, body), (401, {"error": "not_authorised", "reason": "Not monitor user"}), path)
