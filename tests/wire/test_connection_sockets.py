"""Both protocol servers, in-process on real sockets, make the broker know each client connection:
protocol, addresses, user, vhost, client properties, channels, consumers and counters."""

import pika
from pika.adapters.twisted_connection import TwistedProtocolConnection
from twisted.internet import defer, protocol, reactor
from twisted.protocols.policies import WrappingFactory
from twisted.trial import unittest

from backends.memory import MemoryStore
from brokerd.amqp.server import AmqpServerFactory
from brokerd.model.broker import Broker
from brokerd.native.server import NativeServerFactory
from brokerd.wire.read_buffer import READ_SIZE
from tests.support.broker import DeliveryCollector, connect_client, listen_native, wait_until

STEP_TIMEOUT = 10.0


def only_connection(broker):
    (connection,) = broker.connections
    return connection


def wall_clock_ms():
    return int(reactor.seconds() * 1000)


class NativeConnectionTests(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.broker, self.endpoint = listen_native(self)

    @defer.inlineCallbacks
    def test_broker_knows_a_native_connection_with_its_facts_and_counters(self):
        before = wall_clock_ms()
        client = yield connect_client(self, self.endpoint)
        connection = only_connection(self.broker)
        client_address, server_address = client.transport.getHost(), client.transport.getPeer()
        self.assertEqual(connection.protocol, "native")
        self.assertEqual(connection.peer, (client_address.host, client_address.port))
        self.assertEqual(connection.local, (server_address.host, server_address.port))
        self.assertEqual(
            connection.name, f"127.0.0.1:{client_address.port} -> 127.0.0.1:{server_address.port}"
        )
        self.assertEqual(connection.user, "guest")  # the native client logs in as guest by default
        self.assertEqual(connection.vhost.name, "/")
        self.assertEqual(connection.client_name, "brokerd-native-client")
        self.assertTrue(before <= connection.connected_at <= wall_clock_ms())

        channel = yield client.channel()
        yield channel.queue_declare("counted")
        collector = DeliveryCollector()
        tag = yield channel.basic_consume("counted", collector)
        for body in (b"a", b"b", b"c"):
            channel.basic_publish("", "counted", body)
        deliveries = yield collector.wait_for(3)
        channel.basic_ack(deliveries[-1].delivery_tag, multiple=True)
        yield wait_until(lambda: connection.messages_acked == 3)
        self.assertEqual([consumer.tag for consumer in connection.consumers()], [tag])
        self.assertEqual(connection.message_counts(), {
            "messages_published": 3, "messages_delivered": 3, "messages_redelivered": 0, "messages_acked": 3,
        })
        self.assertGreater(connection.bytes_received, 3 * len(b"counted"))
        self.assertGreater(connection.bytes_sent, 3 * len(b"counted"))

        client.transport.loseConnection()
        yield client.closed
        yield wait_until(lambda: not self.broker.connections)


class ClientConnection(TwistedProtocolConnection):
    """pika's Twisted connection, reporting when its TCP connection is gone."""

    def __init__(self, parameters):
        super().__init__(parameters)
        self.lost = defer.Deferred()

    def connectionLost(self, reason=protocol.connectionDone):
        super().connectionLost(reason)
        self.lost.callback(None)


class AmqpConnectionTests(unittest.TestCase):
    timeout = 30

    def setUp(self):
        self.broker = Broker(MemoryStore(), reactor)
        self.addCleanup(self.broker.stop)
        port = reactor.listenTCP(0, AmqpServerFactory(self.broker), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.port = port.getHost().port

    @defer.inlineCallbacks
    def connect(self, **client_properties):
        parameters = pika.ConnectionParameters(
            host="127.0.0.1", port=self.port, virtual_host="/", credentials=pika.PlainCredentials("guest", "guest"),
            client_properties=client_properties,
        )
        creator = protocol.ClientCreator(reactor, ClientConnection, parameters)
        client = yield creator.connectTCP("127.0.0.1", self.port, timeout=STEP_TIMEOUT)
        self.addCleanup(self.disconnect, client)
        yield client.ready
        return client

    def disconnect(self, client):
        if not client.lost.called:
            client.transport.abortConnection()
        return client.lost

    @defer.inlineCallbacks
    def test_broker_knows_a_pika_connection_with_its_facts_and_counters(self):
        before = wall_clock_ms()
        client = yield self.connect(connection_name="orders-service")
        connection = only_connection(self.broker)
        client_address = client.transport.getHost()
        self.assertEqual(connection.protocol, "AMQP 0-9-1")
        self.assertEqual(connection.peer, ("127.0.0.1", client_address.port))
        self.assertEqual(connection.local, ("127.0.0.1", self.port))
        self.assertEqual(connection.name, f"127.0.0.1:{client_address.port} -> 127.0.0.1:{self.port}")
        self.assertEqual(connection.user, "guest")
        self.assertEqual(connection.vhost.name, "/")
        self.assertEqual(connection.client_name, "orders-service")
        self.assertEqual(connection.client_properties["connection_name"], "orders-service")
        self.assertEqual(connection.client_properties["product"], "Pika Python Client Library")
        self.assertTrue(connection.client_properties["capabilities"]["consumer_cancel_notify"])
        self.assertTrue(before <= connection.connected_at <= wall_clock_ms())

        channel = yield client.channel()
        yield channel.queue_declare("counted")
        queue, tag = yield channel.basic_consume("counted")
        self.assertEqual([consumer.tag for consumer in connection.consumers()], [tag])
        self.assertEqual([channel.name for channel in connection.channels.values()], [f"{connection.name} (1)"])
        for body in (b"a", b"b", b"c"):
            channel.basic_publish("", "counted", body)
        for _ in range(3):
            _, method, _, _ = yield queue.get()
        channel.basic_ack(method.delivery_tag, multiple=True)
        yield wait_until(lambda: connection.messages_acked == 3)
        self.assertEqual(connection.message_counts(), {
            "messages_published": 3, "messages_delivered": 3, "messages_redelivered": 0, "messages_acked": 3,
        })
        self.assertGreater(connection.bytes_received, 3 * len(b"counted"))
        self.assertGreater(connection.bytes_sent, 3 * len(b"counted"))

        client.close()
        yield client.lost
        yield wait_until(lambda: not self.broker.connections)


class ReadSizeTests(unittest.TestCase):
    """Both servers read a connection up to READ_SIZE bytes at a time (Twisted's own default is 64 KiB), through
    a wrapping transport (as TLS wraps the socket's) too: a 64 KiB message comes in one read, not two joined."""

    timeout = 30

    @defer.inlineCallbacks
    def socket_of_a_connection(self, factory):
        """Listen with C{factory} on a real port, connect a plain client; the server side's socket transport."""
        accepted = []

        class Recording(type(factory)):
            def buildProtocol(self, address):
                built = super().buildProtocol(address)
                accepted.append(built)
                return built

        factory.__class__ = Recording
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        client = yield protocol.ClientCreator(reactor, protocol.Protocol).connectTCP("127.0.0.1",
                                                                                     port.getHost().port)
        self.addCleanup(client.transport.loseConnection)
        yield wait_until(lambda: accepted and accepted[0].transport is not None)
        transport = accepted[0].transport
        while not hasattr(type(transport), "bufferSize"):
            transport = transport.transport
        return transport

    @defer.inlineCallbacks
    def test_the_amqp_and_native_servers_read_256_kib_at_a_time(self):
        broker = Broker(MemoryStore(), reactor)
        self.addCleanup(broker.stop)
        for factory in (AmqpServerFactory(broker), NativeServerFactory(broker)):
            socket = yield self.socket_of_a_connection(factory)
            self.assertEqual(socket.bufferSize, READ_SIZE)
            self.assertEqual(READ_SIZE, 256 * 1024)

    @defer.inlineCallbacks
    def test_a_wrapped_transport_has_its_socket_read_256_kib_at_a_time(self):
        broker = Broker(MemoryStore(), reactor)
        self.addCleanup(broker.stop)
        socket = yield self.socket_of_a_connection(WrappingFactory(AmqpServerFactory(broker)))
        self.assertEqual(socket.bufferSize, READ_SIZE)
