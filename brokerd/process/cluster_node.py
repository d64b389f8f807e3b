"""One node of a replicated cluster: a follower copying the leader's stores until etcd makes it
the leader, then the broker itself.

L{ClusterNode} listens on the node's ports once (L{SwitchingFactory}), reads the cluster's
identity from etcd (a node that cannot reach etcd at its first start stops, in one line),
opens its store as a follower's (L{StoreApplier}) and takes part in the election
(L{Candidate}). While another node leads, it applies that leader's replication stream and
its client ports are closed to clients or relayed to the leader, each relayed connection
starting with a header that tells the leader who the client is
(L{brokerd.replication.relay_proof}), which the leader's ports believe only from a node of the
cluster. Once elected, it turns
its stores into the leader's (the broker recovers them as a restart does), streams their
changes to the followers, keeps the in-sync set in etcd (L{InSyncSet}), and holds every
confirm until that set has the message durably. A node that stops leading (its lease
could not be renewed, or the leader key went to another) confirms nothing more: it closes
its clients and starts again as a follower, from scratch, in the same process.
"""

import os
import socket
import sys

from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from brokerd.access.database import AccessDatabaseDamaged
from brokerd.cluster.errors import DuplicateNodeName, EtcdError
from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.identity import cluster_identity
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.relay import RelayFactory
from brokerd.cluster.status import ClusterStatus
from brokerd.cluster.view import ClusterKeys, NodeInfo
from brokerd.http.metrics.follower_site import follower_metrics_site
from brokerd.process.cluster_follower import FollowerLink
from brokerd.process.cluster_leader import LeaderRole
from brokerd.replication.applier import StoreApplier
from brokerd.replication.relay_proof import MAX_BODY, RelayHeaderCheck, relay_header
from brokerd.storage import registry
from brokerd.wire.endpoints import is_tls, server_endpoint
from brokerd.wire.proxied_peer import ProxyHeaderFactory
from brokerd.wire.proxy_header import HeaderRefused
from brokerd.wire.switching_factory import SwitchingFactory

log = Logger()

REJOIN_ENVIRONMENT = "BROKERD_CLUSTER_REJOIN"
RETRY_SECONDS = 1.0
LEAVE_SECONDS = 1.0
# A follower's stores say how far they hold the leader's stream at most this often (and
# exactly when it stops cleanly or is elected): each saying costs a file store fsyncs.
STATE_SECONDS = 1.0
TWISTD_MAIN = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"
CLIENT_OPTIONS = ("amqp", "amqps", "native", "http", "prometheus")
RELAYED_OPTIONS = ("amqp", "amqps", "native", "http")


def advertised_address(port, advertise_host, kind="tcp"):
    """C{tcp:HOST:PORT} (or C{tls:...}) other nodes reach a listening C{port} at."""
    address = port.getHost()
    host = advertise_host or address.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    if ":" in host:
        host = host.replace(":", "\\:")
    return f"{kind}:{host}:{address.port}"


