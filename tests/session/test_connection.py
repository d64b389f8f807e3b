"""The protocol-free connection and the roles the model calls up through, in-process on a Clock.

A L{Connection} knows its client's facts, channels, consumers and counters; the
model reaches a consumer only as an L{IConsumer}, an exclusive queue's owner
only as an L{IQueueOwner}, and the expiry timer its queue only as an
L{IExpiringQueue}: each provider is checked with C{verifyObject}.
"""

import ast
import pathlib

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.testing import StringTransport
from zope.interface.verify import verifyObject

from brokerd.interfaces import IChannelPeer, IConsumer, IExpiringQueue, IQueueOwner
from brokerd.session.connection import AMQP_0_9_1, Connection
from tests.support.broker import RecordingPeer, make_broker, open_channel, properties
from tests.support.paths import ROOT

SOURCES = ROOT / "brokerd"


def test_connection_is_an_exclusive_queue_owner():
    broker, _ = make_broker()
    connection = Connection(broker, "/")
    verifyObject(IQueueOwner, connection)


def test_channel_consumers_are_iconsumers_and_queues_are_expiring_queues():
    broker, _ = make_broker()
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    tag = channel.basic_consume("q")
    verifyObject(IConsumer, channel.consumers[tag])
    verifyObject(IExpiringQueue, broker.vhost("/").queues["q"])
    verifyObject(IChannelPeer, peer)


def test_direct_reply_consumer_is_an_iconsumer():
    broker, _ = make_broker()
    channel, _ = open_channel(broker)
    tag = channel.basic_consume("amq.rabbitmq.reply-to", no_ack=True)
    verifyObject(IConsumer, channel.consumers[tag])


def test_exclusive_queues_are_owned_and_disowned_through_the_owner_role():
    broker, _ = make_broker()
    channel, _ = open_channel(broker)
    connection = channel.connection
    name, _, _ = channel.queue_declare("", exclusive=True)
    queue = broker.vhost("/").queues[name]
    assert queue.owner is connection
    assert connection.exclusive_queues == {queue}
    channel.queue_delete(name)
    assert connection.exclusive_queues == set()


def test_message_expiry_calls_the_queue_back_through_its_public_role():
    """A message behind the head expires at its time: the expiry timer called C{expire_due}."""
    broker, clock = make_broker()
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-message-ttl": 1000})
    channel.basic_publish("", "q", properties(), b"short-lived")
    channel.basic_publish("", "q", properties(expiration="100"), b"shorter-lived")
    clock.advance(0.1)
    assert broker.vhost("/").queues["q"].message_count == 1
    clock.advance(1)
    assert broker.vhost("/").queues["q"].message_count == 0


def test_in_process_connection_facts():
    broker, clock = make_broker()
    clock.advance(1234.5678)
    connection = Connection(broker, "/", "tester")
    assert connection in broker.connections
    assert connection.protocol is None
    assert connection.peer is None and connection.local is None
    assert connection.user is None
    assert connection.client_properties == {}
    assert connection.vhost is broker.vhost("/")
    assert connection.connected_at == 1234567
    assert connection.name == f"in-process connection {connection.number}"
    connection.close()
    assert connection not in broker.connections


