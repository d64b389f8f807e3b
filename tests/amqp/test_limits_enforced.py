"""Vhost and user limits set over the HTTP API hold against pika on a real broker, refused with the codes and texts
a RabbitMQ 3.10.8 node sends: a vhost's max-connections and a user's max-connections close the connection.open with
530, a user's max-channels closes the connection at channel.open with 530, a vhost's max-queues closes the
queue.declare's channel with 406 (a queue that exists may be declared again); a negative limit is none, 0 allows
none, and clearing a limit lifts it at once."""

import contextlib

import pika
import pika.exceptions
import pytest

from tests.support.httpapi import amqp, api, broker  # noqa: F401 (api, broker: the module's fixtures)


@pytest.fixture(scope="module")
def tenant(api):
    """A vhost and a user with every permission on it, and no limits to start with."""
    assert api.put("/api/vhosts/tenant", {}) == (201, None)
    assert api.put("/api/users/worker", {"password": "pw", "tags": ""}) == (201, None)
    assert api.put("/api/permissions/tenant/worker", {"configure": ".*", "write": ".*", "read": ".*"}) == (201, None)
    assert api.put("/api/permissions/tenant/guest", {"configure": ".*", "write": ".*", "read": ".*"}) == (201, None)
    return "tenant"


@pytest.fixture()
def limits(api, tenant):
    """Sets limits over the API; every one set is cleared after the test."""
    set_ones = []

    def set_limit(kind, owner, name, value):
        assert api.put(f"/api/{kind}-limits/{owner}/{name}", {"value": value}) == (204, None)
        set_ones.append(f"/api/{kind}-limits/{owner}/{name}")

    yield set_limit
    for path in set_ones:
        assert api.delete(path) == (204, None)


def refused_connection(broker, user="worker", password="pw", vhost="tenant"):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        amqp(broker, user, password, vhost)
    return str(refused.value)


def test_a_vhost_at_max_connections_refuses_the_next_with_530(broker, limits):
    limits("vhost", "tenant", "max-connections", 1)
    with contextlib.closing(amqp(broker, "worker", "pw", "tenant")):
        assert refused_connection(broker) == (
            "ConnectionClosedByBroker: (530) \"NOT_ALLOWED - access to vhost 'tenant' refused for user 'worker':"
            " connection limit (1) is reached\"")
        assert "connection limit (1)" in refused_connection(broker, "guest", "guest")  # whoever asks
        with contextlib.closing(amqp(broker)):  # other vhosts are not limited
            pass
    with contextlib.closing(amqp(broker, "worker", "pw", "tenant")):  # the closed one's place is free again
        pass


def test_a_vhost_limit_of_0_admits_none_and_a_negative_one_admits_all(broker, limits):
    limits("vhost", "tenant", "max-connections", 0)
    assert "connection limit (0) is reached" in refused_connection(broker)
    limits("vhost", "tenant", "max-connections", -1)
    with contextlib.closing(amqp(broker, "worker", "pw", "tenant")), \
            contextlib.closing(amqp(broker, "worker", "pw", "tenant")):
        pass


def test_a_user_at_max_connections_is_refused_with_530(broker, limits):
    limits("user", "worker", "max-connections", 1)
    with contextlib.closing(amqp(broker, "worker", "pw", "tenant")):
        assert refused_connection(broker, vhost="tenant") == (
            "ConnectionClosedByBroker: (530) \"NOT_ALLOWED - connection refused for user 'worker':"
            " user connection limit (1) is reached\"")
        with contextlib.closing(amqp(broker, "guest", "guest", "tenant")):  # other users are not limited
            pass


def test_the_vhost_limit_is_checked_before_the_users(broker, limits):
    limits("vhost", "tenant", "max-connections", 0)
    limits("user", "worker", "max-connections", 0)
    assert "access to vhost 'tenant' refused for user 'worker': connection limit (0)" in refused_connection(broker)


def test_a_user_at_max_channels_has_its_connection_closed_with_530(broker, limits):
    limits("user", "worker", "max-channels", 2)
    first = amqp(broker, "worker", "pw", "tenant")
    second = amqp(broker, "worker", "pw", "tenant")
    try:
        first.channel()
        second.channel()  # the limit counts the user's channels on all its connections
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            first.channel()
        assert (closed.value.reply_code, closed.value.reply_text) == (
            530, "NOT_ALLOWED - number of channels opened for user 'worker' has reached the maximum allowed"
                 " user limit of (2)")
        assert second.is_open
        second.channel()  # the closed connection's channel is free again
    finally:
        second.close()


def test_a_vhost_at_max_queues_refuses_a_new_queue_with_406(broker, api, limits):
    with contextlib.closing(amqp(broker, "worker", "pw", "tenant")) as connection:
        channel = connection.channel()
        channel.queue_declare("q1")
        limits("vhost", "tenant", "max-queues", 1)
        channel.queue_declare("q1")  # as RabbitMQ: only new queues count
        channel.queue_declare("q1", passive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("q2")
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost 'tenant' (1) is reached")
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("", exclusive=True)  # server-named ones too
        assert closed.value.reply_code == 406 and "amq.gen-" in closed.value.reply_text
        status, body, _ = api.request("PUT", "/api/queues/tenant/q3", {"durable": True})
        assert status == 400
        assert "cannot declare queue 'q3': queue limit in vhost 'tenant' (1) is reached" in body["reason"]
        assert api.delete("/api/vhost-limits/tenant/max-queues") == (204, None)
        channel = connection.channel()
        channel.queue_declare("q2")  # lifted at once
        channel.queue_delete("q2")
        channel.queue_delete("q1")
