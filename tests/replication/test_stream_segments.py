"""A leader's outbound stream keeps its frames in segments and hands a follower a run of them as
one slice: the same bytes the frames are one by one, within a byte limit and one segment, and
the oldest segments dropped past the byte cap unless a snapshot pins them."""

from twisted.internet import task
from twisted.trial import unittest

from brokerd.replication import codec
from brokerd.replication.stream import SEGMENT_BYTES, OutboundStream


def record(stream, count, body=b"x" * 100):
    for number in range(count):
        stream.record(codec.APPEND, b"\x0a\x00", body + str(number).encode())


def decoded(data):
    """C{(sequence, body)} of each operation frame in C{data}."""
    decoder = codec.FrameDecoder(codec.DEFAULT_FRAME_LIMIT)
    found = []
    for kind, payload in decoder.feed(data):
        sequence, operation, _, body = codec.split_operation(payload)
        found.append((kind, sequence, operation, bytes(body)))
    assert decoder.buffered() == 0, "the run ends on a frame's end"
    return found


class SegmentTests(unittest.TestCase):

    def test_a_run_is_the_frames_one_after_another(self):
        stream = OutboundStream()
        record(stream, 50)
        data, following = stream.frames_from(11, 1 << 20)
        self.assertEqual(following, 51)
        self.assertEqual(data, b"".join(b"".join(stream.frame(n)[0]) for n in range(11, 51)))
        self.assertEqual([(kind, sequence) for kind, sequence, _, _ in decoded(data)],
                         [(codec.OPERATION, n) for n in range(11, 51)])
        self.assertEqual(decoded(data)[0][3], b"x" * 100 + b"10")

    def test_a_run_stops_at_the_byte_limit_on_a_frame_boundary_but_holds_one_frame(self):
        stream = OutboundStream()
        record(stream, 20)
        size = len(stream.frame(1)[0][0])
        data, following = stream.frames_from(1, 3 * size + 5)
        self.assertEqual((len(data), following), (3 * size, 4))
        data, following = stream.frames_from(4, 1)
        self.assertEqual((len(data), following), (size, 5), "a frame over the limit goes alone")

    def test_two_followers_at_one_place_get_one_copy(self):
        stream = OutboundStream()
        record(stream, 20)
        first, _ = stream.frames_from(5, 1 << 20)
        second, _ = stream.frames_from(5, 1 << 20)
        self.assertIs(first, second)
        record(stream, 1)
        third, following = stream.frames_from(5, 1 << 20)
        self.assertEqual((len(third) > len(first), following), (True, 22))

    def test_runs_do_not_cross_segments_and_the_cap_drops_whole_segments(self):
        stream = OutboundStream(16 * 1024)  # segments of 1 KiB
        record(stream, 400)  # some 50 KiB
        self.assertLessEqual(stream.retained_bytes(), 16 * 1024)
        self.assertGreater(stream.retained_bytes(), 15 * 1024)
        first = stream.first_retained
        self.assertGreater(first, 250)
        with self.assertRaises(KeyError):
            stream.frames_from(first - 1, 1 << 20)
        sequence, seen = first, []
        while sequence <= stream.last_sequence:
            data, sequence = stream.frames_from(sequence, 1 << 20)
            self.assertLessEqual(len(data), 1024)
            seen.extend(n for _, n, _, _ in decoded(data))
        self.assertEqual(seen, list(range(first, 401)))
        self.assertEqual(stream.bytes_after(first - 1), stream.retained_bytes())
        self.assertEqual(stream.bytes_after(400), 0)

    def test_a_pin_keeps_its_frames_past_the_cap_until_unpinned(self):
        stream = OutboundStream(16 * 1024)
        record(stream, 10)
        token = stream.pin(3)
        record(stream, 400)
        self.assertLessEqual(stream.first_retained, 3)
        self.assertEqual(decoded(stream.frames_from(3, 200)[0])[0][1], 3)
        stream.unpin(token)
        record(stream, 1)
        self.assertGreater(stream.first_retained, 250)

    def test_a_frame_bigger_than_a_segment_gets_one_of_its_own(self):
        stream = OutboundStream()
        record(stream, 2)
        stream.record(codec.APPEND, b"\x0a\x00", b"y" * (SEGMENT_BYTES + 10))
        record(stream, 2)
        data, following = stream.frames_from(3, 1 << 30)
        self.assertEqual(following, 4)
        self.assertEqual(decoded(data)[0][3], b"y" * (SEGMENT_BYTES + 10))
        self.assertEqual([n for _, n, _, _ in decoded(stream.frames_from(4, 1 << 30)[0])], [4, 5])

    def test_a_promoted_leaders_stream_goes_on_from_its_number(self):
        stream = OutboundStream(last_sequence=1000)
        self.assertEqual((stream.first_retained, stream.bytes_after(10)), (1001, 0))
        record(stream, 3)
        self.assertEqual([n for _, n, _, _ in decoded(stream.frames_from(1001, 1 << 20)[0])],
                         [1001, 1002, 1003])


