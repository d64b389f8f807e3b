"""Users, vhosts and permissions through pika against a real broker process:
RabbitMQ's 403 and 530 refusals and texts, UTF-8 passwords, user_id, vhosts
kept apart, the access database surviving a SIGKILL, and a data directory
from before the access database keeping its vhosts."""

import pathlib
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from brokerd.access.database import AccessDatabase
from tests.support.client_broker import checked_for_tracebacks, pika_parameters, start_broker

UTF8_USER, UTF8_PASSWORD = "zoë", "pässwörd€"
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """
    guest (first start's defaults), alice limited to ^alice\\. on /, a user
    with a UTF-8 password, a vhost "other" for guest; and carol, imported by
    the broker itself from a --users file at start.
    """
    directory = tmp_path_factory.mktemp("access")
    access = AccessDatabase.in_directory(str(directory / "brokerd-data"))
    access.open()
    access.add_user("alice", "alice-pass")
    access.set_permissions("alice", "/", r"^alice\.", r"^alice\.", r"^alice\.")
    access.add_user(UTF8_USER, UTF8_PASSWORD)
    access.set_permissions(UTF8_USER, "/", ".*", ".*", ".*")
    access.add_vhost("other")
    access.set_permissions("guest", "other", ".*", ".*", ".*")
    users = directory / "users"
    users.write_text("carol:c4rol\n")
    running = start_broker(directory, "--users", str(users))
    running.users_file = users
    with checked_for_tracebacks(running):
        yield running
    running.process.stop()


def connect(broker, user="guest", password="guest", vhost="/"):
    return pika.BlockingConnection(pika_parameters(broker, user, password, virtual_host=vhost))