class ClusterNode(Service):
    """
    A cluster node's life (see the module's description).

    @param make_store: makes an (unopened) store of this node's data: the follower's
        (C{make_store(follower=True)}: its commits on the reactor's thread, which only
        applies the leader's operations, and the backend's C{replica_options}), then, once
        elected, the leader's, opened afresh as a restart opens it.
    @param make_broker: C{make_broker(store, bound_ports, cluster_status)} makes the
        L{BrokerService} that serves clients once this node leads.
    @param endpoints: option name -> endpoint string of the client listeners.
    @param pidfile: the pid file to remove before the process starts again.
    """

    def __init__(self, reactor, settings, make_store, make_broker, endpoints, data_dir,
                 access, pidfile=None, rejoin=None):
        self.reactor = reactor
        self.settings = settings
        self.make_store = make_store
        self.make_broker = make_broker
        self.endpoints = {name: value for name, value in endpoints.items() if value}
        self.data_dir = data_dir
        self.access = access
        self.pidfile = pidfile
        self.rejoin = os.environ.get(REJOIN_ENVIRONMENT) == "1" if rejoin is None else rejoin
        self.keys = ClusterKeys(settings.cluster_name)
        self.switches = {}
        self.replication_switch = SwitchingFactory("replication")
        self.store = None
        self.applier = None
        self.candidate = None
        self.status = None
        self.relays = {}
        self._leader = None
        self.identity = None
        self.relay_check = None
        self.follower = None
        self.leader = None
        self.started = defer.Deferred()
        self._restarting = False

    # -- start

    def startService(self):
        Service.startService(self)
        d = self._start()
        d.addCallbacks(lambda _: self.started.callback(self), self._failed_to_start)

    @defer.inlineCallbacks
    def _start(self):
        addresses = yield self._listen()
        client = EtcdClient(self.reactor, list(self.settings.etcd_urls),
                            ca_file=self.settings.etcd_ca)
        self.identity = yield self._identity(client)
        self.relay_check = RelayHeaderCheck(self.identity.secret, self.settings.node_name,
                                            self.reactor)
        self.store = self.make_store(follower=True)
        yield self.store.open()
        self.applier = StoreApplier({"": self.store}, access_sink=self._access_document,
                                    state_seconds=STATE_SECONDS)
        yield self.applier.open()
        if self.applier.cluster_id and self.applier.cluster_id != self.identity.cluster_id:
            raise EtcdError(
                f"--data-dir={self.data_dir} holds data of cluster {self.applier.cluster_id},"
                f" not of cluster {self.settings.cluster_name!r} ({self.identity.cluster_id}):"
                " give this node an empty data directory")
        yield self.applier.start_running()
        self.follower = FollowerLink(self.reactor, self.applier, self.identity.secret,
                                     self.settings.node_name,
                                     trust_roots=self.settings.replication_trust_roots)
        self._relay_clients()
        yield self._take_part(client, NodeInfo(self.settings.node_name, addresses))
        if "prometheus" in self.switches:
            self.switches["prometheus"].use(follower_metrics_site(self.status))
        self.candidate.ended.addCallback(self._lease_ended)
        log.info("node {node} joined cluster {cluster} ({addresses})",
                 node=self.settings.node_name, cluster=self.settings.cluster_name,
                 addresses=" ".join(f"{k}={v}" for k, v in sorted(addresses.items())))

    @defer.inlineCallbacks
    def _take_part(self, client, node):
        """
        Join the cluster and its election; a node starting again after it lost its lease
        (etcd unreachable) tries until etcd answers, where a first start stops at once.
        """
        while True:
            self.candidate = Candidate(
                client, self.reactor, self.keys, node, ttl=self.settings.lease_ttl,
                on_elected=self._elected, on_stepped_down=self._stepped_down,
                on_leader=self._leader_changed)
            self.status = ClusterStatus(
                self.settings.cluster_name, self.settings.node_name, self.candidate,
                followers=self._followers, clock=self.reactor, min_in_sync=self.settings.min_isr)
            try:
                yield self.candidate.start()
                return
            except EtcdError as problem:
                if not self.rejoin or isinstance(problem, DuplicateNodeName):
                    raise
                log.warn("cannot join the cluster yet ({problem}); trying again", problem=problem)
                yield self._pause(RETRY_SECONDS)

    @defer.inlineCallbacks
    def _listen(self):
        """Listen on every port once; fires with the addresses other nodes reach them at."""
        addresses = {}
        wanted = dict(self.endpoints, replication=self.settings.replication)
        for option, description in wanted.items():
            switch = (self.replication_switch if option == "replication"
                      else SwitchingFactory(option))
            factory = switch
            if option in RELAYED_OPTIONS and not is_tls(description):
                # A follower's relay starts each client's connection with a header.
                factory = ProxyHeaderFactory(switch, self._relayed_client, self.reactor,
                                             f"--{option}", max_body=MAX_BODY)
            try:
                switch.port = yield server_endpoint(self.reactor, description).listen(factory)
            except Exception as problem:
                raise EtcdError(f"--{option}={description}: {problem}") from None
            if option != "replication":
                self.switches[option] = switch
            # Clients' ports are reached raw (relays pass TLS through); the replication port
            # is a node's client, which checks the leader's certificate when it is TLS.
            kind = "tls" if option == "replication" and is_tls(description) else "tcp"
            addresses[option] = advertised_address(switch.port, self.settings.advertise_host,
                                                   kind)
        return addresses

    @defer.inlineCallbacks
    def _identity(self, client):
        while True:
            try:
                identity = yield cluster_identity(client, self.keys)
                return identity
            except EtcdError as problem:
                if not self.rejoin or isinstance(problem, DuplicateNodeName):
                    raise
                log.warn("etcd does not answer ({problem}); trying again", problem=problem)
                yield self._pause(RETRY_SECONDS)

    def _pause(self, seconds):
        waiting = defer.Deferred()
        self.reactor.callLater(seconds, waiting.callback, None)
        return waiting

    def _failed_to_start(self, failure):
        log.critical("brokerd could not join cluster {cluster}: {problem}",
                     cluster=self.settings.cluster_name,
                     problem=failure.getErrorMessage() or failure.type.__name__)
        self.started.errback(failure)
        self.started.addErrback(lambda _: None)
        self.reactor.callWhenRunning(self._exit, 1)

    # -- roles

    def _access_document(self, data):
        try:
            self.access.replace_document(data)
        except AccessDatabaseDamaged as damage:
            raise ValueError(f"the leader's access database: {damage}") from None

    def _followers(self):
        if self.leader is None or self.leader.server is None:
            return []
        return self.leader.server.status()

    def _relay_clients(self):
        """
        While this node follows, its client ports relay to the leader's same ports, bytes
        unchanged; a TLS port stays closed (the relay would have to pass TLS through a port
        that ends it), so TLS clients reach the leader at its own address.
        """
        for option in RELAYED_OPTIONS:
            if option in self.switches and not is_tls(self.endpoints[option]):
                relay = RelayFactory(self.reactor,
                                     lambda option=option: self._leader_address(option),
                                     header=self._relay_header)
                self.relays[option] = relay
                self.switches[option].use(relay)

    def _relay_header(self, client):
        """What the leader is told first of a client this node relays: who it is, signed."""
        info = self._leader
        if info is None or self.identity is None:
            raise ValueError("no leader is known")
        return relay_header(self.identity.secret, self.settings.node_name, info.name,
                            client.getPeer(), client.getHost(), self.reactor.seconds())

    def _relayed_client(self, header):
        """
        The client's address a relay header names, to believe on this node's client ports;
        L{HeaderRefused} unless this node leads and the header passes L{RelayHeaderCheck}.
        """
        if self.leader is None or self.relay_check is None:
            raise HeaderRefused(f"node {self.settings.node_name} does not lead the cluster:"
                                " only the leader takes relayed connections")
        return self.relay_check.check(header)

    def _leader_address(self, option):
        info = self._leader
        if info is None or info.name == self.settings.node_name:
            return None
        return info.addresses.get(option)

    def _leader_changed(self, info):
        self.status.on_leader(info)
        self._leader = info  # relays ask for it: set before their clients are dropped
        for relay in self.relays.values():
            relay.drop_all()
        if info is None or info.name == self.settings.node_name:
            self.follower.follow(None)
            return
        log.info("following {leader}", leader=info.name)
        self.follower.follow(info.addresses.get("replication"))

    def _elected(self):
        self.follower.follow(None)
        self.leader = LeaderRole(self)
        self.leader.start().addErrback(self._leading_failed)

    def _leading_failed(self, failure):
        log.failure("this node could not take the lead", failure)
        self.restart("it could not take the lead")

    def _stepped_down(self, reason):
        self.restart(f"it stopped leading: {reason}")

    def _lease_ended(self, reason):
        self.restart(f"its etcd lease ended: {reason}")

    def restart(self, reason):
        """
        Confirm nothing more, close every client, and start this process again as a new
        follower (its pid file removed first, so that the new start does not refuse it).
        """
        if self._restarting or not self.running:
            return
        self._restarting = True
        log.warn("node {node} starts again as a follower: {reason}",
                 node=self.settings.node_name, reason=reason)
        for switch in self.switches.values():
            switch.use(None)
        self.replication_switch.use(None)
        if self.leader is not None:
            self.leader.abandon()
        # Briefly (etcd may be what failed): a follower writes its exact state, so that it
        # resumes rather than resyncs, and the lease goes back, so that the node's name, and
        # the lead if it held it, are free at once for its next start.
        steps = []
        if self.leader is None and self.applier is not None and self.follower is not None:
            steps.append(self.follower.stop().addCallback(lambda _: self.applier.stop_running()))
        if self.candidate is not None:
            steps.append(defer.maybeDeferred(self.candidate.stop))
        leaving = defer.DeferredList(steps, consumeErrors=True)
        timeout = self.reactor.callLater(LEAVE_SECONDS, leaving.cancel)
        leaving.addErrback(lambda failure: None)
        leaving.addBoth(lambda _: timeout.cancel() if timeout.active() else None)
        leaving.addBoth(lambda _: self._exec())

    def _exec(self):
        os.environ[REJOIN_ENVIRONMENT] = "1"
        if self.pidfile and os.path.exists(self.pidfile):
            os.remove(self.pidfile)
        sys.stdout.flush()
        sys.stderr.flush()
        # twistd's own entry point, whatever script started this process.
        os.execv(sys.executable, [sys.executable, "-c", TWISTD_MAIN, *sys.argv[1:]])

    # -- stop

    @defer.inlineCallbacks
    def stopService(self):
        Service.stopService(self)
        if self.leader is not None:
            yield self.leader.stop()
        if self.follower is not None:
            yield self.follower.stop()
        if self.applier is not None and self.store is not None and self.leader is None:
            yield self.applier.stop_running()
        if self.candidate is not None:
            try:
                yield self.candidate.stop()
            except EtcdError as problem:
                log.warn("leaving the cluster: {problem}", problem=problem)
        for switch in [*self.switches.values(), self.replication_switch]:
            if switch.port is not None:
                yield switch.port.stopListening()
        if self.store is not None and (self.leader is None or not self.leader.serving):
            yield self.store.close()

    def _exit(self, status):
        self.reactor.addSystemEventTrigger("after", "shutdown", os._exit, status)
        self.reactor.stop()


def node_of_options(options, reactor, broker_service):
    """
    The L{ClusterNode} of twistd's parsed options; C{broker_service(options, reactor,
    store, bound_ports, cluster_status)} makes the broker it starts once it leads.
    """
    parent = getattr(options, "parent", None)
    settings = options["cluster"]
    options["amqp-settings"].node_properties = {
        "cluster_name": settings.cluster_name, "node": f"brokerd@{settings.node_name}"}
    return ClusterNode(
        reactor, options["cluster"],
        make_store=lambda follower=False: registry.make_store(
            options["backend"], options["data-dir"],
            options["sync"].on_reactor() if follower else options["sync"], reactor=reactor,
            replica=follower),
        make_broker=lambda store, ports, status: broker_service(options, reactor, store, ports,
                                                                status),
        endpoints={name: options[name] for name in CLIENT_OPTIONS},
        data_dir=options["data-dir"],
        access=options["amqp-settings"].authenticator.access,
        pidfile=parent.get("pidfile") if parent is not None else None,
    )
