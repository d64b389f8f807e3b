"""--connection-max (RabbitMQ's connection_max): a real broker process with a ceiling of two client connections
turns away a third, over AMQP (pika) and the native protocol alike, logs it, and takes the next one once a
connection closed; a bad value stops twistd with a one-line error."""

import subprocess
import tempfile

import pika
import pika.exceptions
import pytest
from twisted.internet import defer
from twisted.trial import unittest

from brokerd.native.client import ConnectionClosed, connect
from brokerd.testing import BrokerProcess, twistd_command
from tests.support.httpapi import amqp


@pytest.fixture()
def ceiling_of_two(tmp_path):
    process = BrokerProcess(["--backend=memory", "--native=none", "--connection-max=2"], cwd=tmp_path)
    yield process
    assert process.stop() == 0


def test_a_third_amqp_connection_is_turned_away_until_one_closes(ceiling_of_two):
    first, second = amqp(ceiling_of_two), amqp(ceiling_of_two)
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            amqp(ceiling_of_two)
        ceiling_of_two.wait_for_output(r"turned away: 2 connections are open \(--connection-max\)")
        first.channel().queue_declare("still-served")  # those inside are served as before
    finally:
        first.close()
    third = amqp(ceiling_of_two)  # the closed one's place
    third.close()
    second.close()


class NativeCeilingTests(unittest.TestCase):
    """The native protocol's connections count against the same ceiling as AMQP's."""

    timeout = 30

    @defer.inlineCallbacks
    def test_a_native_connection_past_the_ceiling_is_turned_away(self):
        from twisted.internet import reactor

        process = BrokerProcess(["--backend=memory", "--native=tcp:0:interface=127.0.0.1", "--connection-max=1"],
                                cwd=tempfile.mkdtemp(prefix="connection-max-"))
        self.addCleanup(process.stop)
        held = amqp(process)
        try:
            with self.assertRaises(ConnectionClosed):
                yield connect(reactor, process.wait_listening("native protocol"))
        finally:
            held.close()
        client = yield connect(reactor, process.wait_listening("native protocol"))
        yield client.close()


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_connection_max_is_a_one_line_error(tmp_path, value):
    result = subprocess.run([*twistd_command(), "-n", "brokerd", f"--connection-max={value}"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"twistd brokerd: --connection-max: {value!r} is neither infinity nor a number of connections")
