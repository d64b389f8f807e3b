"""What a cluster node does once elected: its stores become the leader's, and it serves."""

from twisted.internet import defer
from twisted.logger import Logger

from zope.interface import alsoProvides, providedBy

from brokerd.replication.applier import StoreApplier
from brokerd.replication.in_sync import InSyncSet, WatchedReplicationServer
from brokerd.replication.promote import delegate, leader_stores

log = Logger()


class ConfirmingStore:
    """
    The leader's store as the broker sees it: the promoted store's tap (every change
    streamed), opened already, with a C{sync()} that fires once the change is durable
    here and on every follower of the in-sync set, while this node leads.
    """

    def __init__(self, tap, stream, in_sync):
        self._tap = tap
        self._stream = stream
        self._in_sync = in_sync
        alsoProvides(self, *providedBy(tap))

    def __getattr__(self, name):
        return delegate(self, self._tap, name)

    def open(self):
        # Opened, and its tap seeded, by the promotion: the broker goes on to recover it.
        return defer.succeed(None)

    def sync(self):
        local = self._tap.sync()  # records the acks it holds first
        target = self._stream.last_sequence
        local.addCallback(lambda result: self._in_sync.wait(target).addCallback(
            lambda _: result))
        return local


class LeaderRole:
    """
    A node's time as leader: it stops following, commits what it applied, reopens its
    stores as a restart does and promotes them (L{leader_stores}: read without
    replication's records, tapped, the stream numbered on in this node's epoch), puts
    them behind a L{ConfirmingStore}, opens its replication port to the followers, writes
    an in-sync set of itself alone, then starts the broker, which recovers the stores
    and serves on the node's client ports. While the set holds fewer nodes than
    C{--cluster-min-isr} (at the start, until enough followers catch up), the broker's
    in-sync alarm holds its publishers back.

    @ivar serving: whether the broker started (and owns the store from then on).
    """

    def __init__(self, node):
        self.node = node
        self.serving = False
        self.broker = None
        self.in_sync = None
        self.stream = None
        self.server = None

    @defer.inlineCallbacks
    def start(self):
        node, settings = self.node, self.node.settings
        yield node.follower.stop()
        yield node.applier.stop_running()
        # The broker recovers the stores as a restart does: from a fresh opening.
        yield node.store.close()
        node.store = node.make_store()
        yield node.store.open()
        applier = StoreApplier({"": node.store})
        yield applier.open()
        leadership = yield leader_stores(applier, node.candidate.elected_revision,
                                         reactor=node.reactor)
        self.stream = leadership.stream
        server = self.server = WatchedReplicationServer(
            self.stream, node.identity.secret, node.identity.cluster_id, reactor=node.reactor,
            max_lag_bytes=settings.max_lag_bytes, epoch=leadership.epoch,
            history=leadership.history, access_document=node.access.document_bytes)
        self.in_sync = InSyncSet(server, node.candidate, settings.node_name,
                                 reactor=node.reactor, min_isr=settings.min_isr,
                                 max_lag_seconds=settings.max_lag_seconds)
        server.on_change = self.in_sync.update
        store = ConfirmingStore(leadership.stores[""], self.stream, self.in_sync)
        node.access.on_saved.append(self.stream.record_access_document)
        node.replication_switch.use(server)
        yield self.in_sync.start()
        self.broker = node.make_broker(store, node.switches, node.status)
        self._hold_publishers_while_too_few_in_sync(settings.min_isr)
        self.broker.startService()
        yield self.broker.started
        self.serving = True
        log.info("node {node} serves as the leader of cluster {cluster} (epoch {epoch},"
                 " operations from {first})", node=settings.node_name,
                 cluster=settings.cluster_name, epoch=leadership.epoch,
                 first=self.stream.last_sequence + 1)

    def _hold_publishers_while_too_few_in_sync(self, min_isr):
        """The broker's in-sync alarm follows the size of the set, from now on (before any
        client is served: a leader whose set is itself alone starts with it raised)."""
        alarm = self.broker.broker.in_sync_alarm
        self.in_sync.on_resized = lambda size: alarm.measured(size, min_isr)
        alarm.measured(self.in_sync.size(), min_isr)

    def abandon(self):
        if self.in_sync is not None:
            self.in_sync.stop()

    @defer.inlineCallbacks
    def stop(self):
        self.abandon()
        if self.broker is not None and self.broker.running:
            yield self.broker.stopService()
