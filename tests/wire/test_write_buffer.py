"""The shared end-of-turn write buffer on a task.Clock over a StringTransport:
one write per turn, an early write past FLUSH_BYTES, what is written while the
transport has paused us counted against the watermark until it drains, and
nothing left behind when the connection goes."""

from twisted.internet import task
from twisted.internet.testing import StringTransport

from brokerd.model.watermark import MemoryWatermark
from brokerd.wire.backpressure import HeldBytes
from brokerd.wire.write_buffer import WriteBuffer


class CountingTransport(StringTransport):
    """Counts the writes it is given."""

    writes = 0

    def write(self, data):
        self.writes += 1
        super().write(data)


def connected_buffer():
    clock = task.Clock()
    watermark = MemoryWatermark(high=1 << 30)
    writes = WriteBuffer(clock, HeldBytes(watermark))
    writes.transport = CountingTransport()
    return writes, clock, watermark


def test_pieces_of_one_turn_go_out_in_one_write_at_its_end():
    writes, clock, _ = connected_buffer()
    writes.send(b"one ")
    writes.send_pieces([b"two ", memoryview(b"three ")], 10)
    writes.send_frame(b"four")
    assert not writes.idle
    assert writes.transport.value() == b""
    clock.advance(0)
    assert writes.transport.value() == b"one two three \x00\x00\x00\x04four"
    assert writes.transport.writes == 1
    assert writes.idle
    assert clock.getDelayedCalls() == []


def test_a_turn_past_flush_bytes_is_written_at_once():
    writes, clock, _ = connected_buffer()
    writes.send_pieces([b"x" * WriteBuffer.FLUSH_BYTES], WriteBuffer.FLUSH_BYTES)
    assert len(writes.transport.value()) == WriteBuffer.FLUSH_BYTES
    assert clock.getDelayedCalls() == []


def test_what_is_written_while_paused_is_held_until_the_transport_drains():
    writes, clock, watermark = connected_buffer()
    writes.send(b"before")
    clock.advance(0)
    writes.pause()
    writes.send(b"while paused")
    clock.advance(0)
    assert watermark.queued_bytes == len(b"while paused")
    writes.resume()
    assert watermark.queued_bytes == 0
    writes.send(b"after")
    clock.advance(0)
    assert watermark.queued_bytes == 0


def test_flush_and_close_sends_what_is_queued_then_closes():
    writes, clock, _ = connected_buffer()
    writes.send(b"goodbye")
    writes.flush_and_close()
    assert writes.transport.value() == b"goodbye"
    assert writes.transport.disconnecting
    assert clock.getDelayedCalls() == []


def test_write_now_goes_out_at_once_and_stamps_the_time():
    writes, clock, _ = connected_buffer()
    clock.advance(7)
    writes.write_now(b"ping")
    assert writes.transport.value() == b"ping"
    assert writes.written_at == 7


def test_a_lost_connection_drops_what_was_queued_and_releases_what_was_held():
    writes, clock, watermark = connected_buffer()
    writes.pause()
    writes.send(b"unread")
    clock.advance(0)
    writes.send(b"never sent")
    writes.connection_lost()
    assert watermark.queued_bytes == 0
    assert clock.getDelayedCalls() == []
    assert writes.idle
    assert writes.transport.value() == b"unread"
