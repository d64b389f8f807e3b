"""Topic permissions enforced as RabbitMQ 3.10 enforces them, through pika and the native command
line against a real broker process: a publish to a topic exchange needs a routing key the user's
write expression matches, a queue or exchange binding from one a key its read expression matches,
{username} and {vhost} stand for the names, other exchange types and exchanges without an entry are
not checked, consuming is not either; the refusals are RabbitMQ's 403 and words (checked against
RabbitMQ 3.10.8), changes apply to open connections, and the entries survive a restart."""

import pika
import pika.exceptions
import pytest

from brokerd.testing import native_cli
from tests.support.httpapi import Api, amqp, module_broker, segment

USER, PASSWORD = "tp-user", "tp-pass"
VHOST = "tp-vhost"


def refused_text(key, exchange, vhost="/", user=USER):
    return (f"ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' in vhost '{vhost}'"
            f" refused for user '{user}'")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory, "--native", "tcp:0:interface=127.0.0.1")


@pytest.fixture(scope="module")
def api(broker):
    """guest's API client, after giving tp-user every permission on / and tp-vhost and its topic permissions."""
    api = Api(broker.wait_listening("HTTP API"))
    assert api.put(f"/api/users/{USER}", {"password": PASSWORD, "tags": ""})[0] == 201
    assert api.put(f"/api/vhosts/{VHOST}")[0] == 201
    for vhost in ("/", VHOST):
        assert api.put(f"/api/permissions/{segment(vhost)}/{USER}",
                       {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert api.put(f"/api/topic-permissions/%2F/{USER}",
                   {"exchange": "amq.topic", "write": r"^{username}\.", "read": r"^r\."})[0] == 201
    assert api.put(f"/api/topic-permissions/%2F/{USER}",
                   {"exchange": "amq.direct", "write": "^nothing$", "read": "^nothing$"})[0] == 204
    assert api.put(f"/api/topic-permissions/{VHOST}/{USER}",
                   {"exchange": "amq.topic", "write": r"^{vhost}\.", "read": ""})[0] == 201
    return api


def connect(broker, vhost="/"):
    return amqp(broker, USER, PASSWORD, vhost)


def refusal(action):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action()
    return closed.value.reply_code, closed.value.reply_text


def confirming(connection):
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def test_a_publish_to_a_topic_exchange_needs_a_key_the_write_expression_matches(broker, api):
    with connect(broker) as connection:
        channel = confirming(connection)
        channel.queue_declare("tp.mine", exclusive=True)
        channel.queue_bind("tp.mine", "amq.topic", "r.#")
        channel.queue_bind("tp.mine", "amq.topic", "r.tp-user.#")
        channel.basic_publish("amq.topic", f"{USER}.anything", b"allowed")  # {username} expanded
        assert refusal(lambda: channel.basic_publish("amq.topic", "x.y", b"refused")) == (
            403, refused_text("x.y", "amq.topic"))
        channel = confirming(connection)
        assert refusal(lambda: channel.basic_publish("amq.topic", "", b"refused")) == (
            403, refused_text("", "amq.topic"))


def test_exchanges_without_an_entry_and_other_types_are_not_checked(broker, api):
    with connect(broker) as connection:
        channel = confirming(connection)
        channel.exchange_declare("tp.free", "topic", auto_delete=True)
        channel.queue_declare("tp.free.q", exclusive=True)
        channel.queue_bind("tp.free.q", "tp.free", "any.key")
        channel.basic_publish("tp.free", "any.key", b"no entry")
        # amq.direct has an entry that matches nothing, but it is not a topic exchange:
        channel.queue_bind("tp.free.q", "amq.direct", "k")
        channel.basic_publish("amq.direct", "k", b"direct")
        # An unknown exchange is the publish's 404, not a topic refusal:
        assert refusal(lambda: channel.basic_publish("tp.missing", "x", b"x")) == (
            404, "NOT_FOUND - no exchange 'tp.missing' in vhost '/'")
        channel = connection.channel()
        assert channel.queue_declare("tp.free.q", passive=True).method.message_count == 2


def test_binding_and_unbinding_from_a_topic_exchange_need_a_key_the_read_expression_matches(broker, api):
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare("tp.bound", exclusive=True)
        channel.queue_bind("tp.bound", "amq.topic", "r.a")
        channel.queue_unbind("tp.bound", "amq.topic", "r.a")
        assert refusal(lambda: channel.queue_bind("tp.bound", "amq.topic", "z.a")) == (
            403, refused_text("z.a", "amq.topic"))
        channel = connection.channel()
        assert refusal(lambda: channel.queue_unbind("tp.bound", "amq.topic", "z.a")) == (
            403, refused_text("z.a", "amq.topic"))
        channel = connection.channel()
        channel.exchange_declare("tp.dest", "fanout", auto_delete=True)
        assert refusal(lambda: channel.exchange_bind("tp.dest", "amq.topic", "z.a")) == (
            403, refused_text("z.a", "amq.topic"))
        channel = connection.channel()
        assert refusal(lambda: channel.exchange_unbind("tp.dest", "amq.topic", "z.a")) == (
            403, refused_text("z.a", "amq.topic"))
        channel = connection.channel()
        channel.exchange_bind("tp.dest", "amq.topic", "r.b")
        # The destination is not checked: amq.topic as one is not a topic read.
        channel.exchange_declare("tp.src", "topic", auto_delete=True)
        channel.exchange_bind("amq.topic", "tp.src", "z.a")
        # Consuming is not checked at all.
        channel.basic_consume("tp.bound", lambda *args: None)


def test_vhost_stands_for_the_vhost_and_an_empty_expression_allows_only_the_empty_key(broker, api):
    with connect(broker, VHOST) as connection:
        channel = confirming(connection)
        channel.basic_publish("amq.topic", f"{VHOST}.k", b"allowed")
        assert refusal(lambda: channel.basic_publish("amq.topic", "other", b"x")) == (
            403, refused_text("other", "amq.topic", VHOST))
        channel = connection.channel()
        channel.queue_declare("tp.v", exclusive=True)
        channel.queue_bind("tp.v", "amq.topic", "")
        assert refusal(lambda: channel.queue_bind("tp.v", "amq.topic", "a")) == (
            403, refused_text("a", "amq.topic", VHOST))


def test_a_change_applies_to_connections_already_open(broker, api):
    with connect(broker) as connection:
        channel = confirming(connection)
        channel.exchange_declare("tp.live", "topic", auto_delete=True)
        channel.basic_publish("tp.live", "a.b", b"before")
        assert api.put(f"/api/topic-permissions/%2F/{USER}/tp.live",
                       {"exchange": "tp.live", "write": "^a$", "read": ".*"})[0] == 204
        channel.basic_publish("tp.live", "a", b"matches")
        assert refusal(lambda: channel.basic_publish("tp.live", "a.c", b"x")) == (403, refused_text("a.c", "tp.live"))
        assert api.delete(f"/api/topic-permissions/%2F/{USER}/tp.live")[0] == 204
        channel = confirming(connection)
        channel.basic_publish("tp.live", "a.c", b"allowed again")


def test_the_native_protocol_is_checked_too(broker, api):
    endpoint = broker.wait_listening("native protocol")
    login = ("--user", USER, "--password", PASSWORD)
    published = native_cli(endpoint, *login, "publish", "--exchange", "amq.topic", "--routing-key", "x.y",
                           "--confirm", "body")
    assert published.returncode == 1
    assert b"403 " + refused_text("x.y", "amq.topic").encode() in published.stderr
    assert native_cli(endpoint, *login, "declare", "queue", "tp.native").returncode == 0
    bound = native_cli(endpoint, *login, "bind", "tp.native", "amq.topic", "--routing-key", "z.z")
    assert bound.returncode == 1
    assert b"403 " + refused_text("z.z", "amq.topic").encode() in bound.stderr
    assert native_cli(endpoint, *login, "bind", "tp.native", "amq.topic", "--routing-key", "r.z").returncode == 0
    assert native_cli(endpoint, *login, "publish", "--exchange", "amq.topic", "--routing-key", f"{USER}.n",
                      "--confirm", "body").returncode == 0


def test_topic_permissions_survive_a_restart(broker, api):
    broker.restart()
    api = Api(broker.wait_listening("HTTP API"))
    assert [entry["exchange"] for entry in api.get(f"/api/topic-permissions/%2F/{USER}")] == [
        "amq.direct", "amq.topic"]
    with connect(broker) as connection:
        channel = confirming(connection)
        channel.basic_publish("amq.topic", f"{USER}.after", b"allowed")
        assert refusal(lambda: channel.basic_publish("amq.topic", "x.y", b"x")) == (
            403, refused_text("x.y", "amq.topic"))