class RunTests(unittest.TestCase):
    """Appends alike made in one turn travel as one frame, numbered as many operations."""

    def setUp(self):
        self.clock = task.Clock()
        self.stream = OutboundStream(reactor=self.clock)

    def append(self, record, count, body=b"m"):
        return [self.stream.record_append(record, body + str(n).encode()) for n in range(count)]

    def test_appends_alike_in_one_turn_are_one_run_frame(self):
        alike = b"\x0a\x00"
        self.assertEqual(self.append(alike, 5), [1, 2, 3, 4, 5])
        self.clock.advance(0)
        data, following = self.stream.frames_from(1, 1 << 20)
        self.assertEqual(following, 6)
        ((kind, sequence, operation, body),) = decoded(data)
        self.assertEqual((kind, sequence, operation), (codec.OPERATION, 1, codec.APPEND_RUN))
        self.assertEqual(codec.split_run(body, 1), [b"m0", b"m1", b"m2", b"m3", b"m4"])
        with self.assertRaises(KeyError):
            self.stream.frames_from(3, 1 << 20)  # inside the run: no frame starts there

    def test_another_record_or_operation_ends_the_run(self):
        first, other = b"\x0a\x00", b"\x0a\x01x"
        self.append(first, 2)
        self.append(other, 1)
        self.stream.record(codec.ACK_MESSAGE, b"")
        self.append(first, 3)
        self.clock.advance(0)
        data, following = self.stream.frames_from(1, 1 << 20)
        self.assertEqual(following, 8)
        self.assertEqual([(sequence, operation) for _, sequence, operation, _ in decoded(data)],
                         [(1, codec.APPEND_RUN), (3, codec.APPEND), (4, codec.ACK_MESSAGE),
                          (5, codec.APPEND_RUN)])

    def test_the_listeners_hear_of_a_run_once_it_is_a_frame(self):
        heard = []
        self.stream.subscribe(lambda sequence: heard.append(
            (sequence, len(self.stream.frames_from(1, 1 << 20)[0]))))
        self.append(b"\x0a\x00", 3)
        self.assertEqual(heard, [])
        self.clock.advance(0)
        self.assertEqual(heard, [(3, codec.OPERATION_FRAME_OVERHEAD + 2 + 3 * 6)])
        self.assertEqual(self.stream.bytes_after(0), heard[0][1])
        self.assertEqual(self.stream.bytes_after(3), 0)

    def test_a_follower_sent_each_announcement_at_once_gets_every_operation_under_a_small_cap(self):
        stream = OutboundStream(4096, reactor=self.clock)
        seen, following = [], [1]

        def send(sequence):  # what a follower's link does when told
            while following[0] <= sequence:
                data, following[0] = stream.frames_from(following[0], 1 << 20)
                for _, first, operation, body in decoded(data):
                    count = len(codec.split_run(body, first)) if operation == codec.APPEND_RUN else 1
                    seen.extend(range(first, first + count))
        stream.subscribe(send)
        records = (b"\x0a\x00", b"\x0a\x01a", b"\x0a\x01b")
        for number in range(600):  # runs of 1 to 3 alike, some 90 KiB in all
            stream.record_append(records[number // 3 % 3 if number % 7 else 0], b"x" * 150)
            if number % 50 == 49:
                self.clock.advance(0)
        self.clock.advance(0)
        self.assertEqual(seen, list(range(1, 601)))
        self.assertGreater(stream.first_retained, 500, "the cap dropped the oldest")


class CommitStartTests(unittest.TestCase):
    """Where every tapped store says when its commits start, the followers hear then."""

    def setUp(self):
        self.clock = task.Clock()
        self.stream = OutboundStream(reactor=self.clock)
        self.heard = []
        self.stream.subscribe(self.heard.append)

    def test_operations_are_announced_as_a_commit_starts_not_at_the_turns_end(self):
        self.stream.add_tap("", object(), commit_starts=True)
        self.stream.record_append(b"\x0a\x00", b"a")
        self.stream.record(codec.ACK_MESSAGE, b"")
        self.clock.advance(0)
        self.assertEqual(self.heard, [])
        self.stream.commit_starting()
        self.assertEqual(self.heard, [2])
        self.stream.commit_starting()
        self.assertEqual(self.heard, [2], "nothing new: nothing told")

    def test_one_store_that_does_not_say_keeps_announcements_per_turn(self):
        self.stream.add_tap("", object(), commit_starts=True)
        self.stream.add_tap("other", object(), commit_starts=False)
        self.stream.record_append(b"\x0a\x00", b"a")
        self.clock.advance(0)
        self.assertEqual(self.heard, [1])


class CutTests(unittest.TestCase):

    def test_a_snapshots_position_ends_the_run_so_the_stream_can_go_on_from_it(self):
        clock = task.Clock()
        stream = OutboundStream(reactor=clock)
        for number in range(3):
            stream.record_append(b"\x0a\x00", b"before %d" % number)
        position = stream.cut()
        for number in range(2):  # alike, in the same turn
            stream.record_append(b"\x0a\x00", b"after %d" % number)
        clock.advance(0)
        data, following = stream.frames_from(position + 1, 1 << 20)
        self.assertEqual((position, following), (3, 6))
        ((_, first, operation, body),) = decoded(data)
        self.assertEqual((first, codec.split_run(body, first)), (4, [b"after 0", b"after 1"]))
