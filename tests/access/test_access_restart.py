"""Users, permissions and vhosts outlive a SIGKILL on every durable backend, and
two vhosts holding queues of the same name keep their messages apart across it."""

import contextlib

import pika
import pika.exceptions
import pytest

from brokerd.access.database import AccessDatabase
from tests.support.client_broker import pika_parameters, start_broker

DURABLE_BACKENDS = ("sqlite", "filelog", "chunked")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(broker, user="guest", password="guest", vhost="/"):
    return contextlib.closing(pika.BlockingConnection(pika_parameters(broker, user, password, virtual_host=vhost)))


def publish_confirmed(broker, vhost, body):
    with connect(broker, vhost=vhost) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("orders", durable=True)
        channel.basic_publish("", "orders", body, PERSISTENT, mandatory=True)  # raises unless confirmed


@pytest.mark.parametrize("backend", DURABLE_BACKENDS)
def test_users_permissions_vhosts_and_their_messages_survive_a_sigkill(tmp_path, backend):
    access = AccessDatabase.in_directory(str(tmp_path / "brokerd-data"))
    access.open()
    access.add_user("alice", "alice-pass")
    access.set_permissions("alice", "/", r"^alice\.", r"^alice\.", r"^alice\.")
    access.add_vhost("shop")
    access.set_permissions("guest", "shop", ".*", ".*", ".*")
    running = start_broker(tmp_path, "--backend", backend)
    try:
        publish_confirmed(running, "/", b"in slash")
        publish_confirmed(running, "shop", b"in shop")
        running.process.restart(crash=True)
        restarted = type(running)(running.process)
        with connect(restarted, vhost="shop") as shop:
            assert shop.channel().basic_get("orders", auto_ack=True)[2] == b"in shop"
        with connect(restarted) as slash:
            channel = slash.channel()
            assert channel.basic_get("orders", auto_ack=True)[2] == b"in slash"
            assert channel.basic_get("orders", auto_ack=True)[0] is None  # nothing of shop's crossed over
        with connect(restarted, "alice", "alice-pass") as alice:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                alice.channel().queue_declare("bob.q")
            assert refused.value.reply_code == 403
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika_parameters(restarted, "alice", "wrong"))
    finally:
        running.process.stop()
