"""connection.update-secret, as pika and aiormq send it to refresh credentials.

The new secret is checked as the password of the user who logged in (the
users file is re-read, so a password an operator rotated is the one that
passes). A secret that is not that password closes the connection with the
reply RabbitMQ 3.10 sends when an authentication backend refuses a new
secret: 530 "NOT_ALLOWED - New secret was refused by one of the backends",
naming connection.update-secret (10, 70).
"""

import asyncio

import aiormq
import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from tests.support.client_broker import bystander, checked_for_tracebacks, pika_round_trip, start_broker

pytestmark = pytest.mark.usefixtures("no_broker_tracebacks")

REFUSED = "NOT_ALLOWED - New secret was refused by one of the backends"
STEP_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    """The users file of the module's broker: alice/first (rotated by a test) and guest/guest."""
    directory = tmp_path_factory.mktemp("update-secret")
    path = directory / "users"
    path.write_text("alice:first\nguest:guest\n")
    return path


@pytest.fixture(scope="module")
def broker(users):
    running = start_broker(users.parent, "--users", str(users))
    with checked_for_tracebacks(running):
        yield running
    running.process.stop()


def pika_connection(broker, username, password):
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            host=broker.host,
            port=broker.amqp_port,
            credentials=pika.PlainCredentials(username, password),
            connection_attempts=1,
            socket_timeout=5,
            blocked_connection_timeout=5,
        )
    )


def test_pika_update_secret_with_the_users_password_is_answered_and_the_connection_goes_on(broker):
    connection = pika_connection(broker, "guest", "guest")
    try:
        connection.update_secret("guest", "token refresh")
        assert connection.is_open
        pika_round_trip(connection)
    finally:
        connection.close()


def test_pika_update_secret_takes_the_password_an_operator_rotated(broker, users):
    connection = pika_connection(broker, "alice", "first")
    try:
        users.write_text("alice:second\nguest:guest\n")
        connection.update_secret("second", "rotated")
        pika_round_trip(connection)
        with pytest.raises(ConnectionClosedByBroker) as closed:
            connection.update_secret("first", "the old one")
        assert (closed.value.reply_code, closed.value.reply_text) == (530, REFUSED)
    finally:
        users.write_text("alice:first\nguest:guest\n")
        if connection.is_open:
            connection.close()


def test_pika_update_secret_with_a_wrong_secret_closes_only_that_connection_with_530(broker):
    with bystander(broker):
        connection = pika_connection(broker, "guest", "guest")
        with pytest.raises(ConnectionClosedByBroker) as closed:
            connection.update_secret("not the password", "refresh")
        assert (closed.value.reply_code, closed.value.reply_text) == (530, REFUSED)
        assert connection.is_closed


async def _aiormq_update_secret(url, secret):
    connection = await asyncio.wait_for(aiormq.connect(url), STEP_TIMEOUT)
    try:
        return await connection.update_secret(secret, reason="refresh", timeout=STEP_TIMEOUT)
    finally:
        await connection.close()


def test_aiormq_update_secret_is_answered_update_secret_ok(broker):
    reply = asyncio.run(_aiormq_update_secret(broker.amqp_url, "guest"))
    assert isinstance(reply, aiormq.spec.Connection.UpdateSecretOk)


def test_aiormq_update_secret_with_a_wrong_secret_is_530(broker):
    with pytest.raises(aiormq.exceptions.ConnectionNotAllowed) as closed:
        asyncio.run(_aiormq_update_secret(broker.amqp_url, "wrong"))
    assert REFUSED.split(" - ")[1] in str(closed.value)
