"""FrameReceiver: length-prefixed frames over Twisted's StringTransport, however the bytes are split."""

import struct

from twisted.internet import task
from twisted.internet.testing import StringTransport
from twisted.trial import unittest

from brokerd.native.framing import FrameReceiver
from brokerd.wire.write_buffer import WriteBuffer


def framed(*frames):
    """The wire bytes of C{frames}: each a 4-byte big-endian length, then the frame."""
    return b"".join(struct.pack(">I", len(frame)) + frame for frame in frames)


def chunked(data, size):
    return [data[offset : offset + size] for offset in range(0, len(data), size)]


class RecordingFrameReceiver(FrameReceiver):
    """Keeps the frames it receives and the lengths it refused; can pause itself after a frame."""

    def __init__(self, max_length=None, pause_after_each_frame=False):
        super().__init__(task.Clock())
        if max_length is not None:
            self.MAX_LENGTH = max_length
        self.frames = []
        self.refused_lengths = []
        self.pause_after_each_frame = pause_after_each_frame

    def stringReceived(self, frame):
        self.frames.append(frame)
        if self.pause_after_each_frame:
            self.pauseProducing()

    def lengthLimitExceeded(self, length):
        self.refused_lengths.append(length)
        super().lengthLimitExceeded(length)  # Int32StringReceiver drops the connection


def connected_receiver(**options):
    receiver = RecordingFrameReceiver(**options)
    transport = StringTransport()
    receiver.makeConnection(transport)
    return receiver, transport


class SplitAndJoinedReadsTests(unittest.SynchronousTestCase):
    def test_frames_arriving_one_byte_per_read_are_delivered_whole_when_their_last_byte_arrives(self):
        frames = [b"hello", b"", b"x" * 300, bytes(range(256))]
        data = framed(*frames)
        frame_ends = set()
        position = 0
        for frame in frames:
            position += 4 + len(frame)
            frame_ends.add(position)
        receiver, _ = connected_receiver()

        for index in range(len(data)):
            receiver.dataReceived(data[index : index + 1])
            delivered_by_now = sum(1 for end in frame_ends if end <= index + 1)
            self.assertEqual(len(receiver.frames), delivered_by_now, f"after byte {index + 1}")
        self.assertEqual(receiver.frames, frames)

    def test_two_reads_split_anywhere_deliver_the_same_frames(self):
        frames = [b"first", b"", b"third frame", b"\x00" * 5]
        data = framed(*frames)
        for cut in range(len(data) + 1):
            receiver, _ = connected_receiver()
            receiver.dataReceived(data[:cut])
            receiver.dataReceived(data[cut:])
            self.assertEqual(receiver.frames, frames, f"split at byte {cut}")

    def test_many_frames_in_one_read_are_all_delivered_in_order(self):
        frames = [b"frame %d " % number * (number % 7) for number in range(2000)]
        receiver, _ = connected_receiver()
        receiver.dataReceived(framed(*frames))
        self.assertEqual(receiver.frames, frames)

    def test_read_ending_inside_a_length_prefix_keeps_the_partial_prefix(self):
        data = framed(b"complete", b"the next one")
        receiver, _ = connected_receiver()
        receiver.dataReceived(data[: 4 + 8 + 2])  # the first frame and half of the second's prefix
        self.assertEqual(receiver.frames, [b"complete"])
        receiver.dataReceived(data[4 + 8 + 2 :])
        self.assertEqual(receiver.frames, [b"complete", b"the next one"])

    def test_large_frame_in_64_kib_reads_is_delivered_once_and_whole(self):
        large = bytes(range(256)) * (16 * 1024 + 3)  # a little over 4 MiB
        data = framed(large, b"after", b"and after that")
        reads = chunked(data, 64 * 1024)
        receiver, _ = connected_receiver()

        for read in reads:
            receiver.dataReceived(read)

        self.assertEqual([len(frame) for frame in receiver.frames], [len(large), 5, 14])
        self.assertTrue(receiver.frames[0] == large, "the large frame came out changed")
        self.assertEqual(receiver.frames[1:], [b"after", b"and after that"])

    def test_large_frame_is_not_delivered_before_its_last_byte(self):
        large = b"L" * (1024 * 1024)
        data = framed(large)
        receiver, _ = connected_receiver()
        for read in chunked(data[:-1], 64 * 1024):
            receiver.dataReceived(read)
        self.assertEqual(receiver.frames, [])
        receiver.dataReceived(data[-1:])
        self.assertEqual(len(receiver.frames), 1)
        self.assertTrue(receiver.frames[0] == large)


