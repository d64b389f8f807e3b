"""A listener that reads the PROXY header a connection may start with, on real sockets on 127.0.0.1: a client
without one is served byte for byte as before; after a believed header the protocol (an HTTP site included) sees
the client the header names, and every byte after it; a refused header, or one declaring more than the cap, drops
the connection before its protocol sees a byte, logged with the reason."""

from twisted.internet import defer, protocol, reactor
from twisted.internet.address import IPv4Address
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.testing import StringTransport
from twisted.trial import unittest
from twisted.web import resource, server

from brokerd.wire.proxied_peer import ProxyHeaderFactory
from brokerd.wire.proxy_header import SIGNATURE, HeaderRefused, decode, encode, field
from brokerd.wire.switching_factory import SwitchingFactory
from tests.support.broker import wait_until
from tests.support.logs import LogWatcher

STEP_TIMEOUT = 10.0
CLIENT = IPv4Address("TCP", "203.0.113.7", 40123)
LISTENER = IPv4Address("TCP", "127.0.0.1", 5672)
TRUSTED = 0xF0  # the field the tests' check believes


def check(header):
    """Believes a header whose last field is TRUSTED with the value b"yes"."""
    decoded = decode(header)
    if decoded.fields[-1:] != ((TRUSTED, b"yes"),):
        raise HeaderRefused("the test does not believe it")
    return decoded.source


def believed_header():
    return encode(CLIENT, LISTENER, field(TRUSTED, b"yes"))


class Served(protocol.Protocol):
    """The listener's own protocol: keeps the bytes it is given and the peer its transport names at each step."""

    def __init__(self):
        self.received = b""
        self.peers = []
        self.made = defer.Deferred()
        self.lost = defer.Deferred()

    def connectionMade(self):
        self.made.callback(self.transport.getPeer())

    def dataReceived(self, data):
        self.received += data
        self.peers.append(self.transport.getPeer())
        self.transport.write(b"got %d" % len(self.received))

    def connectionLost(self, reason):
        self.lost.callback(reason.type)


class ServedFactory(protocol.Factory):
    def __init__(self):
        self.built = []

    def buildProtocol(self, address):
        served = Served()
        self.built.append(served)
        return served


class Client(protocol.Protocol):
    def __init__(self):
        self.received = b""
        self.lost = defer.Deferred()

    def dataReceived(self, data):
        self.received += data

    def connectionLost(self, reason):
        self.lost.callback(None)


