"""Shared test fixtures: a broker on a fake clock, a recording channel peer,
an AMQP server driven over a StringTransport, and a real broker listening on
127.0.0.1 for protocol tests."""

import struct

from pamqp import commands
from pamqp import frame as pamqp_frame
from twisted.internet import defer, task
from zope.interface import implementer

from backends.memory import MemoryStore
from brokerd.amqp.frames import PROTOCOL_HEADER
from brokerd.interfaces import IChannelPeer
from brokerd.model.broker import Broker
from brokerd.native.framing import PROTOCOL_VERSION
from brokerd.native.server import NativeServerFactory
from brokerd.proto import messages_pb2
from brokerd.session.connection import Connection


@implementer(IChannelPeer)
class RecordingPeer:
    """An IChannelPeer that keeps what the broker pushed, for assertions."""

    def __init__(self):
        self.deliveries = []  # (consumer_tag, delivery_tag, redelivered, message)
        self.runs = []  # (consumer_tag, [delivery tags]) of each deliver_run
        self.returns = []  # (reply_code, reply_text, message)
        self.confirms = []  # (sequence, multiple, ack)
        self.cancelled = []  # consumer tags

    def deliver(self, consumer_tag, delivery_tag, redelivered, message):
        self.deliveries.append((consumer_tag, delivery_tag, redelivered, message))

    def deliver_run(self, consumer_tag, deliveries):
        self.runs.append((consumer_tag, [delivery_tag for delivery_tag, _, _ in deliveries]))
        for delivery_tag, redelivered, message in deliveries:
            self.deliver(consumer_tag, delivery_tag, redelivered, message)

    def returned(self, reply_code, reply_text, message):
        self.returns.append((reply_code, reply_text, message))

    def publish_confirmed(self, sequence, multiple, ack):
        self.confirms.append((sequence, multiple, ack))

    def consumer_cancelled(self, consumer_tag):
        self.cancelled.append(consumer_tag)

    def bodies(self):
        return [message.body for _, _, _, message in self.deliveries]


class HandSyncedStore(MemoryStore):
    """A memory store whose sync() Deferreds fire only when the test fires them."""

    def __init__(self):
        super().__init__()
        self.syncs = []

    def sync(self):
        synced = defer.Deferred()
        self.syncs.append(synced)
        return synced


def make_broker(store=None):
    """A broker on a memory store (unless given) and a Clock; returns (broker, clock)."""
    clock = task.Clock()
    return Broker(store if store is not None else MemoryStore(), clock), clock


def amqp_server_past_start_ok(factory, clock, transport, client_properties=None):
    """
    An AMQP server protocol of C{factory} on C{transport} (a StringTransport)
    that has read the protocol header and guest's PLAIN start-ok, and sent its
    connection.tune: what is left is the client's tune-ok and open.
    """
    protocol = factory.buildProtocol(None)
    protocol.makeConnection(transport)
    protocol.dataReceived(PROTOCOL_HEADER)
    start_ok = commands.Connection.StartOk(
        client_properties=client_properties or {}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
    )
    protocol.dataReceived(pamqp_frame.marshal(start_ok, 0))
    clock.advance(0)
    return protocol


def amqp_frames_in(data):
    """The pamqp frames in C{data}, a run of whole AMQP frames."""
    found, offset = [], 0
    while offset < len(data):
        size = struct.unpack_from(">I", data, offset + 3)[0]
        found.append(pamqp_frame.unmarshal(data[offset : offset + 8 + size])[2])
        offset += 8 + size
    return found


def open_channel(broker, channel_id=1, connection=None):
    """Opens a channel on a new (or the given) connection; returns (channel, peer)."""
    connection = connection if connection is not None else Connection(broker, "/")
    peer = RecordingPeer()
    return connection.open_channel(channel_id, peer), peer


def properties(persistent=False, **fields):
    """BasicProperties with the given fields; persistent sets delivery mode 2."""
    props = messages_pb2.BasicProperties(**fields)
    if persistent:
        props.delivery_mode = messages_pb2.PERSISTENT
    return props


