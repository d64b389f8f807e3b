"""Every byte from a replication peer is hostile: strangers, wrong secrets, oversized or
malformed frames, out-of-range acks, another cluster's data and a second link of one node
name are refused, named, and disturb neither the stores nor the other followers."""

from twisted.internet import defer, task
from twisted.trial import unittest

from brokerd.proto import messages_pb2, replication_pb2
from brokerd.replication import codec, replica
from brokerd.replication.leader import HANDSHAKE_TIMEOUT
from tests.support.broker import wait_until
from tests.support.replication import SECRET, Follower, Leader, messages, topology
from tests.support.replication_peers import (
    FakeLeaderFactory, authenticated_follower, connect_raw, listen_fake_leader, operation_frame)

KEPT = messages_pb2.QueueRecord(vhost="/", name="kept", durable=True)
GOOD = operation_frame(1, codec.SAVE_QUEUE, replication_pb2.ReplicatedOperation(
    queue_record=KEPT).SerializeToString())
BAD_RECORD = replication_pb2.ReplicatedOperation(
    queue_record={"vhost": "/", "name": "never", "durable": True}).SerializeToString()


KEPT_APPEND = replication_pb2.ReplicatedOperation(
    queues=[{"vhost": "/", "name": "kept"}], routing_key="kept",
    properties=messages_pb2.BasicProperties(delivery_mode=2).SerializeToString(),
).SerializeToString()


def refusal_reasons(leader):
    return [reason for _, reason in leader.server.refusals]


class Strangers(unittest.TestCase):

    @defer.inlineCallbacks
    def test_a_stranger_gets_only_the_challenge_and_is_dropped_after_the_handshake_timeout(self):
        clock = task.Clock()
        leader = yield Leader().start(self, "sqlite", clock=clock)
        topology(leader.store)
        peer = yield connect_raw(leader.address)
        self.addCleanup(lambda: peer.transport.abortConnection())
        yield peer.wait_frames(1)
        clock.advance(HANDSHAKE_TIMEOUT - 1)
        self.assertFalse(peer.closed)
        clock.advance(1)
        yield peer.wait_closed()
        self.assertEqual(peer.kinds(), [codec.HELLO])
        self.assertEqual(len(peer.received), codec.FRAME_HEADER.size + len(codec.MAGIC) + 32)
        self.assertIn("no answer to the challenge in time", refusal_reasons(leader))
        self.assertEqual(leader.server.followers, set())

    @defer.inlineCallbacks
    def test_a_declared_length_over_the_cap_is_refused_before_memory_is_taken(self):
        leader = yield Leader().start(self, "chunked")
        peer = yield connect_raw(leader.address)
        yield peer.wait_frames(1)
        peer.send(b"\xff\xff\xff\xff" + bytes([codec.AUTH]))  # 4 GiB declared
        yield peer.wait_closed()
        self.assertEqual(refusal_reasons(leader),
                         [f"frame declares {2 ** 32 - 2} bytes, over the limit of 4096"])

    @defer.inlineCallbacks
    def test_an_oversized_frame_after_authentication_stops_the_follower(self):
        factory = FakeLeaderFactory(SECRET, b"\xff\xff\xff\xff" + bytes([codec.OPERATION]))
        port = yield listen_fake_leader(self, factory)
        follower = yield Follower().start(self, "filelog")
        client = yield follower.connect(None, address=port.getHost())
        yield client.when_lost()
        self.assertEqual(client.reason,
                         f"frame declares {2 ** 32 - 2} bytes, over the limit of {4 * 1024 * 1024}")
        self.assertEqual(follower.applier.applied_sequence, 0)


