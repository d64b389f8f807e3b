"""A port that stays open while what serves it changes: closed to clients with nothing in place,
then each new connection served by the factory of the moment, earlier ones left as they are."""

from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.trial import unittest

from brokerd.wire.switching_factory import SwitchingFactory


class Greeter(protocol.Protocol):
    def connectionMade(self):
        self.transport.write(self.factory.greeting)


class Greeting(protocol.Factory):
    protocol = Greeter

    def __init__(self, greeting):
        self.greeting = greeting
        self.starts = self.stops = 0

    def startFactory(self):
        self.starts += 1

    def stopFactory(self):
        self.stops += 1


class Reader(protocol.Protocol):
    def __init__(self):
        self.received = b""
        self.closed = defer.Deferred()
        self.got = defer.Deferred()

    def dataReceived(self, data):
        self.received += data
        if not self.got.called:
            self.got.callback(self.received)

    def connectionLost(self, reason):
        self.closed.callback(self.received)


class SwitchingFactoryTests(unittest.TestCase):
    @defer.inlineCallbacks
    def setUp(self):
        self.switch = SwitchingFactory("amqp")
        self.port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self.switch)
        self.addCleanup(self.port.stopListening)
        self.clients = []
        self.addCleanup(lambda: [client.transport.abortConnection() for client in self.clients
                                 if client.transport.connected])

    @defer.inlineCallbacks
    def connect(self):
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port)
        client = yield endpoint.connect(protocol.Factory.forProtocol(Reader))
        self.clients.append(client)
        return client

    @defer.inlineCallbacks
    def test_with_nothing_in_place_a_connection_is_closed_at_once(self):
        client = yield self.connect()
        self.assertEqual((yield client.closed), b"")

    @defer.inlineCallbacks
    def test_each_connection_goes_to_the_factory_in_place_when_it_arrives(self):
        first, second = Greeting(b"first"), Greeting(b"second")
        self.switch.use(first)
        early = yield self.connect()
        self.assertEqual((yield early.got), b"first")
        self.switch.use(second)
        late = yield self.connect()
        self.assertEqual((yield late.got), b"second")
        self.assertTrue(early.transport.connected, "an earlier connection stays")
        self.assertEqual((first.starts, first.stops, second.starts), (1, 1, 1))
        self.switch.use(None)
        self.assertEqual(second.stops, 1)
        refused = yield self.connect()
        self.assertEqual((yield refused.closed), b"")
