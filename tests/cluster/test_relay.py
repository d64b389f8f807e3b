"""A follower's relay to the leader, on real sockets on 127.0.0.1: pika publishing and consuming through it to an
in-process broker, over TLS checked against the broker's certificate too, and with the signed header that makes the
broker see the client rather than the relay; the header sent before the client's first byte; memory bounded while
one side does not read; clients closed at once when no leader is known or reachable; drop_all sending clients to a
new leader; and either side closing the other."""

import hashlib
import os
import random
import shutil
import socket
import tempfile

import pika
import trustme
from cryptography.hazmat.primitives.serialization import Encoding
from pika.adapters.twisted_connection import TwistedProtocolConnection
from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, clientFromString, serverFromString
from twisted.trial import unittest

from backends.memory import MemoryStore
from brokerd.amqp.server import AmqpServerFactory
from brokerd.cluster.relay import RelayFactory
from brokerd.model.broker import Broker
from brokerd.replication.relay_proof import MAX_BODY, RelayHeaderCheck, relay_header
from brokerd.wire.proxied_peer import ProxyHeaderFactory
from tests.support.broker import wait_until
from tests.support.logs import LogWatcher

STEP_TIMEOUT = 10.0
MiB = 1024 * 1024
# What one relayed connection may hold per direction once joined: Twisted's send buffer limit (64 KiB), past which
# the reading side is paused, plus the one read (64 KiB) that crossed it; both directions together.
JOINED_BOUND = 2 * (64 + 64) * 1024


class Peer(protocol.Protocol):
    """One end of a test connection: counts and hashes what it receives, keeps the first 64 KiB of it."""

    def __init__(self, paused=False):
        self.paused = paused
        self.size = 0
        self.head = b""
        self.hash = hashlib.sha256()
        self.made = defer.Deferred()
        self.lost = defer.Deferred()

    def connectionMade(self):
        if self.paused:
            self.transport.pauseProducing()
        self.made.callback(self)

    def dataReceived(self, data):
        self.size += len(data)
        self.hash.update(data)
        if len(self.head) < 65536:
            self.head += data[:65536 - len(self.head)]

    def connectionLost(self, reason):
        self.lost.callback(None)


class Target(protocol.Factory):
    """A server keeping every L{Peer} it accepted; C{paused} ones do not read until resumed."""

    def __init__(self, paused=False):
        self.paused = paused
        self.peers = []

    def buildProtocol(self, address):
        peer = Peer(self.paused)
        self.peers.append(peer)
        return peer


class ClientConnection(TwistedProtocolConnection):
    """pika's Twisted connection, reporting when its TCP connection is gone."""

    def __init__(self, parameters):
        super().__init__(parameters)
        self.lost = defer.Deferred()

    def connectionLost(self, reason=protocol.connectionDone):
        super().connectionLost(reason)
        self.lost.callback(None)


def payload(size, seed):
    return random.Random(seed).randbytes(size)


