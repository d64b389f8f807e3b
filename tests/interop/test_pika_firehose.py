"""The firehose (amq.rabbitmq.trace) through pika, the management API, brokerd-admin and RabbitMQ's
rabbitmqadmin against a real broker process: every vhost has the internal topic exchange; while
tracing is on, each publish is copied there as publish.EXCHANGE and each delivery (consumer or
basic.get) as deliver.QUEUE, with the original body and the headers RabbitMQ 3.10.8 sets (checked
on a reference node); with tracing off nothing is copied; tracing is not kept across a restart, as
in RabbitMQ."""

import json
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from brokerd.testing import native_cli
from tests.support.admin_cli import admin, http_url
from tests.support.httpapi import RABBITMQADMIN, Api, amqp, module_broker

VHOST = "fh"
TRACE = "amq.rabbitmq.trace"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory, "--native", "tcp:0:interface=127.0.0.1")


@pytest.fixture(scope="module")
def api(broker):
    api = Api(broker.wait_listening("HTTP API"))
    assert api.put(f"/api/vhosts/{VHOST}")[0] == 201
    assert api.put(f"/api/permissions/{VHOST}/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    return api


def traced(channel, queue):
    """Every copy waiting in C{queue}: (routing key, properties, body)."""
    found = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return found
        found.append((method.routing_key, properties, body))


def test_every_vhost_has_the_internal_trace_exchange_and_clients_cannot_publish_to_it(broker, api):
    [exchange] = [item for item in api.get(f"/api/exchanges/{VHOST}") if item["name"] == TRACE]
    assert (exchange["type"], exchange["durable"], exchange["internal"]) == ("topic", True, True)
    with amqp(broker, vhost=VHOST) as connection:
        channel = connection.channel()
        channel.exchange_declare(TRACE, passive=True)
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish(TRACE, "x", b"x")
        assert (closed.value.reply_code, closed.value.reply_text) == (
            403, f"ACCESS_REFUSED - cannot publish to internal exchange '{TRACE}' in vhost '{VHOST}'")
    assert "amq.rabbitmq.trace" not in [item["name"] for item in api.get("/api/definitions")["exchanges"]]


def test_with_tracing_on_publishes_and_deliveries_are_copied_with_rabbitmqs_headers(broker, api):
    assert api.get(f"/api/vhosts/{VHOST}")["tracing"] is False
    assert api.put(f"/api/vhosts/{VHOST}", {"tracing": True}) == (204, None)
    assert api.get(f"/api/vhosts/{VHOST}")["tracing"] is True
    with amqp(broker, vhost=VHOST) as connection:
        channel = connection.channel()
        channel.queue_declare("fh.trace", exclusive=True)
        channel.queue_bind("fh.trace", TRACE, "#")
        channel.exchange_declare("fh.x", "direct", auto_delete=True)
        channel.queue_declare("fh.work", auto_delete=True)
        channel.queue_bind("fh.work", "fh.x", "k")
        channel.confirm_delivery()
        properties = pika.BasicProperties(content_type="text/plain", headers={"h": 1}, delivery_mode=2, priority=3,
                                          message_id="m1", correlation_id="c", user_id="guest")
        channel.basic_publish("fh.x", "k", b"hello", properties)
        channel.basic_publish("", "fh.work", b"direct")
        channel.basic_publish("fh.x", "nowhere", b"lost")
        method, _, _ = channel.basic_get("fh.work")
        channel.basic_nack(method.delivery_tag, requeue=True)
        channel.basic_get("fh.work", auto_ack=True)
        received = []
        channel.basic_consume("fh.work", lambda ch, method, props, body: received.append(body), auto_ack=True)
        while not received:
            connection.process_data_events(time_limit=1)
        copies = traced(channel, "fh.trace")
    assert [(key, body) for key, _, body in copies] == [
        ("publish.fh.x", b"hello"), ("publish.", b"direct"), ("publish.fh.x", b"lost"),
        ("deliver.fh.work", b"hello"), ("deliver.fh.work", b"hello"), ("deliver.fh.work", b"direct")]
    publish = copies[0][1]
    assert (publish.content_type, publish.delivery_mode, publish.priority) == (None, None, None)
    headers = publish.headers
    connection_name = headers["connection"]
    amqp_port = broker.wait_address("AMQP")[1]
    assert connection_name.startswith("127.0.0.1:") and connection_name.endswith(f" -> 127.0.0.1:{amqp_port}")
    node = headers["node"]
    original = {"user_id": "guest", "message_id": "m1", "correlation_id": "c", "priority": 3, "delivery_mode": 2,
                "headers": {"h": 1}, "content_type": "text/plain"}
    assert list(headers.items()) == [
        ("exchange_name", "fh.x"), ("routing_keys", ["k"]), ("properties", original), ("node", node),
        ("vhost", VHOST), ("connection", connection_name), ("channel", 1), ("user", "guest"),
        ("routed_queues", ["fh.work"])]
    assert list(headers["properties"]) == list(original)  # RabbitMQ's order: P_basic's fields reversed
    assert copies[1][1].headers["exchange_name"] == "" and copies[1][1].headers["properties"] == {}
    assert copies[2][1].headers["routed_queues"] == []
    assert list(copies[3][1].headers.items()) == [
        ("exchange_name", "fh.x"), ("routing_keys", ["k"]), ("properties", original), ("node", node),
        ("redelivered", 0), ("vhost", VHOST), ("connection", connection_name), ("channel", 1), ("user", "guest")]
    assert copies[4][1].headers["redelivered"] == 1
    assert copies[5][1].headers["routing_keys"] == ["fh.work"]


def test_native_protocol_publishes_and_gets_are_traced_too_and_other_vhosts_are_not(broker, api):
    assert api.put(f"/api/vhosts/{VHOST}", {"tracing": True}) == (204, None)
    endpoint = broker.wait_listening("native protocol")
    with amqp(broker, vhost=VHOST) as traced_vhost, amqp(broker) as other_vhost:
        channel = traced_vhost.channel()
        channel.queue_declare("fh.native.trace", exclusive=True)
        channel.queue_bind("fh.native.trace", TRACE, "#")
        channel.queue_declare("fh.native", auto_delete=True)
        other = other_vhost.channel()
        other.queue_declare("fh.other.trace", exclusive=True)
        other.queue_bind("fh.other.trace", TRACE, "#")
        other.confirm_delivery()
        other.basic_publish("", "fh.other.trace", b"in /")
        assert native_cli(endpoint, "--vhost", VHOST, "publish", "--routing-key", "fh.native", "--confirm",
                          "native").returncode == 0
        assert native_cli(endpoint, "--vhost", VHOST, "get", "fh.native").returncode == 0
        copies = traced(channel, "fh.native.trace")
        assert [(key, body, properties.headers["user"]) for key, properties, body in copies] == [
            ("publish.", b"native", "guest"), ("deliver.fh.native", b"native", "guest")]
        assert [body for _, _, body in traced(other, "fh.other.trace")] == [b"in /"]  # / is not traced


def test_with_tracing_off_nothing_is_copied(broker, api):
    assert api.put(f"/api/vhosts/{VHOST}", {"tracing": False}) == (204, None)
    assert api.get(f"/api/vhosts/{VHOST}")["tracing"] is False
    with amqp(broker, vhost=VHOST) as connection:
        channel = connection.channel()
        channel.queue_declare("fh.off", exclusive=True)
        channel.queue_bind("fh.off", TRACE, "#")
        channel.confirm_delivery()
        channel.basic_publish("", "fh.off", b"untraced")
        assert channel.basic_get("fh.off", auto_ack=True)[2] == b"untraced"
        assert traced(channel, "fh.off") == []


def test_a_tracing_value_that_is_not_a_boolean_is_400_as_rabbitmq(api):
    assert api.put(f"/api/vhosts/{VHOST}", {"tracing": "maybe"}) == (
        400, {"error": "bad_request", "reason": ["not_boolean", "maybe"]})


def test_brokerd_admin_turns_tracing_on_and_off(broker, api):
    url = http_url(broker)
    assert admin(url, "trace-on", "--vhost", VHOST) == (0, f"Tracing enabled for vhost {VHOST}\n", "")
    assert api.get(f"/api/vhosts/{VHOST}")["tracing"] is True
    assert admin(url, "trace-off", "-p", VHOST) == (0, f"Tracing disabled for vhost {VHOST}\n", "")
    assert api.get(f"/api/vhosts/{VHOST}")["tracing"] is False
    assert admin(url, "trace-on", "--vhost", "nowhere") == (1, "", "error: Virtual host 'nowhere' does not exist\n")


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin (RabbitMQ's) is not installed here")
def test_rabbitmqadmin_declares_a_traced_vhost_and_lists_its_tracing(broker, api):
    _, port = broker.wait_address("HTTP API")

    def rabbitmqadmin(*args):
        finished = subprocess.run([sys.executable, RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", "guest",
                                   "-p", "guest", *args], capture_output=True, text=True, timeout=30)
        assert finished.returncode == 0, (args, finished.stdout, finished.stderr)
        return finished.stdout

    assert rabbitmqadmin("declare", "vhost", "name=fh-admin", "tracing=true") == "vhost declared\n"
    listed = json.loads(rabbitmqadmin("-f", "raw_json", "list", "vhosts", "name", "tracing"))
    assert {"name": "fh-admin", "tracing": True} in listed and {"name": VHOST, "tracing": False} in listed


def test_tracing_is_not_kept_across_a_restart_as_in_rabbitmq(broker, api):
    assert api.put(f"/api/vhosts/{VHOST}", {"tracing": True}) == (204, None)
    broker.restart()
    api = Api(broker.wait_listening("HTTP API"))
    assert api.get(f"/api/vhosts/{VHOST}")["tracing"] is False
