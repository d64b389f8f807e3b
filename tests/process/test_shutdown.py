"""SIGTERM as a client sees it: RabbitMQ's 320 close, nothing confirmed lost, exit status 0, reconnection.

Each test stops a broker of its own (chunked store, so what was confirmed must
come back after a restart on the same data directory and port).
"""

import asyncio
import contextlib
import signal
import subprocess
import sys

import aio_pika
import pika
import pytest
from pika.exceptions import AMQPError, ConnectionClosedByBroker

from brokerd.testing import BrokerProcess
from tests.support.aio_pika_clients import step
from tests.support.client_broker import RunningBroker
from tests.support.pika_clients import consumer_count, pump

SHUTDOWN_TEXT = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"  # RabbitMQ 3.10's
CONFIRMED_BEFORE_SIGTERM = 20
BURST = 500  # publishes in flight when the signal comes


def start(data_dir, amqp_port=0):
    process = BrokerProcess(
        ["--backend=chunked", "--data-dir", str(data_dir), "--native", "tcp:0:interface=127.0.0.1",
         "--amqp", f"tcp:{amqp_port}:interface=127.0.0.1"],
        cwd=data_dir,
    )
    try:
        return RunningBroker(process)
    except BaseException:
        process.kill()
        raise


@pytest.fixture
def brokers(tmp_path):
    """Starts brokers on C{tmp_path}; kills any still running at the end."""
    started = []

    def start_one(amqp_port=0):
        started.append(start(tmp_path, amqp_port))
        return started[-1]

    yield start_one
    for broker in started:
        broker.process.kill()


def test_sigterm_closes_a_pika_publisher_with_320_and_keeps_every_confirmed_message(brokers):
    broker = brokers()
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("shutdown-pika", durable=True)
    channel.queue_declare("shutdown-native")
    native_consumer = subprocess.Popen(
        [sys.executable, "-m", "brokerd.native", "--connect", broker.native_endpoint, "consume", "shutdown-native"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    pump(connection, lambda: consumer_count(channel, "shutdown-native") == 1, "the native consumer", timeout=30)
    idle = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))  # never answers the close: shutdown waits
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    confirmed = []
    with pytest.raises(ConnectionClosedByBroker) as closed:
        for number in range(100_000):
            if len(confirmed) == CONFIRMED_BEFORE_SIGTERM:
                broker.process.process.send_signal(signal.SIGTERM)
            body = b"%d" % number
            channel.basic_publish("", "shutdown-pika", body, persistent)  # returns once confirmed
            confirmed.append(body)
    assert (closed.value.reply_code, closed.value.reply_text) == (320, SHUTDOWN_TEXT)
    broker.process.process.send_signal(signal.SIGTERM)  # again, while the broker waits for the idle client
    # The native protocol's client gets the same reason in its connection_close.
    _, native_error = native_consumer.communicate(timeout=30)
    assert native_error.decode() == f"error: 320 {SHUTDOWN_TEXT}\n"
    assert broker.process.process.wait(30) == 0
    assert not any("Traceback" in line for line in broker.process.output)
    assert any("already shutting down; signal SIGTERM ignored" in line for line in broker.process.output)
    with contextlib.suppress(AMQPError):
        idle.close()  # it learns of the 320 only now

    restarted = brokers()
    connection = pika.BlockingConnection(pika.URLParameters(restarted.amqp_url))
    channel = connection.channel()
    stored = []
    while (got := channel.basic_get("shutdown-pika", auto_ack=True))[0] is not None:
        stored.append(got[2])
    connection.close()
    assert stored[: len(confirmed)] == confirmed


def test_publishes_in_flight_at_sigterm_are_confirmed_and_a_robust_aio_pika_connection_reconnects(brokers):
    broker = brokers()

    async def scenario():
        connection = await step(
            aio_pika.connect_robust(broker.amqp_url, reconnect_interval=0.1), "connecting (robust)"
        )
        reconnected = asyncio.Event()
        connection.reconnect_callbacks.add(lambda *_: reconnected.set())
        channel = await connection.channel()
        await channel.declare_queue("shutdown-aio-pika", durable=True)
        persistent = aio_pika.DeliveryMode.PERSISTENT
        publishes = [
            asyncio.ensure_future(channel.default_exchange.publish(
                aio_pika.Message(b"%d" % number, delivery_mode=persistent), "shutdown-aio-pika"))
            for number in range(BURST)
        ]
        await step(publishes[0], "the first confirm")
        broker.process.process.send_signal(signal.SIGTERM)
        outcomes = await step(asyncio.gather(*publishes, return_exceptions=True), "every publish settled")
        confirmed = sum(not isinstance(outcome, BaseException) for outcome in outcomes)
        status = await asyncio.get_running_loop().run_in_executor(None, broker.process.process.wait, 30)
        brokers(broker.amqp_port)
        await step(reconnected.wait(), "the robust connection reconnecting")
        channel = await connection.channel()
        queue = await channel.declare_queue("shutdown-aio-pika", durable=True)
        stored = queue.declaration_result.message_count
        await connection.close()
        return status, confirmed, stored

    status, confirmed, stored = asyncio.run(scenario())
    assert status == 0
    # What was read before the signal is committed and confirmed before the close; nothing stored goes unconfirmed.
    assert 0 < confirmed and stored == confirmed
