"""The store export (spark_jobs.export): per durable backend a real broker is
given messages over AMQP (pika), some consumed, and stopped; the export must
list exactly what its store kept — one line per queue holding a message, with
the right hash, size and priority, delayed messages as delayed — and a message
dropped from the store (tests.support.store_damage) must be missing from it. A store
in use, a memory backend, a missing directory or a damaged file stop the
command with a clear error."""

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import pika
import pytest
from twisted.internet import defer, reactor
from twisted.trial import unittest

from backends.common.fileio import queue_key_name
from backends.filelog.queuefile import DATA_SUFFIX
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.storage import registry
from brokerd.testing import BrokerProcess
from spark_jobs import events
from spark_jobs.export import DELAYED_WINDOW, ExportError, export_store, export_store_deferred
from tests.support.store_damage import drop_stored_message

pytestmark = pytest.mark.long_module(seconds=22)  # started early (tests/conftest.py)

BACKENDS = ["sqlite", "filelog", "chunked:chunk_size=4M"]
PRIORITY_QUEUE, PLAIN_QUEUE = "export.priority", "export.plain"
FANOUT, DELAYED_EXCHANGE = "export.both", "export.later"
AN_HOUR_MS = 3_600_000


def export_command(*args):
    return subprocess.run([sys.executable, "-m", "spark_jobs.export", *args], capture_output=True, text=True,
                          timeout=60)


