"""``python -m brokerd.native`` as a user runs it: exit statuses and one-line errors, never a traceback.

One broker subprocess (memory store) serves the whole module; each test uses its own names.
"""

import signal
import subprocess
import sys

import pika
import pytest
from pika.exceptions import UnroutableError

from brokerd.testing import BrokerProcess, native_cli
from brokerd.wire.endpoints import tls_installed
from tests.support.client_broker import RunningBroker
from tests.support.pika_clients import consumer_count, message_count, pump

MISSING_EXCHANGE = b"404 NOT_FOUND - no exchange 'missing' in vhost '/'"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """The module's broker; the tests set up and check through pika, which starts faster than the CLI."""
    process = BrokerProcess(["--backend=memory", "--native", "tcp:0:interface=127.0.0.1"],
                            cwd=tmp_path_factory.mktemp("cli"))
    running = RunningBroker(process)
    connection = pika.BlockingConnection(pika.URLParameters(running.amqp_url))
    running.channel = connection.channel()
    running.channel.confirm_delivery()
    yield running
    connection.close()
    process.stop()


def assert_one_line_error(result, text):
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.count(b"\n") == 1, result.stderr
    assert text in result.stderr
    assert b"Traceback" not in result.stderr


def test_bind_and_unbind_exit_0_silently_and_take_effect(broker):
    channel = broker.channel
    channel.queue_declare("cli-bound")
    bound = native_cli(broker.native_endpoint, "bind", "cli-bound", "amq.direct", "--routing-key", "cli-key")
    assert (bound.returncode, bound.stdout, bound.stderr) == (0, b"", b"")
    channel.basic_publish("amq.direct", "cli-key", b"routed", mandatory=True)  # raises if unroutable
    unbound = native_cli(broker.native_endpoint, "unbind", "cli-bound", "amq.direct", "--routing-key", "cli-key")
    assert (unbound.returncode, unbound.stdout, unbound.stderr) == (0, b"", b"")
    with pytest.raises(UnroutableError):
        channel.basic_publish("amq.direct", "cli-key", b"dropped", mandatory=True)


@pytest.mark.parametrize("confirm", [["--confirm"], []], ids=["confirmed", "unconfirmed"])
def test_publishing_to_a_missing_exchange_reports_the_brokers_404(broker, confirm):
    result = native_cli(broker.native_endpoint, "publish", "--exchange", "missing", *confirm, "lost")
    assert_one_line_error(result, MISSING_EXCHANGE)


@pytest.mark.parametrize(
    "connect, complaint",
    [
        ("bogus", b"--connect: 'bogus' is not a valid endpoint: Unknown endpoint type: 'bogus'"),
        ("tcp:127.0.0.1:1", b"cannot connect to tcp:127.0.0.1:1: Connection was refused"),
        pytest.param("ssl:127.0.0.1:1", b"TLS support is not installed",
                     marks=pytest.mark.skipif(tls_installed(), reason="TLS support is installed here")),
    ],
)
def test_a_bad_or_unreachable_endpoint_is_one_line(connect, complaint):
    assert_one_line_error(native_cli(connect, "get", "anything"), complaint)


def test_a_consumer_whose_queue_is_deleted_exits_1(broker):
    channel = broker.channel
    channel.queue_declare("cli-doomed")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "brokerd.native", "--connect", broker.native_endpoint, "consume", "cli-doomed"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        pump(broker.channel.connection, lambda: consumer_count(channel, "cli-doomed") == 1, "the CLI consumer",
             timeout=30)
        channel.queue_delete("cli-doomed")
        _, stderr = consumer.communicate(timeout=30)
    finally:
        consumer.kill()
    assert consumer.returncode == 1
    assert stderr == b"error: the broker cancelled the consumer of queue 'cli-doomed' (the queue was deleted)\n"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_consumer_stopped_by_the_user_cancels_and_exits_0_quietly(broker, stop):
    queue = f"cli-stopped-{stop.name}"
    channel = broker.channel
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"taken")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "brokerd.native", "--connect", broker.native_endpoint, "consume", queue],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        pump(broker.channel.connection, lambda: consumer_count(channel, queue) == 1, "the CLI consumer", timeout=30)
        pump(broker.channel.connection, lambda: message_count(channel, queue) == 0, "the CLI's ack", timeout=10)
        consumer.send_signal(stop)
        consumer.send_signal(stop)  # an impatient second one changes nothing
        stdout, stderr = consumer.communicate(timeout=30)
    finally:
        consumer.kill()
    assert (consumer.returncode, stdout, stderr) == (0, b"taken\n", b"")
    assert consumer_count(channel, queue) == 0
