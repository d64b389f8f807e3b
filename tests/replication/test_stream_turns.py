"""A leader's outbound stream tells its listeners (each follower's link) of a reactor turn's
operations once, at the turn's end, and of every operation before its byte cap drops it."""

from twisted.internet import task
from twisted.trial import unittest

from brokerd.replication import codec
from brokerd.replication.stream import OutboundStream

RECORD = b"\x0a\x00"  # an empty store name: any bytes do, the stream does not read them


class Listener:
    """Records each announcement, and what the stream still kept of the operations it names."""

    def __init__(self, stream):
        self.stream = stream
        self.heard = []
        self.kept = []
        self.last = stream.last_sequence
        stream.subscribe(self)

    def __call__(self, sequence):
        self.heard.append(sequence)
        self.kept.append([self.stream.first_retained <= number <= sequence
                          for number in range(self.last + 1, sequence + 1)])
        self.last = sequence


class TurnsTests(unittest.TestCase):

    def setUp(self):
        self.clock = task.Clock()

    def record(self, stream, count, body=b"x" * 100):
        for _ in range(count):
            stream.record(codec.APPEND, RECORD, body)

    def test_a_turns_operations_are_announced_once_at_its_end(self):
        stream = OutboundStream(reactor=self.clock)
        listener = Listener(stream)
        self.record(stream, 50)
        self.assertEqual(listener.heard, [], "nothing is announced before the turn ends")
        self.clock.advance(0)
        self.assertEqual(listener.heard, [50])
        self.record(stream, 3)
        self.clock.advance(0)
        self.clock.advance(0)
        self.assertEqual(listener.heard, [50, 53])
        self.assertEqual(stream.announced, 53)

    def test_without_a_reactor_each_operation_is_announced_at_once(self):
        stream = OutboundStream()
        listener = Listener(stream)
        self.record(stream, 3)
        self.assertEqual(listener.heard, [1, 2, 3])

    def test_an_operation_is_announced_before_the_byte_cap_drops_it(self):
        stream = OutboundStream(4096, reactor=self.clock)
        listener = Listener(stream)
        self.record(stream, 200)  # some 24 KiB in one turn, six times the cap
        self.assertGreater(stream.first_retained, 150, "the cap dropped the oldest")
        self.assertTrue(listener.heard, "they were announced before being dropped")
        self.assertTrue(all(all(kept) for kept in listener.kept),
                        "every operation announced was still kept when announced")
        self.clock.advance(0)
        self.assertEqual(listener.heard[-1], 200)
        self.assertEqual(sum(len(kept) for kept in listener.kept), 200, "each announced once")
        self.assertLess(len(listener.heard), 200, "in runs, not one by one")
