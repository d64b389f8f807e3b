"""Delivery acknowledgement timeouts (RabbitMQ's consumer_timeout), with pika and the native
protocol against a broker whose timeout is one or two seconds.

A channel that holds a delivery un-acked past the timeout is closed with RabbitMQ 3.10's 406
and text (checked against RabbitMQ 3.10.8 with consumer_timeout set to 5000: a consumer's
channel and a basic.get's alike), and the message goes to another consumer flagged
redelivered; a consumer that acks in time keeps its channel. A queue's x-consumer-timeout
argument or consumer-timeout policy key overrides the broker's timeout, either way.
"""

import time
import uuid

import pika
import pytest

from brokerd.proto.native_pb2 import Envelope
from brokerd.testing import BrokerProcess
from tests.support.httpapi import Api
from tests.support.rawnative import RawNative

pytestmark = pytest.mark.long_module(seconds=20)  # started early (tests/conftest.py)

TIMEOUT_MS = 2000  # the broker's


def timed_out_text(channel, timeout):
    return (
        f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. Timeout value used:"
        f" {timeout} ms. This timeout value can be configured, see consumers doc guide to learn more"
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(
        ["--backend=memory", "--native", "tcp:0:interface=127.0.0.1", "--consumer-timeout", str(TIMEOUT_MS)],
        cwd=tmp_path_factory.mktemp("broker"),
    )
    yield process
    assert process.stop() == 0
    assert not any("Traceback" in line for line in process.output)


def connect(broker):
    host, port = broker.wait_address("AMQP")
    parameters = pika.ConnectionParameters(
        host, port, "/", pika.PlainCredentials("guest", "guest"), connection_attempts=1, socket_timeout=10
    )
    return pika.BlockingConnection(parameters)


def fresh_queue(broker, arguments=None, messages=1):
    """A new queue holding C{messages} messages; returns its name and their bodies."""
    name = f"timeout-{uuid.uuid4().hex[:8]}"
    bodies = [f"message {number} of {name}".encode() for number in range(messages)]
    with connect(broker) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(name, arguments=arguments)
        for body in bodies:
            channel.basic_publish("", name, body)
    return name, bodies


def consume_without_ack(broker, queue, limit=10):
    """A pika consumer that never acks: C{(seconds from its delivery to its channel's close, the close)}."""
    with connect(broker) as connection:
        channel = connection.channel()
        delivered = []
        channel.basic_consume(queue, lambda channel, method, properties, body: delivered.append(time.monotonic()))
        connection.call_later(limit, channel.stop_consuming)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.start_consuming()
        return time.monotonic() - delivered[0], closed.value


def take_back(broker, queue):
    """A second consumer's delivery from C{queue}: C{(redelivered, body)}."""
    with connect(broker) as connection:
        channel = connection.channel()
        for method, _, body in channel.consume(queue, inactivity_timeout=5):
            assert method is not None, "the message did not come back to another consumer"
            channel.basic_ack(method.delivery_tag)
            channel.cancel()
            return method.redelivered, body


def test_a_consumer_that_never_acks_has_its_channel_closed_and_the_message_goes_to_another(broker):
    queue, [body] = fresh_queue(broker)
    held, closed = consume_without_ack(broker, queue)
    assert (closed.reply_code, closed.reply_text) == (406, timed_out_text(1, TIMEOUT_MS))
    assert TIMEOUT_MS / 1000 <= held < 2 * TIMEOUT_MS / 1000, f"closed {held:.2f} s after the delivery"
    assert take_back(broker, queue) == (True, body)


def test_a_consumer_that_acks_in_time_keeps_its_channel(broker):
    """Six messages over three seconds (one and a half timeouts), each acked half a second after it came."""
    queue, bodies = fresh_queue(broker, messages=6)
    with connect(broker) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        acked = []

        def ack_later(channel, method, properties, body):
            def ack():
                channel.basic_ack(method.delivery_tag)
                acked.append(body)
                if len(acked) == len(bodies):
                    channel.stop_consuming()
            connection.call_later(0.5, ack)

        channel.basic_consume(queue, ack_later)
        connection.call_later(10, channel.stop_consuming)
        channel.start_consuming()
        assert acked == bodies
        assert channel.is_open
        assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_a_message_taken_with_get_and_never_acked_times_out_too(broker):
    """As RabbitMQ 3.10 does (its channel's un-acked deliveries include basic.get's)."""
    queue, [body] = fresh_queue(broker)
    with connect(broker) as connection:
        channel = connection.channel()
        method, _, got = channel.basic_get(queue)
        assert got == body
        # start_consuming waits on the channel (and raises its close) while it has a consumer:
        idle = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_consume(idle, lambda *delivery: None)
        connection.call_later(10, channel.stop_consuming)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.start_consuming()
    assert (closed.value.reply_code, closed.value.reply_text) == (406, timed_out_text(1, TIMEOUT_MS))
    assert take_back(broker, queue) == (True, body)


def test_a_queue_argument_sets_a_shorter_or_longer_timeout(broker):
    short, _ = fresh_queue(broker, {"x-consumer-timeout": 1000})
    held, closed = consume_without_ack(broker, short)
    assert closed.reply_text == timed_out_text(1, 1000)
    assert held < TIMEOUT_MS / 1000, f"closed {held:.2f} s after the delivery, not by the queue's 1 s"

    long, [body] = fresh_queue(broker, {"x-consumer-timeout": 60000})
    with connect(broker) as connection:
        channel = connection.channel()
        method, _, got = channel.basic_get(long)
        connection.sleep(2 * TIMEOUT_MS / 1000)  # past the broker's timeout, well within the queue's
        assert channel.is_open
        channel.basic_ack(method.delivery_tag)


def test_a_policy_sets_a_queue_timeout(broker):
    api = Api(broker.wait_listening("HTTP API"))
    pattern = f"^policy-timeout-{uuid.uuid4().hex[:8]}$"
    policy = {"pattern": pattern, "definition": {"consumer-timeout": 1000}}
    status, _ = api.put("/api/policies/%2F/short-timeout", policy)
    assert status in (201, 204)
    try:
        queue = pattern.strip("^$")
        with connect(broker) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare(queue)
            channel.basic_publish("", queue, b"under a policy")
        held, closed = consume_without_ack(broker, queue)
        assert closed.reply_text == timed_out_text(1, 1000)
    finally:
        api.delete("/api/policies/%2F/short-timeout")


def test_a_native_consumer_that_never_acks_has_its_channel_closed(broker):
    queue, [body] = fresh_queue(broker)
    with RawNative(broker.wait_listening("native protocol")) as client:
        client.hello()
        client.open_channel(1)
        consume = Envelope(channel=1)
        consume.basic_consume.queue = queue
        consume.basic_consume.consumer_tag = "never-acks"
        client.send(consume)
        deadline = time.monotonic() + 10
        kinds = []
        while not kinds or kinds[-1] != "channel_close":
            envelope = client.read(deadline)
            kinds.append(envelope.WhichOneof("payload"))
        assert "basic_deliver" in kinds
        close = envelope.channel_close
        assert (close.reply_code, close.reply_text) == (406, timed_out_text(1, TIMEOUT_MS))
    assert take_back(broker, queue) == (True, body)
