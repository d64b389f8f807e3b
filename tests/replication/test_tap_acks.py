"""A leader's acks of one queue made in a row travel as one operation, in their place among the
others: recorded before the tap's next other operation, before a sync, or at the end of the
reactor's turn."""

from twisted.internet import defer, task
from twisted.trial import unittest

from brokerd.replication import codec
from brokerd.replication.stream import OutboundStream
from brokerd.replication.tap import StoreTap
from tests.support.replication import Q1, Q2, directory, message, open_store, topology


def operations(stream, after=0):
    """(operation name, ids) of each operation recorded after sequence C{after}."""
    found = []
    for sequence in range(after + 1, stream.last_sequence + 1):
        parts, _ = stream.frame(sequence)
        payload = b"".join(parts)[codec.FRAME_HEADER.size:]
        _, operation, record, _ = codec.decode_operation(payload)
        found.append((codec.OPERATIONS[operation], list(record.messages)))
    return found


class AckRunsTests(unittest.TestCase):
    @defer.inlineCallbacks
    def setUp(self):
        store = yield open_store("sqlite", directory(self))
        self.addCleanup(store.close)
        self.clock = task.Clock()
        self.stream = OutboundStream()
        self.tap = StoreTap(store, self.stream, reactor=self.clock)
        topology(self.tap)
        self.handles = [self.tap.append(message(b"m%d" % number), [Q1]) for number in range(4)]
        self.other = self.tap.append(message(b"other"), [Q2])
        self.before = self.stream.last_sequence
        self.ids = list(range(self.before - 4, self.before))

    def test_acks_of_one_turn_are_one_operation_at_its_end(self):
        for handle in self.handles[:3]:
            self.tap.ack(Q1, handle)
        self.assertEqual(self.stream.last_sequence, self.before, "held until the turn ends")
        self.clock.advance(0)
        self.assertEqual(operations(self.stream, self.before), [("ack", self.ids[:3])])

    def test_acks_are_recorded_before_the_next_operation_and_before_a_sync(self):
        self.tap.ack(Q1, self.handles[0])
        self.tap.ack(Q2, self.other)  # another queue: the first run ends
        appended = self.tap.append(message(b"later"), [Q1])
        self.tap.ack(Q1, self.handles[1])
        self.tap.ack(Q1, appended)
        self.tap.sync()
        self.assertEqual([name for name, _ in operations(self.stream, self.before)],
                         ["ack", "ack", "append", "ack"])
        self.assertEqual(operations(self.stream, self.before)[-1][1],
                         [self.ids[1], self.before + 3])
        self.clock.advance(0)
        self.assertEqual(len(operations(self.stream, self.before)), 4, "nothing left to record")

    def test_without_a_reactor_each_ack_is_recorded_at_once(self):
        stream = OutboundStream(last_sequence=100)
        tap = StoreTap(self.tap.store, stream)
        tap.seed(ids={Q1: {self.handles[0]: 7, self.handles[1]: 8}})
        tap.ack(Q1, self.handles[0])
        tap.ack(Q1, self.handles[1])
        self.assertEqual(stream.last_sequence, 102)


class AppendRecordTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_messages_published_alike_share_one_record_and_any_difference_gets_its_own(self):
        store = yield open_store("sqlite", directory(self))
        self.addCleanup(store.close)
        stream = OutboundStream()
        tap = StoreTap(store, stream)
        topology(tap)
        first = message(b"one")
        alike = message(b"two", properties=first.properties)  # the same properties object
        other_key = message(b"three", routing_key="elsewhere", properties=first.properties)
        start = stream.last_sequence
        for record, queues in ((first, [Q1]), (alike, [Q1]), (other_key, [Q1]), (alike, [Q1, Q2])):
            tap.append(record, queues)

        def decoded(sequence):
            parts, _ = stream.frame(sequence)
            _, _, operation, body = codec.decode_operation(b"".join(parts)[codec.FRAME_HEADER.size:])
            return operation, body

        records = [decoded(start + number) for number in range(1, 5)]
        self.assertEqual([body for _, body in records], [b"one", b"two", b"three", b"two"])
        self.assertEqual(records[0][0], records[1][0])
        self.assertEqual(records[2][0].routing_key, "elsewhere")
        self.assertEqual([(key.vhost, key.name) for key in records[3][0].queues], [Q1, Q2])