def closed_port():
    """A port on 127.0.0.1 nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RelayTestCase(unittest.TestCase):
    timeout = 60

    def listen(self, factory, description="tcp:0:interface=127.0.0.1"):
        d = serverFromString(reactor, description).listen(factory)

        def listening(port):
            self.addCleanup(port.stopListening)
            return port.getHost().port

        return d.addCallback(listening)

    @defer.inlineCallbacks
    def relay(self, target, **options):
        """A relay listening on 127.0.0.1 to C{target} (a callable); returns (factory, port)."""
        relay = RelayFactory(reactor, target, **options)
        self.addCleanup(relay.drop_all)
        port = yield self.listen(relay)
        return relay, port

    @defer.inlineCallbacks
    def target(self, paused=False):
        """A L{Target} listening on 127.0.0.1; returns (target, its client endpoint string)."""
        target = Target(paused)
        port = yield self.listen(target)
        return target, f"tcp:127.0.0.1:{port}"

    @defer.inlineCallbacks
    def connect(self, port, paused=False):
        """A raw client L{Peer} connected to C{port}, aborted at cleanup."""
        peer = Peer(paused)
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(protocol.Factory.forProtocol(lambda: peer))
        self.addCleanup(lambda: peer.lost.called or peer.transport.abortConnection())
        return peer

    def broker(self):
        broker = Broker(MemoryStore(), reactor)
        self.addCleanup(broker.stop)
        return broker


class PassThroughTests(RelayTestCase):
    @defer.inlineCallbacks
    def publish_and_consume(self, client):
        channel = yield client.channel()
        yield channel.queue_declare("relayed")
        queue, _ = yield channel.basic_consume("relayed", auto_ack=True)
        channel.basic_publish("", "relayed", b"through the follower",
                              pika.BasicProperties(headers={"hop": "relay"}))
        _, method, properties, body = yield queue.get().addTimeout(STEP_TIMEOUT, reactor)
        return method.routing_key, properties.headers, body

    @defer.inlineCallbacks
    def pika_client(self, endpoint):
        parameters = pika.ConnectionParameters(virtual_host="/", credentials=pika.PlainCredentials("guest", "guest"))
        client = yield endpoint.connect(protocol.Factory.forProtocol(lambda: ClientConnection(parameters)))
        self.addCleanup(lambda: client.lost.called or client.transport.abortConnection())
        yield client.ready
        return client

    @defer.inlineCallbacks
    def test_pika_publishes_and_consumes_through_the_relay(self):
        broker = self.broker()
        amqp_port = yield self.listen(AmqpServerFactory(broker))
        relay, port = yield self.relay(lambda: f"tcp:127.0.0.1:{amqp_port}")
        client = yield self.pika_client(TCP4ClientEndpoint(reactor, "127.0.0.1", port))
        answer = yield self.publish_and_consume(client)
        self.assertEqual(answer, ("relayed", {"hop": "relay"}, b"through the follower"))
        # The broker's client is the relay's own connection to it.
        (connection,) = broker.connections
        (relayed,) = relay.connections()
        self.assertEqual(connection.peer, ("127.0.0.1", relayed.leader.getHost().port))
        self.assertEqual((relay.active, relay.relayed, relay.failures), (1, 1, 0))
        client.close()
        yield client.lost
        yield wait_until(lambda: relay.active == 0 and not broker.connections)

    @defer.inlineCallbacks
    def test_with_a_signed_header_the_leaders_broker_sees_the_client_itself(self):
        secret = os.urandom(32)
        broker = self.broker()
        check = RelayHeaderCheck(secret, "leader", reactor)
        amqp_port = yield self.listen(ProxyHeaderFactory(AmqpServerFactory(broker), check.check, reactor, "--amqp",
                                                         max_body=MAX_BODY))
        relay, port = yield self.relay(
            lambda: f"tcp:127.0.0.1:{amqp_port}",
            header=lambda client: relay_header(secret, "follower", "leader", client.getPeer(), client.getHost(),
                                               reactor.seconds()))
        client = yield self.pika_client(TCP4ClientEndpoint(reactor, "127.0.0.1", port))
        answer = yield self.publish_and_consume(client)
        self.assertEqual(answer, ("relayed", {"hop": "relay"}, b"through the follower"))
        (connection,) = broker.connections
        own = client.transport.getHost()
        self.assertEqual(connection.peer, (own.host, own.port))
        client.close()
        yield client.lost
        yield wait_until(lambda: relay.active == 0 and not broker.connections)

    @defer.inlineCallbacks
    def test_a_tls_client_checks_the_leaders_certificate_and_name_through_the_relay(self):
        ca = trustme.CA()
        leader_certificate = ca.issue_cert("localhost")
        directory = tempfile.mkdtemp(prefix="relay-tls-")
        self.addCleanup(shutil.rmtree, directory)
        os.makedirs(os.path.join(directory, "authorities"))
        leader_certificate.private_key_pem.write_to_path(os.path.join(directory, "key.pem"))
        leader_certificate.cert_chain_pems[0].write_to_path(os.path.join(directory, "cert.pem"))
        ca.cert_pem.write_to_path(os.path.join(directory, "authorities", "ca.pem"))

        broker = self.broker()
        amqps_port = yield self.listen(AmqpServerFactory(broker), f"ssl:0:interface=127.0.0.1"
                                       f":privateKey={directory}/key.pem:certKey={directory}/cert.pem")
        # The relay is told the leader's TLS port as plain TCP: the client's TLS passes through it untouched.
        relay, port = yield self.relay(lambda: f"tcp:127.0.0.1:{amqps_port}")
        endpoint = clientFromString(reactor, f"tls:localhost:{port}:trustRoots={directory}/authorities")
        client = yield self.pika_client(endpoint)
        answer = yield self.publish_and_consume(client)
        self.assertEqual(answer, ("relayed", {"hop": "relay"}, b"through the follower"))
        seen = client.transport.getPeerCertificate().to_cryptography()
        self.assertEqual(seen.public_bytes(Encoding.PEM), leader_certificate.cert_chain_pems[0].bytes())
        self.assertEqual(relay.relayed, 1)

    def test_a_tls_target_string_is_refused_for_it_would_wrap_the_clients_bytes(self):
        relay = RelayFactory(reactor, lambda: None)
        for target in ("tls:leader:5671", "ssl:leader:5671"):
            self.assertRaises(ValueError, relay.endpoint_for, target)


class BackPressureTests(RelayTestCase):
    @defer.inlineCallbacks
    def peak_until(self, relay, condition, bound):
        """Sample C{relay.buffered_bytes()} until C{condition()} holds or the figure passes C{bound}; the peak seen."""
        peak = [0]

        def sampled():
            peak[0] = max(peak[0], relay.buffered_bytes())
            return condition() or peak[0] > bound

        yield wait_until(sampled, timeout=STEP_TIMEOUT)
        return peak[0]

    @defer.inlineCallbacks
    def test_a_target_that_does_not_read_stops_the_relay_reading_the_client(self):
        target, address = yield self.target(paused=True)
        relay, port = yield self.relay(lambda: address)
        client = yield self.connect(port)
        yield wait_until(lambda: target.peers)
        data = payload(64 * MiB, seed=1)
        client.transport.write(data)
        (relayed,) = relay.connections()
        peak = yield self.peak_until(relay, lambda: relayed.client_reading.paused, JOINED_BOUND)
        self.assertLessEqual(peak, JOINED_BOUND)
        self.assertTrue(relayed.client_reading.paused)
        (leader_side,) = target.peers
        self.assertEqual(leader_side.size, 0)
        leader_side.transport.resumeProducing()
        yield wait_until(lambda: leader_side.size >= len(data), timeout=STEP_TIMEOUT)
        self.assertEqual(leader_side.hash.digest(), hashlib.sha256(data).digest())
        self.assertLessEqual(relay.buffered_bytes(), JOINED_BOUND)

    @defer.inlineCallbacks
    def test_a_client_that_does_not_read_stops_the_relay_reading_the_target(self):
        target, address = yield self.target()
        relay, port = yield self.relay(lambda: address)
        client = yield self.connect(port, paused=True)
        yield wait_until(lambda: target.peers)
        (leader_side,) = target.peers
        data = payload(64 * MiB, seed=2)
        leader_side.transport.write(data)
        (relayed,) = relay.connections()
        peak = yield self.peak_until(relay, lambda: relayed.leader_reading.paused, JOINED_BOUND)
        self.assertLessEqual(peak, JOINED_BOUND)
        self.assertEqual(client.size, 0)
        client.transport.resumeProducing()
        yield wait_until(lambda: client.size >= len(data), timeout=STEP_TIMEOUT)
        self.assertEqual(client.hash.digest(), hashlib.sha256(data).digest())

    @defer.inlineCallbacks
    def test_bytes_sent_before_the_leader_answers_are_held_up_to_the_cap_then_all_delivered(self):
        listening = full_listener(self)
        cap = 256 * 1024
        relay, port = yield self.relay(lambda: f"tcp:127.0.0.1:{listening.getsockname()[1]}", pending_cap=cap,
                                       connect_timeout=30)
        client = yield self.connect(port)
        data = payload(8 * MiB, seed=3)
        client.transport.write(data)
        yield wait_until(relay.connections)
        (relayed,) = relay.connections()
        peak = yield self.peak_until(relay, lambda: relayed.client_reading.paused, cap + 64 * 1024)
        self.assertLessEqual(peak, cap + 64 * 1024)
        self.assertIsNone(relayed.leader)
        # The target starts accepting: the SYN the relay sends again gets in, and what was held goes first.
        target = Target()
        listening.setblocking(False)
        port = reactor.adoptStreamPort(listening.fileno(), socket.AF_INET, target)
        self.addCleanup(port.stopListening)
        yield wait_until(lambda: relayed.leader is not None, timeout=STEP_TIMEOUT)
        yield wait_until(lambda: sum(peer.size for peer in target.peers) >= len(data), timeout=STEP_TIMEOUT)
        (leader_side,) = [peer for peer in target.peers if peer.size]
        self.assertEqual(leader_side.hash.digest(), hashlib.sha256(data).digest())


def full_listener(testcase):
    """A listening socket whose accept queue is full: it drops a connecting SYN, so a connection
    to it hangs until the queue is read."""
    listening = socket.socket()
    testcase.addCleanup(listening.close)
    listening.bind(("127.0.0.1", 0))
    listening.listen(0)
    filler = socket.create_connection(listening.getsockname())
    testcase.addCleanup(filler.close)
    return listening


class NoLeaderTests(RelayTestCase):
    @defer.inlineCallbacks
    def assert_closed_promptly(self, target, expected_line, **options):
        log = LogWatcher(self, "brokerd.cluster.relay")
        relay, port = yield self.relay(target, **options)
        client = yield self.connect(port)
        client.transport.write(b"AMQP\x00\x00\x09\x01")
        yield client.lost.addTimeout(3, reactor)
        self.assertEqual(client.size, 0)
        self.assertEqual((relay.active, relay.relayed, relay.failures), (0, 0, 1))
        (line,) = log.texts
        self.assertIn(expected_line, line)
        self.assertIn("closing the client", line)

    def test_with_no_leader_known_the_client_is_closed_at_once(self):
        return self.assert_closed_promptly(lambda: None, "to the leader: no leader is known")

    def test_a_leader_refusing_the_connection_closes_the_client_naming_the_target(self):
        address = f"tcp:127.0.0.1:{closed_port()}"
        return self.assert_closed_promptly(lambda: address, f"to {address}: Connection was refused")

    def test_a_target_that_cannot_be_read_closes_the_client_with_the_reason(self):
        return self.assert_closed_promptly(lambda: "tcp:leader:port-of-no-number", "invalid literal for int()")

    @defer.inlineCallbacks
    def test_a_leader_that_does_not_answer_within_the_timeout_closes_the_client(self):
        listening = full_listener(self)
        address = f"tcp:127.0.0.1:{listening.getsockname()[1]}"
        started = reactor.seconds()
        yield self.assert_closed_promptly(lambda: address, f"to {address}: no connection within 0.3 s",
                                          connect_timeout=0.3)
        self.assertLess(reactor.seconds() - started, 2)


class HeaderTests(RelayTestCase):
    @defer.inlineCallbacks
    def test_the_leader_is_sent_the_header_first_then_every_byte_of_the_client(self):
        target, address = yield self.target()
        relay, port = yield self.relay(lambda: address, header=lambda client: b"client %d;" % client.getPeer().port)
        client = yield self.connect(port)
        client.transport.write(b"sent at once")  # held while the leader's side opens
        yield wait_until(lambda: target.peers and target.peers[0].size)
        client.transport.write(b", then more")
        expected = b"client %d;sent at once, then more" % client.transport.getHost().port
        yield wait_until(lambda: target.peers[0].head == expected)

    @defer.inlineCallbacks
    def test_a_header_that_cannot_be_made_closes_the_client_naming_why(self):
        log = LogWatcher(self, "brokerd.cluster.relay")
        target, address = yield self.target()

        def header(client):
            raise ValueError("unix:/tmp/x is not a TCP address")

        relay, port = yield self.relay(lambda: address, header=header)
        client = yield self.connect(port)
        client.transport.write(b"AMQP\x00\x00\x09\x01")
        yield client.lost.addTimeout(STEP_TIMEOUT, reactor)
        yield wait_until(lambda: target.peers and target.peers[0].lost.called)
        self.assertEqual((client.size, target.peers[0].size), (0, 0))
        self.assertEqual((relay.active, relay.relayed, relay.failures), (0, 0, 1))
        (line,) = log.texts
        self.assertIn("cannot tell the leader who the client is: unix:/tmp/x is not a TCP address", line)


class LeaderChangeTests(RelayTestCase):
    @defer.inlineCallbacks
    def test_drop_all_closes_every_client_and_the_next_ones_reach_the_new_leader(self):
        old, old_address = yield self.target()
        new, new_address = yield self.target()
        leader = [old_address]
        relay, port = yield self.relay(lambda: leader[0])
        clients = []
        for _ in range(2):
            clients.append((yield self.connect(port)))
            clients[-1].transport.write(b"hello old")
        yield wait_until(lambda: [peer.head for peer in old.peers] == [b"hello old"] * 2)

        leader[0] = new_address
        self.assertEqual(relay.drop_all(), 2)
        yield defer.gatherResults([client.lost for client in clients] + [peer.lost for peer in old.peers]).addTimeout(
            STEP_TIMEOUT, reactor)
        self.assertEqual(relay.active, 0)

        client = yield self.connect(port)
        client.transport.write(b"hello new")
        yield wait_until(lambda: [peer.head for peer in new.peers] == [b"hello new"])
        self.assertEqual(len(old.peers), 2)
        self.assertEqual((relay.active, relay.relayed, relay.failures), (1, 3, 0))


class ClosingTests(RelayTestCase):
    @defer.inlineCallbacks
    def test_a_client_closing_closes_the_leaders_side_after_its_last_bytes(self):
        # The target reads only once the relay has stopped reading the client: the client's last bytes fill the
        # leader's side again, which the relay closes with its send buffer full and must still close once written.
        target, address = yield self.target(paused=True)
        relay, port = yield self.relay(lambda: address)
        client = yield self.connect(port)
        yield wait_until(lambda: target.peers)
        data = payload(16 * MiB, seed=4)
        client.transport.write(data)
        client.transport.loseConnection()
        (relayed,) = relay.connections()
        yield wait_until(lambda: relayed.client_reading.paused)
        (leader_side,) = target.peers
        leader_side.transport.resumeProducing()
        yield leader_side.lost.addTimeout(STEP_TIMEOUT, reactor)
        self.assertEqual(leader_side.hash.digest(), hashlib.sha256(data).digest())
        yield wait_until(lambda: relay.active == 0)

    @defer.inlineCallbacks
    def test_the_leader_closing_closes_the_client_after_its_last_bytes(self):
        target, address = yield self.target()
        relay, port = yield self.relay(lambda: address)
        client = yield self.connect(port)
        yield wait_until(lambda: target.peers)
        data = payload(4 * MiB, seed=5)
        (leader_side,) = target.peers
        leader_side.transport.write(data)
        leader_side.transport.loseConnection()
        yield client.lost.addTimeout(STEP_TIMEOUT, reactor)
        self.assertEqual(client.hash.digest(), hashlib.sha256(data).digest())
        yield wait_until(lambda: relay.active == 0)