class PauseAndResumeTests(unittest.SynchronousTestCase):
    def test_pausing_inside_a_frame_callback_holds_back_the_rest_of_the_read(self):
        frames = [b"one", b"two", b"three"]
        receiver, transport = connected_receiver(pause_after_each_frame=True)
        receiver.dataReceived(framed(*frames))
        self.assertEqual(receiver.frames, [b"one"])
        self.assertEqual(transport.producerState, "paused")

        receiver.resumeProducing()
        self.assertEqual(receiver.frames, [b"one", b"two"])
        receiver.pause_after_each_frame = False
        receiver.resumeProducing()
        self.assertEqual(receiver.frames, frames)
        self.assertEqual(transport.producerState, "producing")

    def test_reads_while_paused_are_delivered_on_resume_in_order(self):
        receiver, transport = connected_receiver()
        receiver.pauseProducing()
        self.assertEqual(transport.producerState, "paused")
        data = framed(b"a", b"bb", b"ccc")
        receiver.dataReceived(data[:5])
        receiver.dataReceived(data[5:])
        self.assertEqual(receiver.frames, [])

        receiver.resumeProducing()
        self.assertEqual(receiver.frames, [b"a", b"bb", b"ccc"])
        receiver.dataReceived(framed(b"later"))
        self.assertEqual(receiver.frames, [b"a", b"bb", b"ccc", b"later"])

    def test_large_frame_completed_while_paused_is_delivered_on_resume(self):
        large = b"P" * (512 * 1024)
        reads = chunked(framed(large, b"small"), 64 * 1024)
        receiver, _ = connected_receiver()
        receiver.dataReceived(reads[0])
        receiver.pauseProducing()
        for read in reads[1:]:
            receiver.dataReceived(read)
        self.assertEqual(receiver.frames, [])

        receiver.resumeProducing()
        self.assertEqual(len(receiver.frames), 2)
        self.assertTrue(receiver.frames[0] == large)
        self.assertEqual(receiver.frames[1], b"small")


class LengthLimitTests(unittest.SynchronousTestCase):
    def test_length_over_the_limit_is_refused_and_nothing_after_it_is_delivered(self):
        receiver, transport = connected_receiver(max_length=100)
        receiver.dataReceived(framed(b"a" * 100))  # exactly the limit is allowed
        self.assertEqual(receiver.frames, [b"a" * 100])

        receiver.dataReceived(framed(b"b" * 101, b"valid but too late"))
        self.assertEqual(receiver.refused_lengths, [101])
        self.assertTrue(transport.disconnecting)

        receiver.dataReceived(framed(b"still too late", b"x" * 500))
        self.assertEqual(receiver.frames, [b"a" * 100])
        self.assertEqual(receiver.refused_lengths, [101])

    def test_over_limit_length_split_across_reads_is_refused_before_its_body_arrives(self):
        receiver, _ = connected_receiver(max_length=1024)
        prefix = struct.pack(">I", 2**31)
        receiver.dataReceived(framed(b"ok") + prefix[:2])
        self.assertEqual(receiver.refused_lengths, [])
        receiver.dataReceived(prefix[2:])
        self.assertEqual(receiver.refused_lengths, [2**31])
        self.assertEqual(receiver.frames, [b"ok"])

    def test_default_limit_allows_128_mib_frames(self):
        self.assertEqual(FrameReceiver.MAX_LENGTH, 128 * 1024 * 1024)


class SendFrameTests(unittest.SynchronousTestCase):
    def test_send_frame_writes_a_four_byte_big_endian_length_then_the_frame(self):
        receiver, transport = connected_receiver()
        receiver.sendFrame(b"abc")
        receiver.clock.advance(0)
        self.assertEqual(transport.value(), b"\x00\x00\x00\x03abc")

        transport.clear()
        receiver.sendFrame(b"z" * 70000)
        receiver.clock.advance(0)
        self.assertEqual(transport.value()[:4], b"\x00\x01\x11\x70")
        self.assertEqual(len(transport.value()), 4 + 70000)

        transport.clear()
        receiver.sendFrame(b"")
        receiver.clock.advance(0)
        self.assertEqual(transport.value(), b"\x00\x00\x00\x00")

    def test_frames_of_one_turn_are_written_together_at_its_end(self):
        receiver, transport = connected_receiver()
        for number in range(100):
            receiver.sendFrame(b"frame %d" % number)
        self.assertEqual(transport.value(), b"")
        receiver.clock.advance(0)
        parser, _ = connected_receiver()
        parser.dataReceived(transport.value())
        self.assertEqual(parser.frames, [b"frame %d" % number for number in range(100)])

    def test_a_large_backlog_is_written_without_waiting_for_the_turn_to_end(self):
        receiver, transport = connected_receiver()
        receiver.sendFrame(b"y" * WriteBuffer.FLUSH_BYTES)
        self.assertEqual(len(transport.value()), 4 + WriteBuffer.FLUSH_BYTES)
        self.assertEqual(receiver.clock.getDelayedCalls(), [])

    def test_close_after_flush_sends_queued_frames_first(self):
        receiver, transport = connected_receiver()
        receiver.sendFrame(b"goodbye")
        receiver.closeAfterFlush()
        self.assertEqual(transport.value(), b"\x00\x00\x00\x07goodbye")
        self.assertTrue(transport.disconnecting)

    def test_sent_frames_are_received_as_sent(self):
        sender, sent = connected_receiver()
        frames = [b"", b"one", b"\xff" * 1000, b"two"]
        for frame in frames:
            sender.sendFrame(frame)
        sender.clock.advance(0)
        receiver, _ = connected_receiver()
        for read in chunked(sent.value(), 7):
            receiver.dataReceived(read)
        self.assertEqual(receiver.frames, frames)