def listen_native(testcase, store=None, max_frame_size=None):
    """
    Start a broker with a native listener on 127.0.0.1, port 0, stopped at
    test cleanup. Returns (broker, endpoint string for the client).
    """
    from twisted.internet import reactor

    broker = Broker(store if store is not None else MemoryStore(), reactor)
    factory = NativeServerFactory(broker) if max_frame_size is None else NativeServerFactory(broker, max_frame_size)
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    testcase.addCleanup(port.stopListening)
    testcase.addCleanup(broker.stop)
    return broker, f"tcp:127.0.0.1:{port.getHost().port}"


def wait_until(predicate, timeout=5.0, interval=0.01):
    """A Deferred firing once C{predicate()} is true; fails after C{timeout} seconds."""
    from twisted.internet import reactor

    deadline = reactor.seconds() + timeout
    d = defer.Deferred()

    def check():
        if predicate():
            d.callback(None)
        elif reactor.seconds() > deadline:
            d.errback(AssertionError(f"condition not met within {timeout} s: {predicate}"))
        else:
            reactor.callLater(interval, check)

    check()
    return d


@defer.inlineCallbacks
def connect_client(testcase, endpoint, vhost="/"):
    """A ready native client, disconnected (and waited for) at test cleanup."""
    from twisted.internet import reactor

    from brokerd.native.client import connect

    client = yield connect(reactor, endpoint, vhost=vhost)

    def disconnect():
        if client.transport is not None and client.transport.connected:
            client.transport.loseConnection()
        return client.closed

    testcase.addCleanup(disconnect)
    return client


# -- native protocol helpers (shared by the native protocol and error tests)


class DeliveryCollector:
    """A C{basic_consume} callback that keeps every L{Delivery} and can wait for a count."""

    def __init__(self, ack=False):
        self.deliveries = []
        self._ack = ack
        self._waiters = []  # (count, Deferred, delayed call failing it at its deadline)

    def __call__(self, delivery):
        self.deliveries.append(delivery)
        if self._ack:
            delivery.ack()
        waiting, self._waiters = self._waiters, []
        for count, d, deadline in waiting:
            if len(self.deliveries) >= count:
                deadline.cancel()
                d.callback(self.deliveries)
            else:
                self._waiters.append((count, d, deadline))

    def wait_for(self, count, timeout=5.0):
        """A Deferred firing with the deliveries once at least C{count} arrived;
        it fails, saying how many did, if they have not after C{timeout} seconds."""
        from twisted.internet import reactor

        if len(self.deliveries) >= count:
            return defer.succeed(self.deliveries)
        d = defer.Deferred()

        def expire():
            self._waiters = [waiter for waiter in self._waiters if waiter[1] is not d]
            d.errback(AssertionError(
                f"{len(self.deliveries)} of {count} deliveries arrived within {timeout} s: {self.deliveries[:5]}"
            ))

        self._waiters.append((count, d, reactor.callLater(timeout, expire)))
        return d

    def bodies(self):
        return [delivery.body for delivery in self.deliveries]


def native_hello(vhost="", client_name="", username="guest", password="guest"):
    """The encoded hello frame a native client opens with, logging in as guest unless told otherwise."""
    from brokerd.proto.native_pb2 import Envelope

    hello = Envelope()
    hello.hello.protocol_version = PROTOCOL_VERSION
    hello.hello.vhost = vhost
    hello.hello.client_name = client_name
    hello.hello.username = username
    hello.hello.password = password
    return encode_frame(hello)


def native_publisher(broker, clock):
    """
    A native connection to C{broker} on a StringTransport that has opened channel 1 and
    published once (to no queue): C{(protocol, transport, publish)}, C{publish} the encoded
    frame of that publish, to send again.
    """
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    from brokerd.proto.native_pb2 import Envelope

    protocol = NativeServerFactory(broker).buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
    protocol.makeConnection(transport)
    channel_open = Envelope(channel=1)
    channel_open.channel_open.SetInParent()
    publish = Envelope(channel=1)
    publish.basic_publish.routing_key = "nowhere"
    publish.basic_publish.body = b"x"
    protocol.dataReceived(native_hello() + encode_frame(channel_open) + encode_frame(publish))
    clock.advance(0)
    return protocol, transport, encode_frame(publish)


def encode_frame(envelope):
    """One native frame: 4-byte big-endian length, then the serialized envelope (or bytes)."""
    import struct

    payload = envelope if isinstance(envelope, bytes) else envelope.SerializeToString()
    return struct.pack(">I", len(payload)) + payload


