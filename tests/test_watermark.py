"""The memory watermark: queues count the body bytes they hold, and the broker
is blocked from above the high mark until back under the low mark. (Gating
real publishers is tested over sockets in tests/interop/test_backpressure.py.)"""

from backends.memory import MemoryStore
from brokerd.model.broker import Broker
from brokerd.model.watermark import MemoryWatermark
from tests.support import open_channel, publish


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
