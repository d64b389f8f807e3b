"""The memory watermark: queues count the body bytes they hold, and the broker
is blocked from above the high mark until back under the low mark. (Gating
real publishers is tested over sockets in tests/interop/test_backpressure.py.)"""

from backends.memory import MemoryStore
from brokerd.model.broker import Broker
from brokerd.model.watermark import MemoryWatermark
from brokerd.process.memory_trim import FreedMemory, _malloc_trim
from tests.support.broker import open_channel, publish


def small_broker(clock, high=1000):
    watermark = MemoryWatermark(high=high, low=500)
    return Broker(MemoryStore(), clock, watermark=watermark), watermark


def test_queued_bytes_follow_enqueue_ack_and_block_past_the_high_mark(clock):
    broker, watermark = small_broker(clock)
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", *[b"x" * 100] * 10)
    assert watermark.queued_bytes == 1000
    assert not watermark.blocked  # at the mark is not above it
    publish(channel, "q", b"x")
    assert watermark.blocked

    channel.basic_consume("q", "c")
    clock.advance(0)
    assert len(peer.deliveries) == 11
    assert watermark.queued_bytes == 1001  # delivered but un-acked bodies are still held
    channel.basic_ack(5, multiple=True)
    assert watermark.queued_bytes == 501 and watermark.blocked
    channel.basic_ack(6)
    assert watermark.queued_bytes == 401 and not watermark.blocked


def test_purge_delete_and_no_ack_delivery_release_their_bytes(clock):
    broker, watermark = small_broker(clock)
    channel, _ = open_channel(broker)
    for name in ("purged", "deleted", "consumed"):
        channel.queue_declare(name)
        publish(channel, name, b"a" * 10, b"b" * 20)
    assert watermark.queued_bytes == 90
    assert channel.queue_purge("purged") == 2
    assert watermark.queued_bytes == 60
    channel.queue_delete("deleted")
    assert watermark.queued_bytes == 30
    channel.basic_consume("consumed", "c", no_ack=True)
    clock.advance(0)
    assert watermark.queued_bytes == 0


def test_unacked_messages_of_a_deleted_queue_are_released_when_settled(clock):
    broker, watermark = small_broker(clock)
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"a" * 10, b"b" * 10)
    channel.basic_consume("q", "c")
    clock.advance(0)
    other, _ = open_channel(broker, 2)
    other.queue_delete("q")
    assert watermark.queued_bytes == 20
    channel.basic_ack(1)
    channel.basic_reject(2, requeue=True)  # the queue is gone: nothing to requeue into
    assert watermark.queued_bytes == 0


def test_uncommitted_publishes_count_once_until_commit_rollback_or_close(clock):
    broker, watermark = small_broker(clock, high=10_000)
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.tx_select()
    publish(channel, "q", b"a" * 100, b"b" * 200)
    assert watermark.queued_bytes == 300  # held by the transaction, not yet by the queue
    channel.tx_commit()
    assert watermark.queued_bytes == 300  # now held by the queue, and only by it
    publish(channel, "q", b"c" * 50)
    assert watermark.queued_bytes == 350
    channel.tx_rollback()
    assert watermark.queued_bytes == 300
    publish(channel, "q", b"d" * 70)
    broker_connection = channel.connection
    broker_connection.close()  # an open transaction dies with its channel
    assert watermark.queued_bytes == 300
    assert broker.vhost("/").queues["q"].message_count == 2


def test_a_transaction_past_the_high_mark_blocks(clock):
    broker, watermark = small_broker(clock)
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.tx_select()
    publish(channel, "q", *[b"x" * 600] * 2)
    assert watermark.blocked
    channel.tx_rollback()
    assert not watermark.blocked and watermark.queued_bytes == 0


