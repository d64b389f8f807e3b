"""RabbitMQ's own rabbitmqadmin against brokerd's management API: list, show, declare, publish, get, purge,
delete, close connection, export and import, on a real broker."""

import json
import subprocess
import sys

import pika
import pytest

from tests.support.httpapi import RABBITMQADMIN, broker  # noqa: F401 (broker: the module's fixture)

pytestmark = pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin (RabbitMQ's) is not installed here")


@pytest.fixture(scope="module")
def admin(broker):
    _, port = broker.wait_address("HTTP API")

    def run(*args):
        finished = subprocess.run([sys.executable, RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port),
                                   "-u", "guest", "-p", "guest", *args], capture_output=True, text=True, timeout=30)
        assert finished.returncode == 0, (args, finished.stdout, finished.stderr)
        return finished.stdout

    def listing(*args):
        return json.loads(run("-f", "raw_json", "list", *args))

    run.listing = listing
    return run


def test_show_overview(admin):
    overview = json.loads(admin("-f", "raw_json", "show", "overview"))
    assert overview[0]["product_name"] == "brokerd"


def test_declare_publish_get_purge_and_delete(admin):
    assert admin("declare", "queue", "name=admin-q", "durable=false") == "queue declared\n"
    assert admin("declare", "exchange", "name=admin-x", "type=direct") == "exchange declared\n"
    assert admin("declare", "binding", "source=admin-x", "destination=admin-q", "routing_key=k") == \
        "binding declared\n"
    assert admin("publish", "exchange=admin-x", "routing_key=k", "payload=hello") == "Message published\n"
    assert admin("publish", "exchange=admin-x", "routing_key=k", "payload=again") == "Message published\n"
    [queue] = [queue for queue in admin.listing("queues") if queue["name"] == "admin-q"]
    assert queue["messages"] == 2
    assert "admin-x" in [exchange["name"] for exchange in admin.listing("exchanges")]
    assert {"source": "admin-x", "destination": "admin-q", "routing_key": "k"}.items() <= \
        [b for b in admin.listing("bindings") if b["source"] == "admin-x"][0].items()
    [got] = json.loads(admin("-f", "raw_json", "get", "queue=admin-q", "ackmode=ack_requeue_false"))
    assert (got["payload"], got["routing_key"], got["exchange"], got["message_count"]) == ("hello", "k", "admin-x", 1)
    assert admin("purge", "queue", "name=admin-q") == "queue purged\n"
    assert [queue["messages"] for queue in admin.listing("queues") if queue["name"] == "admin-q"] == [0]
    assert admin("delete", "binding", "source=admin-x", "destination=admin-q", "destination_type=queue",
                 "properties_key=k") == "binding deleted\n"
    assert admin("delete", "queue", "name=admin-q") == "queue deleted\n"
    assert admin("delete", "exchange", "name=admin-x") == "exchange deleted\n"
    assert "admin-q" not in [queue["name"] for queue in admin.listing("queues")]


def test_users_vhosts_and_permissions(admin):
    admin("declare", "vhost", "name=admin-v")
    admin("declare", "user", "name=admin-u", "password=pw", "tags=management")
    admin("declare", "permission", "vhost=admin-v", "user=admin-u", "configure=.*", "write=.*", "read=.*")
    assert "admin-v" in [vhost["name"] for vhost in admin.listing("vhosts")]
    assert {"user": "admin-u", "vhost": "admin-v", "configure": ".*", "write": ".*", "read": ".*"} in \
        admin.listing("permissions")
    assert admin("delete", "vhost", "name=admin-v") == "vhost deleted\n"
    assert admin("delete", "user", "name=admin-u") == "user deleted\n"
    assert "admin-u" not in [user["name"] for user in admin.listing("users")]


def test_list_and_close_connections(broker, admin):
    host, port = broker.wait_address("AMQP")
    client = pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=1, socket_timeout=10))
    try:
        channel = client.channel()
        channel.queue_declare("admin-consumed", auto_delete=True)
        channel.basic_consume("admin-consumed", lambda *args: None)
        [connection] = admin.listing("connections")
        assert [c["name"] for c in admin.listing("channels")] == [connection["name"] + " (1)"]
        assert [c["queue"]["name"] for c in admin.listing("consumers")] == ["admin-consumed"]
        assert admin("close", "connection", f"name={connection['name']}") == "connection closed\n"
        with pytest.raises(pika.exceptions.ConnectionClosed) as closed:
            client.process_data_events(5)
            client.channel()
        assert (closed.value.reply_code, closed.value.reply_text) == (
            320, "CONNECTION_FORCED - Closed via management plugin")
        assert admin.listing("connections") == []
    finally:
        if client.is_open:
            client.close()


def test_export_and_import(admin, tmp_path):
    assert admin("declare", "queue", "name=exported-q", "durable=true") == "queue declared\n"
    file = tmp_path / "definitions.json"
    assert admin("export", str(file)).startswith("Exported definitions for")
    exported = json.loads(file.read_text())
    assert "exported-q" in [queue["name"] for queue in exported["queues"]]
    assert admin("delete", "queue", "name=exported-q") == "queue deleted\n"
    assert admin("import", str(file)).startswith("Uploaded definitions from")
    assert "exported-q" in [queue["name"] for queue in admin.listing("queues")]
