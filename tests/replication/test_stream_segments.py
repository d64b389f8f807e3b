"""A leader's outbound stream keeps its frames in segments and hands a follower a run of them as
one slice: the same bytes the frames are one by one, within a byte limit and one segment, and
the oldest segments dropped past the byte cap unless a snapshot pins them."""

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