def test_reading_pauses_compose_their_reasons():
    from twisted.internet.testing import StringTransport

    from brokerd.wire.backpressure import BROKER_BLOCKED, SLOW_READER, reading_pauses

    transport = StringTransport()
    pauses = reading_pauses(transport)
    assert reading_pauses(transport) is pauses  # one per transport, shared by all who pause it
    resumed = []
    pauses.on_resume = lambda: resumed.append(True)
    pauses.pause(SLOW_READER)
    pauses.pause(BROKER_BLOCKED)
    assert transport.producerState == "paused"
    pauses.resume(BROKER_BLOCKED)
    assert transport.producerState == "paused" and not resumed  # the client still does not read
    pauses.resume(BROKER_BLOCKED)  # lifting a reason twice changes nothing
    pauses.resume(SLOW_READER)
    assert transport.producerState == "producing" and resumed == [True]


def test_partial_frames_count_until_complete_or_cleared():
    from brokerd.wire.read_buffer import ReadBuffer

    watermark = MemoryWatermark(high=1000, low=500)
    buffer = ReadBuffer(watermark)
    assert buffer.add(b"12345") == (b"12345", 0)
    buffer.keep(b"12345", 1, needed=10)  # 4 of a 10-byte frame kept
    assert watermark.queued_bytes == 4
    assert buffer.add(b"abc") is None
    assert watermark.queued_bytes == 7
    assert buffer.add(b"XYZ!") == (b"2345abcXYZ!", 0)
    assert watermark.queued_bytes == 0
    buffer.keep(b"0123456789", 2, needed=100)
    assert watermark.queued_bytes == 8
    buffer.clear()
    buffer.clear()
    assert watermark.queued_bytes == 0


def test_only_a_large_partial_frame_blocks_its_connection(clock):
    """While the broker is blocked, a consumer whose small frame (an ack) was split across
    two reads is still read (its acks free memory); one part-way through a large frame is not."""
    import struct

    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    from brokerd.native.server import NativeServerFactory
    from brokerd.wire.backpressure import LARGE_PARTIAL_FRAME
    from tests.support.broker import native_hello

    broker, watermark = small_broker(clock)
    connections = []
    for _ in range(2):
        protocol = NativeServerFactory(broker).buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))  # guest logs in from loopback
        protocol.makeConnection(transport)
        protocol.dataReceived(native_hello())
        connections.append((protocol, transport))
    watermark.add(2000)
    assert watermark.blocked
    (consumer, consumer_transport), (publisher, publisher_transport) = connections
    consumer.dataReceived(struct.pack(">I", 30) + b"\x08")
    assert consumer_transport.producerState == "producing"
    publisher.dataReceived(struct.pack(">I", 2 * LARGE_PARTIAL_FRAME) + b"p" * LARGE_PARTIAL_FRAME)
    assert publisher_transport.producerState == "paused"
    watermark.release(2000)
    assert watermark.blocked  # the partial frames are still held
    publisher.connectionLost(None)
    assert not watermark.blocked
    consumer.connectionLost(None)
    assert watermark.queued_bytes == 0


def test_freed_memory_goes_back_to_the_system_once_after_each_unblock(clock):
    """The end of a burst returns the heap's free pages (glibc's malloc_trim), after the
    turn that released the bytes, once however many releases that turn made."""
    trims = []
    freed = FreedMemory(clock, trim=trims.append)
    watermark = MemoryWatermark(high=1000, low=500, on_unblocked=freed.give_back_soon)
    watermark.add(1001)
    watermark.release(100)
    clock.advance(0)
    assert trims == []  # still blocked: nothing was given back
    watermark.release(401)
    freed.give_back_soon()
    assert trims == []  # not within the turn, while what it releases may still be referenced
    clock.advance(0)
    assert trims == [0]
    watermark.add(400)
    watermark.release(400)
    clock.advance(0)
    assert trims == [0]  # no burst past the watermark, no trim


def test_malloc_trim_is_found_in_this_c_library():
    """On glibc (this machine, CI) the broker can return freed pages at all."""
    assert _malloc_trim()(0) in (0, 1)
