"""Back-pressure over real sockets: a consumer that stops reading holds its
deliveries back, the backlog crosses the memory watermark, and the broker
stops reading from the publisher (telling it with connection.blocked) until
the consumer catches up; then every message arrives."""

import select
import time

import pytest
from pamqp import commands

from tests.support.client_broker import start_broker
from tests.support.rawamqp import RawAmqp, publish_frames

MESSAGES = 20000
BODY = b"b" * 1024


@pytest.fixture
def small_watermark_broker(tmp_path):
    running = start_broker(tmp_path, "--memory-high-watermark", "256K")
    yield running
    running.process.stop()


def push_until_stalled(publisher, data, sent=0, stall_seconds=1.0, deadline_seconds=60.0):
    """Send C{data} from offset C{sent} without blocking until the broker stops
    taking it; returns how far it got and every frame read meanwhile."""
    sock = publisher.sock
    sock.setblocking(False)
    frames = []
    deadline = time.monotonic() + deadline_seconds
    view = memoryview(data)
    while sent < len(data) and time.monotonic() < deadline:
        readable, writable, _ = select.select([sock], [sock], [], stall_seconds)
        if readable:
            frames.extend(frame for _, frame in publisher.read_available())
        if writable:
            try:
                sent += sock.send(view[sent : sent + 65536])
            except BlockingIOError:
                pass
        elif not readable:
            break  # neither readable nor writable for stall_seconds: the broker stopped reading
    sock.setblocking(True)
    return sent, frames


def test_slow_consumer_blocks_the_publisher_and_nothing_is_lost(small_watermark_broker):
    host, port = small_watermark_broker.host, small_watermark_broker.amqp_port
    consumer = RawAmqp(host, port, timeout=10.0, receive_buffer=4096)
    consumer.handshake()
    consumer.open_channel()
    consumer.send_method(1, commands.Queue.Declare(queue="backpressure"))
    consumer.wait_for(commands.Queue.DeclareOk)
    consumer.send_method(1, commands.Basic.Consume(queue="backpressure", consumer_tag="slow"))
    consumer.wait_for(commands.Basic.ConsumeOk)

    publisher = RawAmqp(host, port, timeout=10.0)
    publisher.handshake()
    publisher.open_channel()
    data = b"".join(publish_frames(1, "backpressure", BODY) for _ in range(MESSAGES))

    sent, frames = push_until_stalled(publisher, data)
    assert any(isinstance(frame, commands.Connection.Blocked) for frame in frames), frames
    assert sent < len(data), "the broker read everything: it never stopped reading from the publisher"

    # The consumer catches up, acking as it goes; the publisher is unblocked and finishes.
    received = 0
    unblocked = False
    while received < MESSAGES:
        _, value = consumer.read_frame()
        if not isinstance(value, commands.Basic.Deliver):
            continue
        received += 1
        if received % 100 == 0 or received == MESSAGES:
            consumer.send_method(1, commands.Basic.Ack(delivery_tag=value.delivery_tag, multiple=True))
            if sent < len(data):
                sent, frames = push_until_stalled(publisher, data, sent, stall_seconds=0.001, deadline_seconds=0.01)
                unblocked = unblocked or any(isinstance(frame, commands.Connection.Unblocked) for frame in frames)
    assert sent == len(data)
    assert received == MESSAGES
    if not unblocked:
        unblocked = any(isinstance(frame, commands.Connection.Unblocked) for _, frame in publisher.read_available())
    assert unblocked

    # Nothing is left over, and both connections still work.
    consumer.send_method(1, commands.Queue.Declare(queue="backpressure", passive=True))
    _, declared = consumer.wait_for(commands.Queue.DeclareOk)
    assert declared.message_count == 0
    consumer.close()
    publisher.close()