class WrongSecrets(unittest.TestCase):

    @defer.inlineCallbacks
    def check_nothing_applied(self, leader, follower, client):
        yield client.when_lost()
        self.assertEqual(follower.applier.applied_sequence, 0)
        self.assertEqual(leader.server.followers, set())
        found = yield follower.reopened_contents()
        self.assertEqual(found, {"topology": [], "delayed": []})

    @defer.inlineCallbacks
    def test_a_follower_with_another_secret_is_refused_and_gets_nothing(self):
        leader = yield Leader().start(self, "sqlite")
        topology(leader.store)
        follower = yield Follower().start(self, "chunked")
        client = yield follower.connect(leader, secret=b"not the secret")
        yield self.check_nothing_applied(leader, follower, client)
        self.assertIn("failed authentication (wrong secret, or not a brokerd follower)",
                      refusal_reasons(leader))
        self.assertIn("the connection closed while welcome", client.reason)

    @defer.inlineCallbacks
    def test_a_leader_with_another_secret_is_refused_by_the_follower_before_anything_applies(self):
        leader = yield Leader().start(self, "sqlite", secret=b"not the secret")
        topology(leader.store)
        follower = yield Follower().start(self, "chunked")
        client = yield follower.connect(leader)
        yield self.check_nothing_applied(leader, follower, client)
        self.assertIn("failed authentication (wrong secret, or not a brokerd follower)",
                      refusal_reasons(leader))

    @defer.inlineCallbacks
    def test_a_leader_whose_proof_is_wrong_is_dropped_and_its_operations_not_applied(self):
        factory = FakeLeaderFactory(SECRET, GOOD, proof_secret=b"a guess")
        port = yield listen_fake_leader(self, factory)
        follower = yield Follower().start(self, "sqlite")
        client = yield follower.connect(None, address=port.getHost())
        yield client.when_lost()
        self.assertEqual(client.reason, "the leader failed authentication (wrong secret)")
        self.assertEqual(follower.applier.applied_sequence, 0)
        self.assertEqual((yield follower.reopened_contents()), {"topology": [], "delayed": []})


class GarbageAfterAuthentication(unittest.TestCase):

    @defer.inlineCallbacks
    def check_garbage(self, garbage, reason):
        """C{reason}: what the follower's link says, or how it starts (ending with "...")."""
        factory = FakeLeaderFactory(SECRET, GOOD + garbage)
        port = yield listen_fake_leader(self, factory)
        follower = yield Follower().start(self, "chunked")
        client = yield follower.connect(None, address=port.getHost())
        yield client.when_lost()
        if reason.endswith("..."):
            self.assertTrue(client.reason.startswith(reason[:-3]), client.reason)
        else:
            self.assertEqual(client.reason, reason)
        self.assertEqual(follower.applier.applied_sequence, 1)
        found = yield follower.reopened_contents()
        self.assertEqual(found["topology"], [("QueueRecord", KEPT.SerializeToString(deterministic=True))],
                         "only the good operation is applied")
        self.assertFalse(found.get(("/", "kept")), "no message of a refused operation is kept")

    def test_an_unknown_operation_code(self):
        return self.check_garbage(operation_frame(2, 99, BAD_RECORD),
                                  "unknown operation code 99 at sequence 2")

    def test_a_record_overrunning_its_frame(self):
        payload = codec.OPERATION_HEADER.pack(2, codec.SAVE_QUEUE, len(BAD_RECORD) + 10) + BAD_RECORD
        return self.check_garbage(codec.frame(codec.OPERATION, payload),
                                  f"operation record of {len(BAD_RECORD) + 10} bytes overruns its"
                                  f" frame ({len(payload)} bytes) at sequence 2")

    def test_an_undecodable_record(self):
        return self.check_garbage(
            operation_frame(2, codec.SAVE_QUEUE, b"\x0a\xff\xff\xff\xff\x0f"),
            "undecodable save_queue record at sequence 2: Error parsing message...")

    def test_an_append_whose_properties_do_not_parse(self):
        append = replication_pb2.ReplicatedOperation(
            queues=[{"vhost": "/", "name": "kept"}], routing_key="kept",
            properties=b"\x0a\xff\xff\xff\xff\x0f")
        return self.check_garbage(
            operation_frame(2, codec.APPEND, append.SerializeToString(), b"body"),
            "undecodable properties of message 2: Error parsing message...")

    @defer.inlineCallbacks
    def test_an_append_run_with_a_body_overrunning_its_frame_is_applied_not_at_all(self):
        bodies = codec.BODY_LENGTH.pack(4) + b"good" + codec.BODY_LENGTH.pack(100) + b"short"
        yield self.check_garbage(
            operation_frame(2, codec.APPEND_RUN, KEPT_APPEND, bodies),
            "append run at sequence 2: a body of 100 bytes overruns its frame")

    def test_an_append_run_ending_inside_a_length(self):
        return self.check_garbage(
            operation_frame(2, codec.APPEND_RUN, KEPT_APPEND, codec.BODY_LENGTH.pack(4) + b"good\x00"),
            "append run at sequence 2 ends inside a body's length")

    def test_an_empty_append_run(self):
        return self.check_garbage(operation_frame(2, codec.APPEND_RUN, KEPT_APPEND),
                                  "append run at sequence 2 holds no message")

    def test_an_operation_out_of_order(self):
        return self.check_garbage(operation_frame(7, codec.SAVE_QUEUE, BAD_RECORD),
                                  "operation 7 out of order: expected 2")

    @defer.inlineCallbacks
    def test_an_ack_outside_range_drops_that_link_and_the_others_are_served(self):
        leader = yield Leader().start(self, "sqlite")
        follower = yield Follower().start(self, "filelog")
        yield follower.connect(leader)
        topology(leader.store)
        rogue = yield authenticated_follower(leader.address, SECRET)
        self.addCleanup(lambda: rogue.transport.abortConnection())
        self.assertEqual(len(leader.server.followers), 2)
        rogue.send(codec.frame(codec.ACK, codec.SEQUENCE.pack(999)))
        yield rogue.wait_closed()
        last = leader.stream.last_sequence
        self.assertIn(f"acked operation 999, outside 0 to {last}", refusal_reasons(leader))
        messages(leader.store, 0, 20)
        yield leader.server.confirmed_up_to(leader.stream.last_sequence)
        self.assertEqual([link["node"] for link in leader.server.status()], ["n2"])
        self.assertEqual(follower.applier.durable_sequence, leader.stream.last_sequence)
        self.assertEqual((yield follower.reopened_contents()), (yield leader.reopened_contents()))


