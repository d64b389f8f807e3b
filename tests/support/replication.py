"""Leaders and followers of the replication tests: real stores on real files, real sockets on
127.0.0.1, a workload of every store operation and a comparison of what two stores hold."""

import shutil
import tempfile

from twisted.internet import defer, endpoints, reactor
from zope.interface import alsoProvides, providedBy

from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table
from brokerd.replication.applier import StoreApplier
from brokerd.replication.follower import ReplicationClient
from brokerd.replication.leader import ReplicationServer
from brokerd.replication.promote import leader_stores
from brokerd.replication.replica import ReplicaReader
from brokerd.replication.stream import OutboundStream
from brokerd.replication.tap import StoreTap
from brokerd.storage.durability import SyncPolicy
from brokerd.storage.registry import make_store
from tests.support.broker import wait_until

SECRET = b"the cluster's shared secret"
CLUSTER = "c1"
BACKENDS = ("chunked", "sqlite", "filelog")
MIB = 1024 * 1024
NOW = 1_760_000_000_000
Q1, Q2, Q3 = ("/", "orders"), ("/", "audit"), ("/", "scratch")


def directory(testcase):
    path = tempfile.mkdtemp(prefix="brokerd-replication-test-")
    testcase.addCleanup(shutil.rmtree, path, True)
    return path


@defer.inlineCallbacks
def open_store(backend, path):
    store = make_store(backend, path, SyncPolicy("always"), reactor=reactor)
    yield store.open()
    return store


class Leader:
    """A tapped store, its outbound stream and a replication server listening on 127.0.0.1:0."""

    @defer.inlineCallbacks
    def start(self, testcase, backend, *, retain_bytes=64 * MIB, max_lag_bytes=16 * MIB,
              secret=SECRET, cluster=CLUSTER, clock=None, wrap=None, server_class=ReplicationServer,
              tap_reactor=None, **server_options):
        """C{clock}: what schedules the server's timers (the reactor unless a test drives one);
        C{wrap}: called with the opened store, gives what the tap wraps; C{tap_reactor}: the
        tap's, as a node's (acks recorded once a turn, the stream told as commits start)."""
        self.backend, self.path = backend, directory(testcase)
        self.stream = OutboundStream(retain_bytes, reactor=reactor)
        store = yield open_store(backend, self.path)
        self.store = StoreTap(wrap(store) if wrap else store, self.stream, reactor=tap_reactor)
        self.server = server_class(self.stream, secret, cluster, reactor=clock or reactor,
                                   max_lag_bytes=max_lag_bytes, **server_options)
        self.port = yield endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
            self.server)
        testcase.addCleanup(self.stop)
        return self

    @defer.inlineCallbacks
    def promote(self, testcase, follower, epoch, **server_options):
        """
        Make C{follower} this leader, as a failover does: its link closed, its store reopened
        as a restart would, made a leader's of C{epoch} and served on a new port.
        """
        yield follower.stop()
        opened = yield Follower().start(testcase, follower.backend, follower.path)
        self.leadership = yield leader_stores(opened.applier, epoch)
        opened.store = None  # this leader closes it
        self.backend, self.path = follower.backend, follower.path
        self.stream, self.store = self.leadership.stream, self.leadership.stores[""]
        self.server = ReplicationServer(self.stream, SECRET, CLUSTER, reactor=reactor, epoch=epoch,
                                        history=self.leadership.history, **server_options)
        self.port = yield endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
            self.server)
        testcase.addCleanup(self.stop)
        return self

    @property
    def address(self):
        return self.port.getHost()

    @defer.inlineCallbacks
    def stop(self):
        if self.port is not None:
            port, self.port = self.port, None
            yield port.stopListening()
            for link in tuple(self.server.followers):
                link.transport.abortConnection()
        if self.store is not None:
            store, self.store = self.store, None
            yield store.close()

    @defer.inlineCallbacks
    def reopened_store(self):
        """Stop serving, close the tapped store and open its files again, as a restart would.
        The caller closes the store it gets."""
        yield self.stop()
        return (yield open_store(self.backend, self.path))

    def reopened_contents(self):
        """L{contents} of the store reopened as a restart would, closed again."""
        return reopened_contents(self)


class Follower:
    """A store of its own (any backend), its applier and a client connected to a leader."""

    @defer.inlineCallbacks
    def start(self, testcase, backend, path=None, *, wrap=None, **applier_options):
        self.testcase, self.backend = testcase, backend
        self.path = path or directory(testcase)
        store = yield open_store(backend, self.path)
        self.store = wrap(store) if wrap else store
        self.applier = StoreApplier({"": self.store}, **applier_options)
        yield self.applier.open()
        testcase.addCleanup(self.stop)
        return self

    @defer.inlineCallbacks
    def connect(self, leader, secret=SECRET, max_frame=4 * MIB, address=None, node="n2", **options):
        self.client = ReplicationClient(self.applier, secret, node, max_frame=max_frame, **options)
        address = address or leader.address
        endpoint = endpoints.TCP4ClientEndpoint(reactor, address.host, address.port)
        link = yield endpoint.connect(self.client)
        yield wait_until(lambda: link.state in ("streaming", "stopped"))
        return self.client

    @defer.inlineCallbacks
    def disconnect(self):
        link = getattr(self, "client", None) and self.client.link
        if link is not None:
            lost = self.client.when_lost()
            link.transport.loseConnection()
            yield lost

    @defer.inlineCallbacks
    def stop(self):
        yield self.disconnect()
        if self.store is not None:
            store, self.store = self.store, None
            yield store.close()

    @defer.inlineCallbacks
    def reopened_store(self):
        """Stop, close the store and open its files again; the caller closes the store it gets."""
        yield self.stop()
        return (yield open_store(self.backend, self.path))

    def reopened_contents(self):
        return reopened_contents(self)


