"""brokerd-admin (python -m brokerd.admin) as a subprocess against one real broker over real HTTP:
lists in table and JSON, export -> import round-trips through a file, purge, close-connection
(pika sees 320), and its one-line errors for a refused login and an unreachable broker."""

import json
import subprocess
import sys

import pika
import pytest

from tests.support.httpapi import broker  # noqa: F401 (the module's fixture)

QUEUE = "admin.jobs"


@pytest.fixture(scope="module")
def url(broker):
    _, host, port = broker.wait_listening("HTTP API").split(":")
    return f"http://{host}:{port}"


def admin(url, *args, password="guest", input=None):
    """C{(exit status, stdout, stderr)} of one brokerd-admin run."""
    done = subprocess.run([sys.executable, "-m", "brokerd.admin", "--url", url, "--user", "guest",
                           "--password", password, *args], input=input, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def amqp(broker):
    host, port = broker.wait_address("AMQP")
    return pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=1, socket_timeout=10))


def test_list_export_import_and_purge_a_queue(broker, url, tmp_path):
    connection = amqp(broker)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True)
        for number in range(3):
            channel.basic_publish("", QUEUE, b"job %d" % number)

        status, table, errors = admin(url, "--vhost", "/", "list", "queues")
        assert (status, errors) == (0, "")
        header, *rows = table.splitlines()
        assert header.split() == ["vhost", "name", "messages", "messages_ready", "messages_unacknowledged",
                                  "consumers"]
        assert [row.split() for row in rows] == [["/", QUEUE, "3", "3", "0", "0"]]
        assert header.index("name") == rows[0].index(QUEUE)  # aligned columns

        status, listed, errors = admin(url, "--format", "json", "list", "queues")
        assert (status, errors) == (0, "")
        queue, = [queue for queue in json.loads(listed) if queue["name"] == QUEUE]
        assert (queue["vhost"], queue["messages"], queue["messages_ready"]) == ("/", 3, 3)

        exported = tmp_path / "definitions.json"
        assert admin(url, "export", str(exported)) == (0, f"Exported definitions to {exported}\n", "")
        definitions = json.loads(exported.read_text())
        assert {"name": QUEUE, "vhost": "/", "durable": True}.items() <= next(
            queue for queue in definitions["queues"] if queue["name"] == QUEUE).items()

        assert admin(url, "purge", QUEUE) == (0, f"Purged queue {QUEUE} in vhost /\n", "")
        assert channel.queue_declare(QUEUE, passive=True).method.message_count == 0

        channel.queue_delete(QUEUE)
        assert admin(url, "import", str(exported)) == (0, f"Imported definitions from {exported}\n", "")
        assert channel.queue_declare(QUEUE, passive=True).method.message_count == 0  # back from the file
        status, again, errors = admin(url, "export", "-")
        assert (status, errors) == (0, "")
        assert json.loads(again) == definitions
    finally:
        connection.close()


def test_list_connections_and_close_one(broker, url):
    connection = amqp(broker)
    try:
        status, listed, errors = admin(url, "--format", "json", "list", "connections")
        assert (status, errors) == (0, "")
        name, = [entry["name"] for entry in json.loads(listed) if entry["user"] == "guest"]

        status, table, errors = admin(url, "list", "connections")
        assert (status, errors) == (0, "")
        header, *rows = table.splitlines()
        assert header.split() == ["name", "user", "vhost", "protocol", "channels"]
        assert [row for row in rows if row.startswith(name)] == [rows[0]]
        assert rows[0][len(name):].split()[:2] == ["guest", "/"]

        assert admin(url, "close-connection", name, "--reason", "maintenance") == (
            0, f"Closed connection {name}\n", "")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.process_data_events(time_limit=10)
        assert (closed.value.reply_code, closed.value.reply_text) == (320, "CONNECTION_FORCED - maintenance")
    finally:
        if connection.is_open:
            connection.close()


def test_close_connection_without_a_reason_gives_the_apis_default(broker, url):
    connection = amqp(broker)
    try:
        status, listed, errors = admin(url, "--format", "json", "list", "connections")
        assert (status, errors) == (0, "")
        name, = [entry["name"] for entry in json.loads(listed) if entry["user"] == "guest"]
        assert admin(url, "close-connection", name) == (0, f"Closed connection {name}\n", "")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.process_data_events(time_limit=10)
        assert (closed.value.reply_code, closed.value.reply_text) == (
            320, "CONNECTION_FORCED - Closed via management plugin")
    finally:
        if connection.is_open:
            connection.close()


def test_errors_are_one_line_with_exit_status_1(url):
    assert admin(url, "list", "queues", password="wrong") == (
        1, "", "error: HTTP 401 not_authorised - Login failed\n")
    assert admin(url, "purge", "no.such.queue") == (1, "", "error: HTTP 404 Object Not Found - Not Found\n")
    unreachable = "http://127.0.0.1:1"
    status, out, errors = admin(unreachable, "list", "vhosts")
    assert (status, out) == (1, "")
    assert len(errors.splitlines()) == 1 and errors.startswith(f"error: could not reach the broker's management"
                                                               f" API at {unreachable}: ")