def refusal(action):
    """The (reply code, reply text) a channel-closing refusal of C{action} brought."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action()
    return closed.value.reply_code, closed.value.reply_text


def test_a_user_limited_to_its_prefix_is_refused_other_queues_with_rabbitmqs_403(broker):
    with connect(broker) as guest:
        guest.channel().queue_declare("bob.q")
        guest.channel().basic_publish("", "bob.q", b"for bob")
    with connect(broker, "alice", "alice-pass") as alice:
        assert refusal(lambda: alice.channel().queue_declare("bob.q")) == (
            403, "ACCESS_REFUSED - access to queue 'bob.q' in vhost '/' refused for user 'alice'")
        assert refusal(lambda: alice.channel().basic_consume("bob.q", lambda *args: None)) == (
            403, "ACCESS_REFUSED - access to queue 'bob.q' in vhost '/' refused for user 'alice'")
        assert refusal(lambda: alice.channel().basic_get("bob.q")) == (
            403, "ACCESS_REFUSED - access to queue 'bob.q' in vhost '/' refused for user 'alice'")
        channel = alice.channel()
        channel.confirm_delivery()
        assert refusal(lambda: channel.basic_publish("amq.direct", "bob.q", b"x")) == (
            403, "ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'alice'")
        channel = alice.channel()
        channel.confirm_delivery()
        assert refusal(lambda: channel.basic_publish("", "alice.q", b"x")) == (  # named as RabbitMQ names it
            403, "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'alice'")
        channel = alice.channel()
        channel.queue_declare("alice.q", auto_delete=True)
        channel.exchange_declare("alice.x", "direct", auto_delete=True)
        assert refusal(lambda: channel.queue_bind("alice.q", "amq.direct", "k")) == (
            403, "ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'alice'")
        channel = alice.channel()
        channel.queue_bind("alice.q", "alice.x", "k")
        channel.confirm_delivery()
        channel.basic_publish("alice.x", "k", b"mine")
        assert channel.basic_get("alice.q", auto_ack=True)[2] == b"mine"
    with connect(broker) as guest:
        assert guest.channel().queue_delete("bob.q").method.message_count == 1


def test_a_queue_that_dead_letters_needs_write_on_its_dead_letter_exchange(broker):
    with connect(broker, "alice", "alice-pass") as alice:
        arguments = {"x-dead-letter-exchange": "amq.fanout"}
        assert refusal(lambda: alice.channel().queue_declare("alice.dl", auto_delete=True, arguments=arguments)) == (
            403, "ACCESS_REFUSED - access to exchange 'amq.fanout' in vhost '/' refused for user 'alice'")
        channel = alice.channel()
        channel.exchange_declare("alice.dlx", "fanout", auto_delete=True)
        channel.queue_declare("alice.dl", auto_delete=True, arguments={"x-dead-letter-exchange": "alice.dlx"})


def test_a_publish_whose_user_id_is_not_the_users_is_refused_with_rabbitmqs_406(broker):
    with connect(broker) as guest:
        channel = guest.channel()
        channel.confirm_delivery()
        channel.basic_publish("", "nowhere", b"x", pika.BasicProperties(user_id="guest"))
        assert refusal(lambda: channel.basic_publish("", "nowhere", b"x", pika.BasicProperties(user_id="root"))) == (
            406, "PRECONDITION_FAILED - user_id property set to 'root' but authenticated user was 'guest'")


def test_a_wrong_password_is_refused_with_403_and_a_utf8_password_logs_in(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        connect(broker, "alice", "wrong")
    assert "ACCESS_REFUSED - PLAIN login refused: user 'alice' - invalid credentials" in str(refused.value)
    with connect(broker, UTF8_USER, UTF8_PASSWORD) as connection:
        assert connection.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_an_unknown_vhost_or_one_without_permissions_is_refused_with_rabbitmqs_530(broker):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as closed:
        connect(broker, vhost="nowhere")
    assert "(530) 'NOT_ALLOWED - vhost nowhere not found'" in str(closed.value)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as closed:
        connect(broker, "alice", "alice-pass", vhost="other")
    assert "(530) \"NOT_ALLOWED - access to vhost 'other' refused for user 'alice'\"" in str(closed.value)


def test_queues_of_the_same_name_in_two_vhosts_stay_apart(broker):
    with connect(broker) as root, connect(broker, vhost="other") as other:
        root.channel().queue_declare("same.q", auto_delete=False)
        other.channel().queue_declare("same.q", durable=True)
        root.channel().basic_publish("", "same.q", b"in /")
        confirmed = other.channel()
        confirmed.confirm_delivery()  # stored before it is confirmed: it must survive the SIGKILL below
        confirmed.basic_publish("", "same.q", b"in other", pika.BasicProperties(delivery_mode=2))
        assert root.channel().basic_get("same.q", auto_ack=True)[2] == b"in /"
        assert root.channel().basic_get("same.q", auto_ack=True)[0] is None
        root.channel().queue_delete("same.q")


def test_users_permissions_and_vhosts_survive_a_sigkill(broker):
    """Runs last: it restarts the module's broker. carol was imported by the broker, not by the test."""
    broker.users_file.write_text("")  # nothing more to import: carol lives in the database alone
    broker.process.restart(crash=True)
    restarted = type(broker)(broker.process)
    with connect(restarted, "carol", "c4rol") as carol:
        carol.channel().queue_declare("carol.q", auto_delete=True)
    with connect(restarted, "alice", "alice-pass") as alice:
        assert refusal(lambda: alice.channel().queue_declare("bob.q"))[0] == 403
    with connect(restarted, vhost="other") as other:
        assert other.channel().basic_get("same.q", auto_ack=True)[2] == b"in other"
    with connect(restarted, UTF8_USER, UTF8_PASSWORD):
        pass


LEGACY_STORE = """
import sys
from twisted.internet import defer, task
from brokerd.storage import registry
from brokerd.interfaces import MessageRecord
from brokerd.proto import messages_pb2

async def write(reactor):
    store = registry.make_store("chunked", sys.argv[1], reactor=reactor)
    await store.open()
    store.save_queue(messages_pb2.QueueRecord(vhost="legacy", name="kept", durable=True))
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT)
    store.append(MessageRecord("", "kept", properties, b"from before"), [("legacy", "kept")])
    await store.sync()
    await store.close()

task.react(lambda reactor: defer.ensureDeferred(write(reactor)))
"""


def test_a_data_directory_from_before_the_access_database_keeps_its_vhosts(tmp_path):
    """Its store's vhosts join the database the first start makes, with every permission for guest."""
    written = subprocess.run([sys.executable, "-c", LEGACY_STORE, str(tmp_path / "brokerd-data")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    running = start_broker(tmp_path, "--backend", "chunked")
    try:
        with connect(running, vhost="legacy") as guest:
            assert guest.channel().basic_get("kept", auto_ack=True)[2] == b"from before"
    finally:
        running.process.stop()
    access = AccessDatabase.in_directory(str(tmp_path / "brokerd-data"))
    assert access.open() is False  # the broker made it
    assert access.vhosts == ["/", "legacy"]
    assert access.permissions_of("guest", "legacy") is not None
