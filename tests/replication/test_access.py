"""The leader's access database (users, vhosts, permissions, policies, parameters) travels in the
stream as one JSON document per change, handed to the follower's sink in sequence order, and
opens a snapshot, so that a resynced follower has the users of the leader it copies."""

import json

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.access.database import AccessDatabase
from tests.support.broker import wait_until
from tests.support.replication import Q1, Follower, Leader, message, topology


def document(database):
    return json.dumps(database.document()).encode("utf-8")


class AccessDocument(unittest.TestCase):

    @defer.inlineCallbacks
    def test_each_change_reaches_the_sink_in_sequence_order(self):
        access = AccessDatabase.in_memory()
        leader = yield Leader().start(self, "sqlite")
        seen = []
        follower = yield Follower().start(
            self, "chunked", access_sink=lambda body: seen.append((follower.applier.applied_sequence, body)))
        yield follower.connect(leader)
        topology(leader.store)
        access.add_user("replicated", "secret", tags=("management",))
        first = leader.stream.record_access_document(document(access))
        leader.store.append(message(b"between"), [Q1])
        access.add_vhost("orders")
        access.set_permissions("replicated", "orders", ".*", ".*", "")
        second = leader.stream.record_access_document(document(access))
        leader.stream.record_access_document(b"\xff not JSON")  # the sink's to judge, not the applier's
        yield leader.server.confirmed_up_to(leader.stream.last_sequence)
        self.assertEqual([sequence + 1 for sequence, _ in seen], [first, second, second + 1])
        self.assertEqual(json.loads(seen[1][1]), access.document())
        self.assertIn({"user": "replicated", "vhost": "orders", "configure": ".*", "write": ".*",
                       "read": ""}, json.loads(seen[1][1])["permissions"])
        self.assertEqual(seen[2][1], b"\xff not JSON")

    @defer.inlineCallbacks
    def test_a_snapshot_starts_with_the_current_document(self):
        access = AccessDatabase.in_memory()
        access.add_user("before-the-snapshot", "secret")
        leader = yield Leader().start(self, "filelog", history=(), access_document=lambda: document(access))
        topology(leader.store)
        leader.stream.record_access_document(document(access))
        seen = []
        follower = yield Follower().start(
            self, "sqlite", access_sink=lambda body: seen.append((follower.applier.durable_sequence, body)))
        client = yield follower.connect(leader)
        yield wait_until(lambda: follower.applier.durable_sequence == leader.stream.last_sequence)
        self.assertEqual(client.resyncs, 1)
        self.assertEqual(len(seen), 1, "the document, once: from the snapshot, not the old stream")
        self.assertEqual(json.loads(seen[0][1]), access.document())
        self.assertIn("before-the-snapshot", [user["name"] for user in json.loads(seen[0][1])["users"]])