class ProxiedPeerTests(unittest.TestCase):
    def setUp(self):
        self.log = LogWatcher(self, "brokerd.wire.refusal_log")

    @defer.inlineCallbacks
    def listen(self, factory):
        """C{factory} behind a header reader on 127.0.0.1; returns the reader."""
        listener = ProxyHeaderFactory(factory, check, reactor, "--amqp")
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(listener)
        self.addCleanup(port.stopListening)
        self.port = port.getHost().port
        return listener

    @defer.inlineCallbacks
    def connect(self):
        client = Client()
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", self.port).connect(protocol.Factory.forProtocol(lambda: client))
        self.addCleanup(lambda: client.lost.called or client.transport.abortConnection())
        return client

    @defer.inlineCallbacks
    def served_one(self, factory):
        yield wait_until(lambda: factory.built, STEP_TIMEOUT)
        (served,) = factory.built
        return served

    @defer.inlineCallbacks
    def test_a_client_without_a_header_is_served_byte_for_byte_at_its_own_address(self):
        factory = ServedFactory()
        yield self.listen(factory)
        client = yield self.connect()
        served = yield self.served_one(factory)
        made_peer = yield served.made
        client.transport.write(b"AMQP\x00\x00\x09\x01")
        yield wait_until(lambda: client.received == b"got 8", STEP_TIMEOUT)
        client.transport.write(SIGNATURE + b" and more")  # a signature after the first bytes is data
        yield wait_until(lambda: served.received == b"AMQP\x00\x00\x09\x01" + SIGNATURE + b" and more", STEP_TIMEOUT)
        own = client.transport.getHost()
        self.assertEqual((made_peer.host, made_peer.port), (own.host, own.port))
        self.assertEqual({(peer.host, peer.port) for peer in served.peers}, {(own.host, own.port)})
        self.assertIs(served.transport.transport.protocol, served, "the socket delivers to it directly")
        self.assertEqual(self.log.texts, [])

    @defer.inlineCallbacks
    def test_after_a_believed_header_the_protocol_sees_the_client_it_names_and_every_byte_after_it(self):
        factory = ServedFactory()
        yield self.listen(factory)
        client = yield self.connect()
        client.transport.write(believed_header() + b"AMQP\x00\x00\x09\x01")
        served = yield self.served_one(factory)
        yield wait_until(lambda: client.received == b"got 8", STEP_TIMEOUT)
        self.assertEqual(served.received, b"AMQP\x00\x00\x09\x01")
        self.assertEqual(served.peers, [CLIENT])
        self.assertEqual(served.transport.getHost().port, self.port, "its own end is the listener's")
        client.transport.loseConnection()
        yield served.lost

    def test_a_header_arriving_a_byte_at_a_time_is_read_whole(self):
        factory = ServedFactory()
        listener = ProxyHeaderFactory(factory, check, reactor, "--amqp")
        gate = listener.buildProtocol(LISTENER)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 50000))
        transport.protocol = gate
        gate.makeConnection(transport)
        (served,) = factory.built
        for byte in believed_header() + b"hello":
            transport.protocol.dataReceived(bytes([byte]))
        self.assertIs(transport.protocol, served)
        self.assertEqual((served.received, served.peers[0]), (b"hello", CLIENT))

    @defer.inlineCallbacks
    def assert_dropped_unread(self, data, reason):
        factory = ServedFactory()
        yield self.listen(factory)
        client = yield self.connect()
        own = client.transport.getHost()
        client.transport.write(data)
        yield client.lost.addTimeout(STEP_TIMEOUT, reactor)
        served = yield self.served_one(factory)
        yield served.lost
        self.assertEqual((client.received, served.received), (b"", b""))
        self.assertEqual(self.log.texts, [
            f"refused --amqp client 127.0.0.1:{own.port} before believing its PROXY header: {reason}"])

    def test_a_header_the_check_refuses_drops_the_connection_before_its_protocol_sees_a_byte(self):
        return self.assert_dropped_unread(encode(CLIENT, LISTENER, field(TRUSTED, b"no")) + b"AMQP\x00\x00\x09\x01",
                                          "the test does not believe it")

    def test_a_declared_length_past_the_cap_is_refused_from_the_fixed_bytes_alone(self):
        return self.assert_dropped_unread(SIGNATURE + bytes([0x21, 0x11, 0xFF, 0xFF]),
                                          "it declares 65535 bytes after its fixed part, more than 512")

    @defer.inlineCallbacks
    def test_with_no_protocol_for_the_connection_it_is_closed_at_once(self):
        yield self.listen(SwitchingFactory("amqp"))  # nothing in place
        client = yield self.connect()
        yield client.lost.addTimeout(STEP_TIMEOUT, reactor)
        self.assertEqual(client.received, b"")

    @defer.inlineCallbacks
    def test_an_http_site_behind_it_answers_and_names_the_believed_client(self):
        class Who(resource.Resource):
            isLeaf = True

            def render_GET(self, request):
                address = request.getClientAddress()
                return f"{address.host}:{address.port}".encode()

        yield self.listen(server.Site(Who()))
        client = yield self.connect()
        client.transport.write(believed_header() + b"GET / HTTP/1.0\r\n\r\n")
        yield client.lost.addTimeout(STEP_TIMEOUT, reactor)
        self.assertTrue(client.received.startswith(b"HTTP/1.0 200 OK"), client.received[:40])
        self.assertTrue(client.received.endswith(b"\r\n\r\n203.0.113.7:40123"))
