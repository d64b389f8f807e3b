"""connection.update-secret, as pika and aiormq send it to refresh credentials.

RabbitMQ 3.10's internal users backend keeps nothing that can expire, so it
answers update-secret-ok to any new secret (checked on the reference node with
pika: a random secret and an empty one, the connection going on); brokerd
answers the same.
"""

import asyncio
import secrets

import aiormq
import pika
import pytest

from tests.support.client_broker import bystander, checked_for_tracebacks, pika_round_trip, start_broker

pytestmark = pytest.mark.usefixtures("no_broker_tracebacks")

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


def test_pika_update_secret_with_a_new_random_secret_is_answered_and_the_connection_goes_on(broker):
    # RabbitMQ 3.10.8 (internal users) answers update-secret-ok to a random new secret
    # and to an empty one, and the connection goes on serving: the same is expected here.
    with bystander(broker):
        connection = pika_connection(broker, "alice", "first")
        try:
            connection.update_secret(secrets.token_hex(16), "token refresh")
            assert connection.is_open
            pika_round_trip(connection)
            connection.update_secret("", "an empty one")
            pika_round_trip(connection)
        finally:
            connection.close()


async def _aiormq_update_secret(url, secret):
    connection = await asyncio.wait_for(aiormq.connect(url), STEP_TIMEOUT)
    try:
        return await connection.update_secret(secret, reason="refresh", timeout=STEP_TIMEOUT)
    finally:
        await connection.close()


def test_aiormq_update_secret_is_answered_update_secret_ok(broker):
    reply = asyncio.run(_aiormq_update_secret(broker.amqp_url, "guest"))
    assert isinstance(reply, aiormq.spec.Connection.UpdateSecretOk)


def test_aiormq_update_secret_with_another_secret_is_answered_update_secret_ok(broker):
    reply = asyncio.run(_aiormq_update_secret(broker.amqp_url, "not guest's password"))
    assert isinstance(reply, aiormq.spec.Connection.UpdateSecretOk)
