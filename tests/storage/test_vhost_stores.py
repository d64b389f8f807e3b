"""A message store per vhost: a real ``twistd brokerd`` on chunked serving a vhost
on sqlite (files under its own directory) beside ``/``, both surviving a
SIGKILL; a vhost whose store is damaged or names an unknown backend refused
with 530 naming the damage while the others serve; a data directory from
before vhosts had stores of their own opening as ``/`` unchanged. In-process:
creating and deleting a vhost with a store of its own."""

import os
import re

import pika
import pytest
from pika.exceptions import ProbableAccessDeniedError
from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from backends.memory.store import MemoryStore
from brokerd.access.database import FULL_PERMISSIONS, AccessChangeRefused, AccessDatabase
from brokerd.access.vhosts import add_vhost, delete_vhost
from brokerd.errors import NotAllowed
from brokerd.interfaces import IVhostStores
from brokerd.model.broker import Broker
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table
from brokerd.session.connection import Connection
from brokerd.storage.durability import SyncPolicy
from brokerd.storage.vhost_stores import VhostStores, directory_name
from brokerd.testing import native_cli
from tests.support.client_broker import TRACEBACK_MARKS, start_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def amqp_connection(running, vhost):
    return pika.BlockingConnection(pika.ConnectionParameters(
        running.host, running.amqp_port, vhost, pika.PlainCredentials("guest", "guest")))


def publish(running, vhost, queue, bodies):
    """Declare the durable C{queue} in C{vhost} and publish C{bodies} to it persistently, with confirms."""
    connection = amqp_connection(running, vhost)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        for body in bodies:
            channel.basic_publish("", queue, body, PERSISTENT)
    finally:
        connection.close()


def drain(running, vhost, queue):
    """Every message waiting in C{queue} of C{vhost}, acked."""
    connection = amqp_connection(running, vhost)
    try:
        channel = connection.channel()
        bodies = []
        while True:
            method, _properties, body = channel.basic_get(queue)
            if method is None:
                return bodies
            bodies.append(body)
            channel.basic_ack(method.delivery_tag)
    finally:
        connection.close()


def refusal(running, vhost):
    """What refuses connection.open to C{vhost}: (reply code, reply text)."""
    with pytest.raises(ProbableAccessDeniedError) as refused:  # pika's name for a close while opening
        amqp_connection(running, vhost)
    reply = re.search(r'ConnectionClosedByBroker: \((\d+)\) "(.*)"', str(refused.value), re.S)
    assert reply is not None, refused.value
    return int(reply.group(1)), reply.group(2)


def test_vhosts_on_chunked_and_sqlite_serve_side_by_side_survive_sigkill_and_a_damaged_one_is_refused(tmp_path):
    data_dir = tmp_path / "data"
    arguments = ("--backend", "chunked", "--data-dir", str(data_dir))
    # A data directory as brokers made it before vhosts had stores of their own: '/' only, on --backend.
    running = start_broker(tmp_path, *arguments)
    try:
        publish(running, "/", "jobs", [b"old 1", b"old 2"])
    finally:
        running.process.stop()
    access = AccessDatabase.in_directory(str(data_dir))
    access.open()
    assert [entry for entry in access.document()["vhosts"]] == [{"name": "/"}]  # the shape it always had
    for name, backend in (("team", "sqlite"), ("damaged", "sqlite"), ("unknown", "nosuch")):
        access.add_vhost(name, backend)
        access.set_permissions("guest", name, *FULL_PERMISSIONS)
    damaged = data_dir / "vhosts" / "damaged" / "sqlite"
    damaged.mkdir(parents=True)
    (damaged / "brokerd.sqlite").write_bytes(b"these bytes are not a database" * 100)

    running = start_broker(tmp_path, *arguments)
    try:
        publish(running, "team", "jobs", [b"team 1", b"team 2", b"team 3"])  # the same queue name, kept apart
        publish(running, "/", "jobs", [b"new"])
        code, text = refusal(running, "damaged")
        assert code == 530, text
        assert text.startswith("NOT_ALLOWED - access to vhost 'damaged' refused for user 'guest': vhost 'damaged' is"
                               " down: sqlite store "), text
        assert "brokerd.sqlite is damaged or not a database" in text, text
        native = native_cli(running.native_endpoint, "--vhost", "damaged", "declare", "queue", "jobs")
        stderr = native.stderr.decode()
        assert native.returncode == 1 and "530 NOT_ALLOWED" in stderr and "is down" in stderr, stderr
        code, text = refusal(running, "unknown")
        assert code == 530 and "vhost 'unknown' is down" in text and "unknown backend 'nosuch'" in text, text
        running.process.kill()  # SIGKILL: every confirmed message must come back from its own store
        running = start_broker(tmp_path, *arguments)
        assert drain(running, "/", "jobs") == [b"old 1", b"old 2", b"new"]
        assert drain(running, "team", "jobs") == [b"team 1", b"team 2", b"team 3"]
        assert refusal(running, "damaged")[0] == 530
    finally:
        running.process.stop()
    output = running.process.output
    assert not [line for line in output if any(mark in line for mark in TRACEBACK_MARKS)], "\n".join(output)
    down = [line for line in output if "is unavailable" in line]
    assert len(down) == 2 and any("'damaged'" in line for line in down) and any("'unknown'" in line for line in down)
    assert (data_dir / "vhosts" / "team" / "sqlite" / "brokerd.sqlite").is_file()
    assert not (data_dir / "sqlite").exists()  # the team vhost's store keeps its files in its own directory
    assert (data_dir / "chunked").is_dir()
    assert any("store stats of vhost 'team' at stop" in line for line in output)


