"""What a cluster node does once elected: its stores become the leader's, and it serves."""

from twisted.internet import defer, task
from twisted.logger import Logger

from brokerd.replication.in_sync import InSyncSet, WatchedReplicationServer
from brokerd.replication.stream import OutboundStream
from brokerd.replication.tap import StoreTap

log = Logger()

DURABLE_POLL_SECONDS = 0.01


class ConfirmingTap(StoreTap):
    """
    The leader's store as the broker sees it: every change streamed (L{StoreTap}), and a
    C{sync()} that fires once the change is durable here and on every follower of the
    in-sync set, while this node leads.
    """

    def __init__(self, store, stream, in_sync):
        super().__init__(store, stream)
        self._stream_of_changes = stream
        self._in_sync = in_sync
        self._inner = store

    def watch_commit_failures(self, listener):
        self._inner.watch_commit_failures(listener)

    def sync(self):
        target = self._stream_of_changes.last_sequence
        local = self._inner.sync()
        local.addCallback(lambda result: self._in_sync.wait(target).addCallback(
            lambda _: result))
        return local


class LeaderRole:
    """
    A node's time as leader: it stops following, waits until what it applied is durable,
    puts its stores behind a L{ConfirmingTap}, opens its replication port to the
    followers, writes an in-sync set of itself alone, then starts the broker, which
    recovers the stores as a restart does and serves on the node's client ports.

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
        yield self._applied_is_durable()
        # The broker recovers the stores as a restart does: from a fresh opening.
        yield node.store.close()
        node.store = None
        self.stream = OutboundStream()
        server = self.server = WatchedReplicationServer(
            self.stream, node.identity.secret, node.identity.cluster_id, reactor=node.reactor,
            max_lag_bytes=settings.max_lag_bytes)
        self.in_sync = InSyncSet(server, node.candidate, settings.node_name,
                                 reactor=node.reactor, min_isr=settings.min_isr,
                                 max_lag_seconds=settings.max_lag_seconds)
        server.on_change = self.in_sync.update
        store = ConfirmingTap(node.make_store(), self.stream, self.in_sync)
        node.replication_switch.use(server)
        yield self.in_sync.start()
        self.broker = node.make_broker(store, node.switches, node.status)
        self.broker.startService()
        yield self.broker.started
        self.serving = True
        log.info("node {node} serves as the leader of cluster {cluster}",
                 node=settings.node_name, cluster=settings.cluster_name)

    @defer.inlineCallbacks
    def _applied_is_durable(self):
        applier = self.node.applier
        applier.commit()
        while applier.durable_sequence < applier.applied_sequence:
            yield task.deferLater(self.node.reactor, DURABLE_POLL_SECONDS, lambda: None)
            applier.commit()

    def abandon(self):
        if self.in_sync is not None:
            self.in_sync.stop()

    @defer.inlineCallbacks
    def stop(self):
        self.abandon()
        if self.broker is not None and self.broker.running:
            yield self.broker.stopService()