def test_connection_named_after_its_transport_addresses_as_rabbitmq_names_them():
    broker, clock = make_broker()
    clock.advance(10)
    transport = StringTransport(
        hostAddress=IPv4Address("TCP", "127.0.0.1", 5672), peerAddress=IPv4Address("TCP", "127.0.0.1", 54321)
    )
    properties_sent = {"product": "pika", "connection_name": "orders"}
    connection = Connection(broker, "/", "orders", AMQP_0_9_1, transport, "guest", properties_sent)
    properties_sent["product"] = "changed later"
    assert connection.name == "127.0.0.1:54321 -> 127.0.0.1:5672"
    assert connection.peer == ("127.0.0.1", 54321)
    assert connection.local == ("127.0.0.1", 5672)
    assert connection.protocol == "AMQP 0-9-1"
    assert connection.user == "guest"
    assert connection.client_properties == {"product": "pika", "connection_name": "orders"}  # a copy
    assert connection.connected_at == 10000
    channel = connection.open_channel(3, RecordingPeer())
    assert channel.name == "127.0.0.1:54321 -> 127.0.0.1:5672 (3)"

    six = StringTransport(hostAddress=IPv6Address("TCP", "::1", 5672), peerAddress=IPv6Address("TCP", "::1", 60940))
    assert Connection(broker, "/", transport=six).name == "[::1]:60940 -> [::1]:5672"
    unix = StringTransport(hostAddress=UNIXAddress("/run/brokerd.sock"), peerAddress=UNIXAddress(None))
    assert Connection(broker, "/", transport=unix).local == ("UNIXAddress('/run/brokerd.sock')", None)


def test_consumers_are_listed_across_channels():
    broker, _ = make_broker()
    first, _ = open_channel(broker)
    connection = first.connection
    second, _ = open_channel(broker, 2, connection)
    first.queue_declare("a")
    first.queue_declare("b")
    tags = [first.basic_consume("a"), second.basic_consume("a"), second.basic_consume("b")]
    assert [consumer.tag for consumer in connection.consumers()] == tags
    assert [consumer.channel for consumer in connection.consumers()] == [first, second, second]
    connection.close_channel(2)
    assert [consumer.tag for consumer in connection.consumers()] == tags[:1]


def test_message_counters_move_and_outlive_closed_channels():
    broker, clock = make_broker()
    publisher, _ = open_channel(broker)
    connection = publisher.connection
    consumer_channel, peer = open_channel(broker, 2, connection)
    publisher.queue_declare("q")
    for body in (b"one", b"two", b"three"):
        publisher.basic_publish("", "q", properties(), body)
    publisher.basic_publish("", "nowhere", properties(), b"unroutable")  # published all the same
    consumer_channel.basic_consume("q")
    clock.advance(0)
    assert peer.bodies() == [b"one", b"two", b"three"]
    consumer_channel.basic_ack(1)
    consumer_channel.basic_nack(2, requeue=True)  # comes back, redelivered
    clock.advance(0)
    consumer_channel.basic_ack(0, multiple=True)
    assert (publisher.messages_published, consumer_channel.messages_delivered) == (4, 4)
    assert (consumer_channel.messages_redelivered, consumer_channel.messages_acked) == (1, 3)
    expected = {"messages_published": 4, "messages_delivered": 4, "messages_redelivered": 1, "messages_acked": 3}
    assert connection.message_counts() == expected
    connection.close_channel(1)
    connection.close_channel(2)
    assert connection.message_counts() == expected
    assert (connection.messages_published, connection.messages_delivered) == (4, 4)
    assert (connection.messages_redelivered, connection.messages_acked) == (1, 3)


def test_basic_get_counts_as_delivered_and_transactions_count_at_commit():
    broker, _ = make_broker()
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.tx_select()
    channel.basic_publish("", "q", properties(), b"held")
    assert channel.messages_published == 0
    channel.tx_commit()
    assert channel.messages_published == 1
    tag, redelivered, _, _ = channel.basic_get("q")
    channel.basic_ack(tag)
    assert (channel.messages_delivered, channel.messages_acked) == (1, 0)  # the ack waits for commit
    channel.tx_commit()
    assert (channel.messages_delivered, channel.messages_redelivered, channel.messages_acked) == (1, 0, 1)


def test_model_and_channel_take_time_only_from_the_injected_clock():
    """No module of the model, the channel or the connection imports the global reactor."""
    modules = sorted((SOURCES / "model").glob("*.py")) + sorted((SOURCES / "session").glob("*.py"))
    offenders = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "twisted.internet":
                if any(alias.name == "reactor" for alias in node.names):
                    offenders.append(path.name)
            elif isinstance(node, ast.Import) and any(alias.name == "twisted.internet.reactor" for alias in node.names):
                offenders.append(path.name)
    assert offenders == []
