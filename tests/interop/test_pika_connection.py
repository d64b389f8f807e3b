"""pika's BlockingConnection against a real broker: heartbeats negotiated and
taken (their timing is driven on a clock in tests/amqp/test_heartbeats.py),
refused logins and virtual hosts, and errors that stay on their own channel."""

import time

import pika
import pytest

from tests.support.pika_clients import closed_by_broker, get_bodies, message_count
from tests.support.rawamqp import TIMEOUT

pytestmark = pytest.mark.usefixtures("watchdog")


# -- heartbeats (the timing rules are driven on a clock in tests/amqp/test_heartbeats.py)


def test_pika_negotiates_heartbeats_and_takes_the_brokers(connect, own_broker, name):
    broker = own_broker("--heartbeat", "1")
    connection = connect(broker, heartbeat=1)
    assert connection._impl.params.heartbeat == 1
    checker = connection._impl._heartbeat_checker
    assert checker is not None
    deadline = time.monotonic() + TIMEOUT
    while checker._heartbeat_frames_received < 1:  # the broker's first comes half an interval after tune-ok
        assert time.monotonic() < deadline, "the broker sent no heartbeat on an idle connection"
        connection.process_data_events(time_limit=0.05)
    assert connection.is_open

    channel = connection.channel()
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"still alive")
    assert get_bodies(channel, queue) == [b"still alive"]
    assert not [line for line in broker.process.output if "missed heartbeats" in line]


def test_broker_heartbeat_is_offered_to_the_client(connect, own_broker):
    """With heartbeat=None pika takes whatever the broker proposes in connection.tune."""
    broker = own_broker("--heartbeat", "7")
    connection = connect(broker, heartbeat=None)
    assert connection._impl.params.heartbeat == 7


def test_client_may_turn_heartbeats_off(connect, own_broker, name):
    broker = own_broker("--heartbeat", "1")
    connection = connect(broker, heartbeat=0)
    assert connection._impl.params.heartbeat == 0
    assert connection._impl._heartbeat_checker is None
    channel = connection.channel()
    queue = name()
    channel.queue_declare(queue)
    assert message_count(channel, queue) == 0
    assert not [line for line in broker.process.output if "missed heartbeats" in line]


# -- logging in


def test_wrong_password_is_refused(amqp_broker):
    parameters = pika.ConnectionParameters(
        host=amqp_broker.host,
        port=amqp_broker.amqp_port,
        credentials=pika.PlainCredentials("guest", "not the password"),
        connection_attempts=1,
    )
    # pika names a connection.close received during start/start-ok a "probable" authentication error.
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as raised:
        pika.BlockingConnection(parameters)
    assert "(403) \"ACCESS_REFUSED - PLAIN login refused: user 'guest' - invalid credentials\"" in str(raised.value)


def test_unknown_virtual_host_is_refused(amqp_broker):
    parameters = pika.ConnectionParameters(
        host=amqp_broker.host,
        port=amqp_broker.amqp_port,
        virtual_host="no-such-vhost",
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
    )
    # pika names a connection.close in answer to connection.open a "probable" access-denied error.
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as raised:
        pika.BlockingConnection(parameters)
    assert "(530)" in str(raised.value) and "NOT_ALLOWED - vhost no-such-vhost not found" in str(raised.value)


# -- errors stay where they happen


def test_channel_error_leaves_other_channels_and_connections_working(connect, name):
    first, second = connect(), connect()
    queue = name()
    healthy = first.channel()
    healthy.queue_declare(queue)
    failing = first.channel()
    other = second.channel()

    error = closed_by_broker(failing.queue_declare, name("missing"), passive=True)
    assert error.reply_code == 404
    assert failing.is_closed
    assert first.is_open and healthy.is_open

    healthy.basic_publish("", queue, b"from the healthy channel")
    assert message_count(other, queue) == 1
    other.basic_publish("", queue, b"from the other connection")
    assert get_bodies(healthy, queue) == [b"from the healthy channel", b"from the other connection"]

    reopened = first.channel()
    reopened.queue_declare(queue, passive=True)
    assert first.is_open and second.is_open


def test_many_channels_on_one_connection(connection, name):
    queue = name()
    channels = [connection.channel() for _ in range(20)]
    channels[0].queue_declare(queue)
    for number, channel in enumerate(channels):
        channel.basic_publish("", queue, b"%d" % number)
    assert get_bodies(channels[-1], queue) == [b"%d" % number for number in range(20)]
    for channel in channels:
        channel.close()
    assert connection.is_open