def body_of(size, seed):
    """A body of C{size} bytes that differs from message to message."""
    block = hashlib.sha256(seed.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def read_lines(path):
    with open(path, encoding="utf-8") as exported:
        return [json.loads(line) for line in exported]


def identity(line):
    """What a test compares of an export line."""
    return (line["queue"], line["exchange"], line["message_id"], line["body_sha256"], line["size"], line["priority"],
            line["state"])


class Publisher:
    """Publishes persistent messages with confirms, remembering what the store should hold for each queue."""

    def __init__(self, channel):
        self.channel = channel
        self.held = collections.Counter()  # identity tuples the store must hold
        self.published = {}  # (queue, message id) -> identity tuple, for persistent messages
        self.plain_order = []  # message ids of the plain queue, in queue order

    def publish(self, message_id, size, queues, exchange="", routing_key=None, priority=None, persistent=True,
                headers=None, state=events.READY):
        body = body_of(size, message_id or f"anonymous-{size}")
        properties = pika.BasicProperties(delivery_mode=2 if persistent else 1, message_id=message_id or None,
                                          priority=priority, headers=headers)
        self.channel.basic_publish(exchange, routing_key if routing_key is not None else queues[0], body, properties)
        if not persistent:
            return
        for queue in queues:
            identity = (queue, exchange, message_id, hashlib.sha256(body).hexdigest(), size, priority or 0, state)
            self.published[(queue, message_id)] = identity
            self.held[identity] += 1
            if queue == PLAIN_QUEUE:
                self.plain_order.append(message_id)

    def settle(self, queue, ack):
        """basic.get one message of C{queue} and ack it (the store forgets it) or nack it back."""
        method, properties, _ = self.channel.basic_get(queue, auto_ack=False)
        assert method is not None, f"{queue} is empty"
        if not ack:
            self.channel.basic_nack(method.delivery_tag, requeue=True)
            return
        self.channel.basic_ack(method.delivery_tag)
        message_id = properties.message_id or ""
        identity = self.published.get((queue, message_id))
        if identity is not None:
            self.held[identity] -= 1
            if queue == PLAIN_QUEUE:
                self.plain_order.remove(message_id)


def play(channel):
    """The scenario every backend gets; returns the L{Publisher} that knows what the store must hold."""
    channel.confirm_delivery()
    channel.queue_declare(PRIORITY_QUEUE, durable=True, arguments={"x-max-priority": 5})
    channel.queue_declare(PLAIN_QUEUE, durable=True)
    channel.exchange_declare(FANOUT, "fanout", durable=True)
    channel.queue_bind(PRIORITY_QUEUE, FANOUT)
    channel.queue_bind(PLAIN_QUEUE, FANOUT)
    channel.exchange_declare(DELAYED_EXCHANGE, "x-delayed-message", durable=True,
                             arguments={"x-delayed-type": "direct"})
    channel.queue_bind(PRIORITY_QUEUE, DELAYED_EXCHANGE, "later")
    publisher = Publisher(channel)
    sizes, priorities = (1, 700, 5000, 70_000), (None, 3, 5, 1)
    for number in range(6):
        publisher.publish(f"prio-{number}", sizes[number % 4], [PRIORITY_QUEUE], priority=priorities[number % 4])
    for number in range(4):
        publisher.publish(f"plain-{number}", sizes[(number + 1) % 4], [PLAIN_QUEUE])
    publisher.publish("both", 333, [PRIORITY_QUEUE, PLAIN_QUEUE], exchange=FANOUT, routing_key="", priority=2)
    publisher.publish("", 55, [PLAIN_QUEUE])  # no message id at all
    publisher.publish("transient", 66, [PRIORITY_QUEUE], priority=4, persistent=False)  # never stored
    publisher.publish("later", 444, [""], exchange=DELAYED_EXCHANGE, routing_key="later",
                      headers={"x-delay": AN_HOUR_MS}, state=events.DELAYED)
    for queue, ack in ((PRIORITY_QUEUE, True), (PRIORITY_QUEUE, True), (PLAIN_QUEUE, True), (PLAIN_QUEUE, False)):
        publisher.settle(queue, ack)
    return publisher


@pytest.fixture(scope="module", params=BACKENDS)
def stored(request, tmp_path_factory):
    """
    A stopped broker's data directory after the scenario, what its store must
    hold, and what the export command said while the broker still ran.
    """
    backend = request.param
    directory = tmp_path_factory.mktemp(backend.partition(":")[0])
    data_dir = directory / "data"
    broker = BrokerProcess(["--backend", backend, "--data-dir", str(data_dir), "--native", "none",
                            "--max-message-size", "1M"], cwd=directory)
    try:
        _, host, port = broker.wait_listening("AMQP").split(":")
        parameters = pika.ConnectionParameters(host, int(port), connection_attempts=1, socket_timeout=10,
                                               blocked_connection_timeout=10)
        connection = pika.BlockingConnection(parameters)
        publisher = play(connection.channel())
        connection.close()
        while_running = export_command("--backend", backend, "--data-dir", str(data_dir),
                                       "--out", str(directory / "while-running.jsonl"))
    finally:
        broker.stop()
    failures = [line for line in broker.output if "Traceback" in line or "Unhandled" in line]
    assert not failures, "the broker logged failures:\n" + "\n".join(broker.output)
    return types.SimpleNamespace(backend=backend, directory=directory, data_dir=data_dir, publisher=publisher,
                                 while_running=while_running)


@pytest.fixture(scope="module")
def exported(stored):
    """The export of the stopped broker's store, and the count export_store returned."""
    out = stored.directory / "export.jsonl"
    count = export_store(stored.backend, str(stored.data_dir), str(out))
    return read_lines(out), count


def test_the_export_lists_exactly_what_the_store_kept_once_per_queue(stored, exported):
    lines, count = exported
    assert count == len(lines)
    assert collections.Counter(identity(line) for line in lines) == +stored.publisher.held
    assert all(set(line) == set(events.EXPORT_FIELDS) for line in lines)
    assert all(type(line[field]) is kind for line in lines for field, kind in events.EXPORT_FIELDS.items())
    assert {(line["backend"], line["vhost"]) for line in lines} == {(stored.backend, "/")}
    both = [line["queue"] for line in lines if line["message_id"] == "both"]
    assert sorted(both) == [PLAIN_QUEUE, PRIORITY_QUEUE]
    assert not [line for line in lines if line["message_id"] == "transient"]


def test_a_queue_is_exported_in_queue_order(stored, exported):
    lines, _ = exported
    plain = [line["message_id"] for line in lines if line["queue"] == PLAIN_QUEUE]
    assert plain == stored.publisher.plain_order
    assert plain[0] == "plain-1", "plain-0 was acked; plain-1 was nacked back to its place"


def test_a_delayed_message_is_exported_as_delayed_with_its_exchange(stored, exported):
    lines, _ = exported
    delayed = [line for line in lines if line["state"] == events.DELAYED]
    assert [(line["message_id"], line["queue"], line["exchange"], line["size"]) for line in delayed] == [
        ("later", "", DELAYED_EXCHANGE, 444)]
    assert lines[-1] == delayed[0], "delayed messages come after every queue's"


def test_a_dropped_message_is_missing_from_the_next_export(stored, exported):
    lines, _ = exported
    copy = stored.directory / "dropped"
    shutil.copytree(stored.data_dir, copy)
    assert drop_stored_message(stored.backend, str(copy), PLAIN_QUEUE, "both")
    assert not drop_stored_message(stored.backend, str(copy), PLAIN_QUEUE, "both"), "dropped twice"
    assert not drop_stored_message(stored.backend, str(copy), PLAIN_QUEUE, "no-such-message")
    out = stored.directory / "dropped.jsonl"
    export_store(stored.backend, str(copy), str(out), label="damaged")
    after = read_lines(out)
    assert {line["backend"] for line in after} == {"damaged"}
    missing = collections.Counter(map(identity, lines)) - collections.Counter(map(identity, after))
    assert list(missing) == [(PLAIN_QUEUE, FANOUT, "both", hashlib.sha256(body_of(333, "both")).hexdigest(), 333, 2,
                              events.READY)]
    assert len(after) == len(lines) - 1, "nothing else changed"


def test_exporting_a_store_its_broker_still_uses_fails_saying_it_is_locked(stored):
    finished = stored.while_running
    assert finished.returncode == 1
    assert "in use" in finished.stderr or "locked" in finished.stderr, finished.stderr
    assert str(stored.data_dir) in finished.stderr
    assert "Traceback" not in finished.stderr
    assert not os.path.exists(stored.directory / "while-running.jsonl")


def test_the_memory_backend_has_nothing_to_export(tmp_path):
    finished = export_command("--backend", "memory", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out"))
    assert finished.returncode == 1
    assert "memory backend keeps nothing on disk" in finished.stderr
    with pytest.raises(ExportError, match="keeps nothing on disk"):
        export_store("memory", str(tmp_path), str(tmp_path / "out"))


def test_an_unknown_backend_is_named_with_the_known_ones(tmp_path):
    finished = export_command("--backend", "nosuch", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out"))
    assert finished.returncode == 1
    assert "unknown backend 'nosuch'; known backends:" in finished.stderr
    assert "sqlite" in finished.stderr


def test_a_missing_data_directory_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    finished = export_command("--backend", "sqlite", "--data-dir", str(missing), "--out", str(tmp_path / "out"))
    assert finished.returncode == 1
    assert f"data directory {missing} does not exist" in finished.stderr
    assert not missing.exists(), "the export created the directory it was to read"


def test_a_data_directory_without_that_backends_store_is_not_exported_as_empty(tmp_path):
    for backend, location in (("sqlite", "sqlite/brokerd.sqlite"), ("chunked", "chunked"), ("filelog", "filelog")):
        finished = export_command("--backend", backend, "--data-dir", str(tmp_path), "--out", str(tmp_path / "out"))
        assert finished.returncode == 1
        assert f"holds no {backend} store: {tmp_path / location} does not exist" in finished.stderr
    assert os.listdir(tmp_path) == [], "the export created a store"


def test_a_damaged_database_file_is_named(tmp_path):
    database = tmp_path / "sqlite" / "brokerd.sqlite"
    database.parent.mkdir()
    database.write_bytes(b"this is not an SQLite database at all " * 200)
    finished = export_command("--backend", "sqlite", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out"))
    assert finished.returncode == 1
    assert "damaged" in finished.stderr and str(database) in finished.stderr, finished.stderr
    assert not (tmp_path / "out").exists()


def stored_message(body, message_id):
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id=message_id)
    return Message("", "jobs", properties, body)


class InReactorExportTests(unittest.TestCase):
    """export_store_deferred, for code that runs the reactor: stores filled through their API."""

    def fresh_data_dir(self):
        data_dir = tempfile.mkdtemp(prefix="brokerd-export-test-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        return data_dir

    @defer.inlineCallbacks
    def filled_store(self, backend, queues, bodies):
        data_dir = self.fresh_data_dir()
        store = registry.make_store(backend, data_dir, reactor=reactor)
        yield store.open()
        for name in queues:
            store.save_queue(messages_pb2.QueueRecord(vhost="/", name=name, durable=True))
        for number, body in enumerate(bodies):
            store.append(stored_message(body, f"m{number}"), [("/", name) for name in queues])
        yield store.close()
        return data_dir

    @defer.inlineCallbacks
    def test_a_message_in_two_queues_has_a_line_for_each(self):
        data_dir = yield self.filled_store("chunked:chunk_size=1M", ["jobs", "audit"], [b"one", b"two"])
        out = os.path.join(data_dir, "export.jsonl")
        written = yield export_store_deferred("chunked:chunk_size=1M", data_dir, out, label="chunked", reactor=reactor)
        lines = read_lines(out)
        self.assertEqual(written, 4)
        self.assertEqual([(line["queue"], line["message_id"], line["size"]) for line in lines],
                         [("audit", "m0", 3), ("audit", "m1", 3), ("jobs", "m0", 3), ("jobs", "m1", 3)])
        self.assertEqual(lines[0]["body_sha256"], hashlib.sha256(b"one").hexdigest())
        self.assertEqual({line["backend"] for line in lines}, {"chunked"})

    @defer.inlineCallbacks
    def test_delayed_messages_come_out_in_due_order_across_windows(self):
        data_dir = self.fresh_data_dir()
        store = registry.make_store("sqlite", data_dir, reactor=reactor)
        yield store.open()
        count = DELAYED_WINDOW * 2 + 500
        dues = {f"d{number}": 1_900_000_000_000 + (number * 7919) % count for number in range(count)}
        for message_id, due in dues.items():
            store.delay(stored_message(message_id.encode(), message_id), ("/", "later"), due)
        yield store.close()
        out = os.path.join(data_dir, "export.jsonl")
        written = yield export_store_deferred("sqlite", data_dir, out, reactor=reactor)
        lines = read_lines(out)
        self.assertEqual(written, count)
        self.assertEqual([line["message_id"] for line in lines], sorted(dues, key=dues.get))
        self.assertEqual({(line["state"], line["queue"], line["exchange"]) for line in lines},
                         {(events.DELAYED, "", "later")})

    @defer.inlineCallbacks
    def test_damage_in_the_middle_of_a_queue_file_fails_the_export_naming_the_file(self):
        data_dir = yield self.filled_store("filelog", ["jobs"], [body_of(1000, f"m{n}") for n in range(3)])
        path = os.path.join(data_dir, "filelog", queue_key_name(("/", "jobs")) + DATA_SUFFIX)
        middle = os.path.getsize(path) // 2  # inside the second of three records of equal size
        with open(path, "r+b") as queue_file:
            queue_file.seek(middle)
            damaged = bytes([queue_file.read(1)[0] ^ 0xFF])
            queue_file.seek(middle)
            queue_file.write(damaged)
        out = os.path.join(data_dir, "export.jsonl")
        exporting = export_store_deferred("filelog", data_dir, out, reactor=reactor)
        failure = yield self.assertFailure(exporting, ExportError)
        self.assertIn("is damaged (queue 'jobs' of vhost '/')", str(failure))
        self.assertIn(path, str(failure))
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(out + ".partial"))