class Identity(unittest.TestCase):

    @defer.inlineCallbacks
    def test_a_follower_holding_another_clusters_data_is_refused_naming_both(self):
        leader = yield Leader().start(self, "chunked")
        other = yield Follower().start(self, "sqlite")
        other.store.save_exchange(replica.state_record(replica.StoreState("c2", 3, 10)))
        yield other.stop()
        follower = yield Follower().start(self, "sqlite", other.path)
        self.assertEqual(follower.applier.cluster_id, "c2")
        client = yield follower.connect(leader)
        yield client.when_lost()
        reason = "follower 'n2' holds data of cluster 'c2', not of this cluster 'c1'"
        self.assertIn(reason, refusal_reasons(leader))
        self.assertEqual(client.reason, f"the leader refused this node: {reason}")

    @defer.inlineCallbacks
    def test_a_second_link_of_the_same_node_replaces_the_first(self):
        leader = yield Leader().start(self, "sqlite")
        first = yield Follower().start(self, "chunked")
        yield first.connect(leader)
        old = first.client
        topology(leader.store)
        yield leader.server.confirmed_up_to(leader.stream.last_sequence)
        second = yield Follower().start(self, "chunked")
        yield second.connect(leader)
        yield old.when_lost()
        self.assertEqual([link["node"] for link in leader.server.status()], ["n2"])
        (link,) = leader.server.followers
        self.assertEqual(link.transport.getPeer().port,
                      second.client.link.transport.getHost().port)
        self.assertTrue(any("connected again: this older link is replaced" in reason
                            for reason in refusal_reasons(leader)))
        messages(leader.store, 0, 10)
        yield wait_until(lambda: second.applier.durable_sequence == leader.stream.last_sequence)
        self.assertEqual((yield second.reopened_contents()), (yield leader.reopened_contents()))

