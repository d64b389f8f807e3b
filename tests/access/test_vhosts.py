"""Creating and deleting vhosts on a broker in-process: a deleted vhost takes
its queues, messages and exchanges (from the store too) and its permissions,
and its clients are told so on both protocols."""

import pytest
from pamqp import commands, frame
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from backends.memory.store import MemoryStore
from brokerd.access.database import AccessChangeRefused, AccessDatabase
from brokerd.access.vhosts import add_vhost, delete_vhost
from brokerd.amqp.auth import Authenticator
from brokerd.amqp.settings import AmqpSettings
from brokerd.amqp.server import AmqpServerFactory
from brokerd.errors import NotAllowed
from brokerd.model.broker import Broker
from brokerd.native.server import NativeServerFactory
from brokerd.session.connection import Connection
from tests.support.broker import amqp_frames_in, amqp_server_past_start_ok, decode_frames, make_broker, native_hello


def test_a_created_vhost_is_served_and_a_deleted_one_takes_everything_with_it():
    store = MemoryStore()
    store.open()
    broker = Broker(store, Clock())
    access = AccessDatabase.in_memory()
    vhost = add_vhost(broker, access, "team")
    assert sorted(vhost.exchanges) == [
        "", "amq.direct", "amq.fanout", "amq.headers", "amq.match", "amq.rabbitmq.trace", "amq.topic"]
    access.set_permissions("guest", "team", ".*", ".*", ".*")
    with pytest.raises(AccessChangeRefused):
        add_vhost(broker, access, "team")
    channel = Connection(broker, "team").open_channel(1, None)
    channel.queue_declare("jobs", durable=True)
    channel.exchange_declare("events", "fanout", durable=True)
    channel.queue_bind("jobs", "events")
    assert [record.name for record in store.topology() if hasattr(record, "name")] == ["events", "jobs"]

    assert delete_vhost(broker, access, "team") == 1
    assert list(store.topology()) == []
    assert not access.vhost_exists("team") and access.permissions_of("guest", "team") is None
    assert channel.closed
    with pytest.raises(NotAllowed, match="vhost team not found"):
        broker.vhost("team")
    with pytest.raises(AccessChangeRefused, match="no vhost 'team'"):
        delete_vhost(broker, access, "team")


def test_the_clients_of_a_deleted_vhost_are_told_with_rabbitmqs_320_on_both_protocols():
    broker, clock = make_broker()
    access = AccessDatabase.in_memory()
    add_vhost(broker, access, "team")
    access.set_permissions("guest", "team", ".*", ".*", ".*")
    amqp_wire = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    settings = AmqpSettings(authenticator=Authenticator(access))
    amqp = amqp_server_past_start_ok(AmqpServerFactory(broker, settings), clock, amqp_wire)
    tune_ok = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)
    amqp.dataReceived(frame.marshal(tune_ok, 0) + frame.marshal(commands.Connection.Open(virtual_host="team"), 0))
    native_wire = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5001))
    native = NativeServerFactory(broker, authenticator=settings.authenticator).buildProtocol(None)
    native.makeConnection(native_wire)
    native.dataReceived(native_hello(vhost="team"))
    clock.advance(0)
    assert {connection.vhost.name for connection in broker.connections} == {"team"}
    amqp_wire.clear()
    native_wire.clear()

    delete_vhost(broker, access, "team")
    clock.advance(0)
    (close,) = amqp_frames_in(amqp_wire.value())
    assert (close.reply_code, close.reply_text) == (320, "CONNECTION_FORCED - vhost 'team' is deleted")
    (envelope,) = decode_frames(native_wire.value())
    assert (envelope.connection_close.reply_code, envelope.connection_close.reply_text) == (
        320, "CONNECTION_FORCED - vhost 'team' is deleted")
    assert broker.connections == set()