def decode_frames(data):
    """The L{Envelope}s of a byte stream of complete native frames."""
    import struct

    from brokerd.proto.native_pb2 import Envelope

    envelopes, offset = [], 0
    while len(data) - offset >= 4:
        (length,) = struct.unpack_from(">I", data, offset)
        if len(data) - offset - 4 < length:
            break
        envelope = Envelope()
        envelope.ParseFromString(data[offset + 4 : offset + 4 + length])
        envelopes.append(envelope)
        offset += 4 + length
    return envelopes


class RawConnection:
    """A bare TCP protocol for sending arbitrary bytes to a broker and recording its answer.

    @ivar received: every byte the broker sent.
    @ivar lost: a Deferred firing (with the bytes received) when the connection ends.
    """

    def __init__(self):
        from twisted.internet.protocol import Protocol

        outer = self

        class _Protocol(Protocol):
            def dataReceived(self, data):
                outer.received += data

            def connectionLost(self, reason):
                outer.lost.callback(outer.received)

        self.protocol = _Protocol()
        self.received = b""
        self.lost = defer.Deferred()

    @property
    def transport(self):
        return self.protocol.transport

    def write(self, data):
        self.protocol.transport.write(data)

    def frames(self):
        return decode_frames(self.received)


@defer.inlineCallbacks
def connect_raw(testcase, endpoint):
    """A L{RawConnection} to C{endpoint}, aborted (and waited for) at test cleanup if still open."""
    from twisted.internet import reactor
    from twisted.internet.endpoints import clientFromString, connectProtocol

    raw = RawConnection()
    yield connectProtocol(clientFromString(reactor, endpoint), raw.protocol)

    def disconnect():
        if not raw.lost.called:
            raw.transport.abortConnection()
        return raw.lost

    testcase.addCleanup(disconnect)
    return raw


# Topic matching cases as RabbitMQ decides them: (binding key, routing key,
# matches). Shared by the trie's own tests and the topic exchange's, which must
# agree. Words are split on dots; the empty key has no words, "a..b" has an
# empty middle word and "a." ends with an empty word.
TOPIC_MATCH_CASES = [
    # literal words
    ("a.b", "a.b", True),
    ("a.b", "a.c", False),
    ("a.b", "a", False),
    ("a.b", "a.b.c", False),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    # '*' is exactly one word
    ("*", "a", True),
    ("*", "", False),
    ("*", "a.b", False),
    ("a.*", "a.b", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("*.*", "a.b", True),
    ("*.*", ".", True),
    ("*.*", "a", False),
    ("*.*", "a.b.c", False),
    ("*.b", "a.b", True),
    ("*.b", "b", False),
    # '#' alone matches everything, the empty key included
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    # '#' matching zero words at the start, in the middle and at the end
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#", "a", True),
    ("a.#", "a.x.y", True),
    ("a.#", "b.a", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.c", False),
    ("a.#.b", "a", False),
    ("a.#.b", "b", False),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("#.*", "", False),
    ("#.*", "a", True),
    ("#.*", "a.b.c", True),
    # '#.#' is '#' again
    ("#.#", "", True),
    ("#.#", "a", True),
    ("#.#", "a.b.c", True),
    ("a.#.#.b", "a.b", True),
    ("a.#.#.b", "a.x.y.z.b", True),
    ("a.#.#.b", "a.x.y.z", False),
    # empty words
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("a..b", "a.x.b", False),
    ("a.*.b", "a..b", True),
    ("a.", "a.", True),
    ("a.", "a", False),
    ("a", "a.", False),
    ("a.*", "a.", True),
    ("a.#", "a.", True),
    (".", ".", True),
    (".", "", False),
    ("#.", "a.", True),
    ("#.", ".", True),
    ("#.", "a", False),
    (".#", ".a", True),
    (".#", "a", False),
]


def publish(channel, queue, *bodies, persistent=False):
    """Publish each body to C{queue} through the default exchange."""
    for body in bodies:
        channel.basic_publish("", queue, properties(persistent), body)


def ready(broker, queue):
    """How many messages wait in the queue for a consumer."""
    return broker.vhost("/").queues[queue].message_count