def in_process_broker(tmp_path):
    store = MemoryStore()
    store.open()
    broker = Broker(store, Clock())
    broker.vhost_stores = VhostStores(str(tmp_path), SyncPolicy(), Clock())
    return broker, AccessDatabase.in_memory()


def test_a_vhost_created_with_a_backend_commits_in_its_own_store_and_deleting_it_removes_its_files(tmp_path):
    broker, access = in_process_broker(tmp_path)
    created = add_vhost(broker, access, "team", backend="memory")
    vhost = created.result  # a memory store opens at once
    assert vhost.store is not broker.store and broker.own_stores == {"team": vhost.store}
    assert access.vhost_backend("team") == "memory" and access.document()["vhosts"][1] == {"name": "team",
                                                                                           "backend": "memory"}
    channel = Connection(broker, "team").open_channel(1, None)
    channel.queue_declare("jobs", durable=True)
    channel.basic_publish("", "jobs", messages_pb2.BasicProperties(delivery_mode=2), b"kept apart")
    assert [record.name for record in vhost.store.topology()] == ["jobs"]
    assert vhost.store.stats()["messages"] == 1
    assert list(broker.store.topology()) == [] and broker.store.stats()["messages"] == 0
    os.makedirs(broker.vhost_stores.directory("team"))
    deleted = delete_vhost(broker, access, "team")
    assert deleted.result == 1
    assert not os.path.exists(broker.vhost_stores.directory("team"))
    assert broker.own_stores == {} and not access.vhost_exists("team")


def test_deleting_a_vhost_whose_store_is_down_removes_its_files_and_the_refusal(tmp_path):
    broker, access = in_process_broker(tmp_path)
    access.add_vhost("broken", "nosuch")
    broker.mark_vhost_unavailable("broken", "unknown backend 'nosuch'")
    os.makedirs(broker.vhost_stores.directory("broken"))
    assert delete_vhost(broker, access, "broken").result == 0
    assert not os.path.exists(broker.vhost_stores.directory("broken"))
    with pytest.raises(NotAllowed, match="vhost broken not found"):
        broker.vhost("broken")


def test_a_bad_backend_string_is_one_clear_error_and_changes_nothing(tmp_path):
    broker, access = in_process_broker(tmp_path)
    with pytest.raises(AccessChangeRefused, match="unknown backend 'nosuch'; known backends: .*sqlite"):
        add_vhost(broker, access, "team", backend="nosuch")
    with pytest.raises(AccessChangeRefused, match="backend 'sqlite' has no option 'colour'"):
        add_vhost(broker, access, "team", backend="sqlite:colour=blue")
    assert not access.vhost_exists("team") and "team" not in broker.vhosts
    assert not os.path.exists(tmp_path / "vhosts")


def test_an_unavailable_vhost_is_refused_with_530_naming_the_damage_and_the_user():
    broker, _access = in_process_broker("/nonexistent")
    broker.mark_vhost_unavailable("team", "file is not a database")
    with pytest.raises(NotAllowed, match="^530 NOT_ALLOWED - access to vhost 'team' refused for user 'alice':"
                                         " vhost 'team' is down: file is not a database$"):
        Connection(broker, "team", user="alice")
    with pytest.raises(NotAllowed, match="^530 NOT_ALLOWED - vhost 'team' is down: file is not a database$"):
        broker.vhost("team")
    assert Connection(broker, "/", user="alice").vhost is broker.vhosts["/"]


def test_vhost_stores_provide_their_role():
    assert verifyObject(IVhostStores, VhostStores("/nonexistent", SyncPolicy(), Clock()))


def test_a_vhost_name_is_one_directory_whatever_it_holds():
    assert directory_name("team") == "team"
    assert directory_name("a/b") == "a%2Fb"
    assert directory_name("..") == "%2E%2E" and directory_name(".") == "%2E"


def test_a_vhost_with_its_own_store_delays_messages_in_that_store():
    broker, access = in_process_broker("/nonexistent")
    vhost = add_vhost(broker, access, "team", backend="memory").result
    channel = Connection(broker, "team").open_channel(1, None)
    channel.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    channel.queue_declare("due")
    channel.queue_bind("due", "later", "k")
    delayed = messages_pb2.BasicProperties()
    dict_to_table({"x-delay": 100}, delayed.headers)
    channel.basic_publish("later", "k", delayed, b"in a while")
    assert vhost.store.stats()["delayed"] == 1 and broker.store.stats()["delayed"] == 0
    broker.clock.advance(0.2)
    assert vhost.queues["due"].message_count == 1
    assert vhost.store.stats()["delayed"] == 0


def test_the_access_database_keeps_a_vhosts_backend_and_reads_entries_without_one(tmp_path):
    access = AccessDatabase.in_directory(str(tmp_path))
    access.open()
    access.add_vhost("team", "sqlite:cache=8M")
    access.add_vhost("shared")
    again = AccessDatabase.in_directory(str(tmp_path))
    again.open()
    assert again.vhosts == ["/", "team", "shared"]
    assert [again.vhost_backend(name) for name in again.vhosts] == [None, "sqlite:cache=8M", None]
    again.delete_vhost("team")
    assert again.vhost_backend("team") is None and again.document()["vhosts"] == [{"name": "/"}, {"name": "shared"}]