def message(body, routing_key="orders", properties=None, published_at=None, **headers):
    properties = properties or messages_pb2.BasicProperties(
        delivery_mode=messages_pb2.PERSISTENT, message_id=f"m{len(body)}", content_type="text/plain")
    if headers:
        dict_to_table(headers, properties.headers)
    return Message("orders", routing_key, properties, body, published_at=published_at)


def body(number, size):
    """A body of C{size} bytes that differs per C{number}."""
    seed = f"{number:08d}".encode()
    return (seed * (size // len(seed) + 1))[:size]


def topology(store):
    """Declare the workload's topology, with a queue, an exchange and a binding that are then deleted."""
    direct, topic = messages_pb2.DIRECT, messages_pb2.TOPIC
    store.save_exchange(messages_pb2.ExchangeRecord(vhost="/", name="orders", type=topic, durable=True))
    store.save_exchange(messages_pb2.ExchangeRecord(vhost="/", name="copies", type=direct, durable=True,
                                                    arguments=dict_to_table({"alternate-exchange": "x"})))
    store.save_exchange(messages_pb2.ExchangeRecord(vhost="/", name="gone", type=direct, durable=True))
    for vhost, name in (Q1, Q2, Q3, ("/", "gone")):
        store.save_queue(messages_pb2.QueueRecord(vhost=vhost, name=name, durable=True,
                                                  arguments=dict_to_table({"x-max-length": 100000})))
    store.save_binding(messages_pb2.BindingRecord(vhost="/", exchange="orders", queue="orders", routing_key="#"))
    store.save_binding(messages_pb2.BindingRecord(vhost="/", exchange="orders", destination_exchange="copies",
                                                  routing_key="eu.*"))
    doomed = messages_pb2.BindingRecord(vhost="/", exchange="orders", queue="audit", routing_key="x")
    store.save_binding(doomed)
    store.delete_binding(doomed)
    store.delete_queue(("/", "gone"))
    store.delete_exchange("/", "gone")


def messages(store, first, count):
    """
    Append C{count} messages numbered from C{first} (bodies up to 1 MiB, shared and own
    properties, some to two queues) and six alike, then ack, return, purge, delay and release
    some.
    """
    shared = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, priority=3)
    handles = []
    for number in range(first, first + count):
        size = MIB if number % 25 == 7 else (number * 37) % 5000
        if number % 3 == 0:
            found = message(body(number, size), properties=shared)
        else:
            found = message(body(number, size), published_at=NOW + number, n=number, tag="t" * (number % 7))
        queues = [Q1, Q2] if number % 4 == 0 else [Q1] if number % 4 != 3 else [Q3]
        handles.append((queues, store.append(found, queues)))
    # Appends alike one after another: a leader streams them as one run.
    burst = [store.append(message(body(number, 64), properties=shared), [Q1])
             for number in range(first, first + 6)]
    store.ack(Q1, burst[1])
    for index, (queues, handle) in enumerate(handles):
        if index % 5 == 1:
            store.ack(queues[0], handle)
        elif index % 5 == 2:
            store.returned(queues[0], handle, 1 + index % 3)
    # A purge drops what the queue still holds: never a message already acked.
    waiting = [handle for index, (queues, handle) in enumerate(handles) if queues == [Q3] and index % 5 != 1]
    store.purge(Q3, waiting[::2])
    delayed = [store.delay(message(body(number, 100 + number)), ("/", "later"), NOW + 1000 * number)
               for number in range(first, first + 4)]
    store.release(delayed[1])


@defer.inlineCallbacks
def contents(store):
    """What a store holds, comparable across backends: topology, each queue's messages in order
    with their delivery counts, and the delayed messages in due order (without handles)."""
    reader = ReplicaReader(store)
    items = reader.topology()
    found = {"topology": sorted((type(item).__name__, item.SerializeToString(deterministic=True))
                                for item in items)}
    for item in items:
        if isinstance(item, messages_pb2.QueueRecord):
            queue = (item.vhost, item.name)
            counts = reader.delivery_counts(queue)
            found[queue] = [(record.exchange, record.routing_key,
                             record.properties.SerializeToString(deterministic=True), record.body,
                             record.published_at, counts.get(handle, 0))
                            for handle, record, _, _ in reader.recover(queue)]
    delayed = yield reader.delayed()
    found["delayed"] = [(item.due, item.exchange, item.record.exchange, item.record.routing_key,
                         item.record.properties.SerializeToString(deterministic=True), item.record.body)
                        for item, _ in delayed]
    return found


@defer.inlineCallbacks
def reopened_contents(node):
    """L{contents} of a leader's or follower's store after a restart; the store is closed after."""
    store = yield node.reopened_store()
    try:
        return (yield contents(store))
    finally:
        yield store.close()


class OnLoad:
    """A real store that calls C{action()} once, when a message is loaded the C{at}th time (as
    a snapshot reads bodies), so that a test acts at a known point of a snapshot."""

    def __init__(self, store, at, action):
        self._store, self._at, self._action, self.loads = store, at, action, 0
        alsoProvides(self, *providedBy(store))

    def __getattr__(self, name):
        return getattr(self._store, name)

    def load(self, handle):
        self.loads += 1
        if self.loads == self._at:
            self._action()
        return self._store.load(handle)


class HeldCommits:
    """A real store whose C{sync()} answers only once the test lets it (L{release})."""

    def __init__(self, store):
        self._store = store
        self.held = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    def sync(self):
        gate = defer.Deferred()
        self.held.append(gate)
        synced = self._store.sync()
        return defer.gatherResults([synced, gate]).addCallback(lambda _: None)

    def release(self):
        held, self.held = self.held, []
        for gate in held:
            gate.callback(None)
