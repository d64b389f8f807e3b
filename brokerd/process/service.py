"""The running broker as a Twisted service: access database and store first, then listeners.

L{BrokerService} loads the access database (users, vhosts, permissions;
created on the first start), which AMQP and the native protocol both log in
against through one authenticator, opens the store and recovers durable state,
then opens and recovers the store of every vhost that has its own (one that
fails takes down that vhost alone, logged in one line), imports the
C{--load-definitions} file if given (L{brokerd.access.definitions}) and tells
every vhost its policies, before any
listener accepts a client (AMQP plain and over TLS share one factory; a TLS
endpoint is built by L{brokerd.wire.endpoints.server_endpoint}; the HTTP management
API of L{brokerd.http} listens on C{--http} and the Prometheus metrics of
L{brokerd.http.prometheus} on C{--prometheus}), and on stop closes
the listeners, then the clients' connections (L{brokerd.process.shutdown}: after the
commits in flight are confirmed), then the stores; a SIGTERM stop then ends the
process with exit status 0. A
start-up failure (store unusable, port taken) is logged in one line naming
the option at fault and ends the process with exit status 1; the stores'
stats are logged at stop only if it started.
"""

import json
import os
import signal
import sys

from twisted.application.service import Service
from twisted.internet import defer
from twisted.logger import Logger

from brokerd.access.commands import AccessCommands
from brokerd.access.database import FULL_PERMISSIONS, AccessDatabaseDamaged
from brokerd.access.definitions import DefinitionsRefused, load_definitions_file
from brokerd.access.login import AccessControl
from brokerd.access.limits import publish_all_limits
from brokerd.access.policies import publish_all_policies
from brokerd.amqp.server import AmqpServerFactory
from brokerd.http.prometheus import metrics_site
from brokerd.http.server import ApiContext, make_site
from brokerd.model.broker import Broker
from brokerd.model.disk_alarm import DEFAULT_DISK_FREE_LIMIT, DiskAlarm
from brokerd.model.watermark import DEFAULT_HIGH_WATERMARK, MemoryWatermark
from brokerd.native.server import DEFAULT_CHANNEL_MAX, DEFAULT_MAX_FRAME_SIZE, NativeServerFactory
from brokerd.process.disk_monitor import FreeSpaceMonitor
from brokerd.process.memory_trim import FreedMemory
from brokerd.process.shutdown import close_clients
from brokerd.session.ack_timeouts import DEFAULT_CONSUMER_TIMEOUT, AckTimeouts
from brokerd.storage.vhost_stores import VhostStoreFailed
from brokerd.wire.connection_ceiling import CeilingFactory, ConnectionCeiling
from brokerd.wire.endpoints import is_tls, server_endpoint
from brokerd.wire.stop_signals import ignore_further_stop_signals

log = Logger()


class ListenFailed(Exception):
    """A listener could not listen; the message names its option and endpoint."""


class Listener:
    """
    One endpoint string (the value of option C{--NAME}) and the factory serving
    it; logs the bound address, with "over TLS" after the label of a TLS one.

    @ivar broker_clients: whether its factory's connections are broker clients
        that a stop closes after their commits (AMQP, native), rather than
        HTTP requests, which end with the reactor.
    @ivar ceiling: the L{ConnectionCeiling} its connections count against, or None.
    @ivar switch: a L{brokerd.wire.switching_factory.SwitchingFactory} already
        listening on this option's endpoint (a cluster node's port), which start and
        stop point at this listener's factory instead of listening; or None.
    """

    def __init__(self, reactor, description, factory, label, option, broker_clients=True):
        self.reactor = reactor
        self.broker_clients = broker_clients
        self.description = description
        self.factory = factory
        self.label = f"{label} over TLS" if is_tls(description) else label
        self.option = option
        self.port = None
        self.ceiling = None
        self.switch = None

    @defer.inlineCallbacks
    def start(self):
        try:
            factory = self.factory
            if self.ceiling is not None:
                factory = CeilingFactory(factory, self.ceiling)
            if self.switch is not None:
                self.switch.use(factory)
                self.port = self.switch.port
                return self.port
            self.port = yield server_endpoint(self.reactor, self.description).listen(factory)
        except Exception as problem:
            raise ListenFailed(f"--{self.option}={self.description}: {problem}") from None
        return self.port

    def announce(self):
        address = self.port.getHost()
        if hasattr(address, "port"):
            where = f"{address.host}:{address.port}"
        else:
            where = getattr(address, "name", address)
        if isinstance(where, bytes):
            where = where.decode("utf-8", "replace")
        log.info(
            "{label} listening on {where} (--{option}={description})",
            label=self.label, where=where, option=self.option, description=self.description,
        )

    def stop(self):
        port, self.port = self.port, None
        if self.switch is not None:
            self.switch.use(None)
            return None
        return port.stopListening() if port is not None else None


class BrokerService(Service):
    """
    Store, broker and listeners, started in that order.

    @ivar started: a Deferred firing with this service once every listener is
        up (or failing if start-up failed); useful to tests and embedders.
    """

    def __init__(
        self,
        store,
        reactor,
        native_endpoint=None,
        native_max_frame_size=DEFAULT_MAX_FRAME_SIZE,
        native_channel_max=DEFAULT_CHANNEL_MAX,
        amqp_endpoint=None,
        amqp_settings=None,
        amqps_endpoint=None,
        memory_high_watermark=DEFAULT_HIGH_WATERMARK,
        connection_memory=None,
        consumer_timeout=DEFAULT_CONSUMER_TIMEOUT,
        startup_report=None,
        access_defaults=None,
        vhost_stores=None,
        definitions_file=None,
        prometheus_endpoint=None,
        http_endpoint=None,
        http_access_log=False,
        disk_free_limit=DEFAULT_DISK_FREE_LIMIT,
        data_dir=None,
        bound_ports=None,
        cluster_status=None,
    ):
        """
        @param connection_memory: the L{brokerd.model.watermark.ConnectionMemoryLimits}
            every client connection is held to (None: shares of the watermark).
        @param consumer_timeout: milliseconds a delivery may stay un-acked before its
            channel is closed, unless its queue says otherwise; None: no limit.
        @param http_access_log: log a line per request to the HTTP API and
            dashboard (C{--http-access-log}; off by default, as RabbitMQ's).
        @param cluster_status: the L{brokerd.cluster.status.ClusterStatus} of the
            cluster this broker leads, which the API, dashboard and metrics show
            (None: a node on its own).
        @param bound_ports: option name -> a listening
            L{brokerd.wire.switching_factory.SwitchingFactory} that serves that
            option's listener instead of a port of its own (a cluster node's).
        @param disk_free_limit: free bytes of C{data_dir}'s file system below
            which publishers are blocked (the disk alarm, measured from the
            store's opening on, when C{data_dir} is given).
        @param prometheus_endpoint: where to serve the Prometheus metrics
            (L{brokerd.http.prometheus}), or None.
        @param vhost_stores: the L{brokerd.interfaces.IVhostStores} that
            builds the stores of vhosts created with a backend of their own
            (None: such vhosts are unavailable).
        @param definitions_file: the path of a definitions file to import
            once recovered (C{--load-definitions}), or None.
        @param access_defaults: C{(user, password)} of the administrator a
            first start creates in the access database of C{amqp_settings}'
            authenticator, C{(None, None)} for none; None: do not open that
            database (it is an in-memory one, opened already).
        """
        self.store = store
        self.reactor = reactor
        # The end of a burst past the watermark is when the most memory has just been freed.
        watermark = MemoryWatermark(
            memory_high_watermark, on_unblocked=FreedMemory(reactor).give_back_soon
        )
        self.broker = Broker(store, reactor, watermark=watermark,
                             disk_alarm=DiskAlarm(disk_free_limit))
        if connection_memory is not None:
            self.broker.connection_memory = connection_memory
        self.ack_timeouts = AckTimeouts(self.broker, consumer_timeout)
        self.disk_monitor = None
        if data_dir is not None:
            self.disk_monitor = FreeSpaceMonitor(self.broker.disk_alarm, data_dir, reactor)
            self.broker.on_commit_failed = self.disk_monitor.commit_failed
        self.broker.vhost_stores = vhost_stores
        self.listeners = []
        if amqp_endpoint or amqps_endpoint:
            # One factory: the same broker behind both.
            factory = AmqpServerFactory(self.broker, amqp_settings)
            for option, endpoint in (("amqp", amqp_endpoint), ("amqps", amqps_endpoint)):
                if endpoint:
                    self.listeners.append(Listener(reactor, endpoint, factory, "AMQP", option))
        authenticator = amqp_settings.authenticator if amqp_settings is not None else None
        # The native protocol logs in against the same users, vhosts and permissions.
        if native_endpoint:
            factory = NativeServerFactory(
                self.broker, native_max_frame_size, native_channel_max, authenticator
            )
            self.listeners.append(
                Listener(reactor, native_endpoint, factory, "native protocol", "native")
            )
        self.startup_report = startup_report  # a StartupReport: what the start-up log says
        self.access = authenticator.access if authenticator is not None else None
        if prometheus_endpoint:
            site = metrics_site(self.broker, self.access, cluster=cluster_status)
            self.listeners.append(Listener(
                reactor, prometheus_endpoint, site, "Prometheus metrics", "prometheus",
                broker_clients=False,
            ))
        self.users_file = authenticator.users_file if authenticator is not None else None
        self.access_defaults = access_defaults
        self.definitions_file = definitions_file
        self.http_access_log = http_access_log
        self.cluster_status = cluster_status
        if http_endpoint:
            self.listeners.append(Listener(
                reactor, http_endpoint, self._management_site(), "HTTP API", "http",
                broker_clients=False,
            ))
        for listener in self.listeners:
            listener.switch = (bound_ports or {}).get(listener.option)
        self.started = defer.Deferred()
        self._store_opened = False
        self._serving = False
        self._first_access_start = False  # True when this start made the access database

    def _management_site(self):
        """
        The management API's site, over the same access database as the
        protocols (in memory without one).
        """
        access = self.access if self.access is not None else AccessControl().access
        context = ApiContext(
            self.broker, access, AccessCommands(self.broker, access), self.listeners,
            cluster=self.cluster_status,
        )
        return make_site(context, self.http_access_log)

    def limit_client_connections(self, maximum):
        """
        Accept at most C{maximum} connections over all the client listeners
        together (C{--connection-max}; None: no ceiling); call before starting.
        """
        if maximum is None:
            return
        ceiling = ConnectionCeiling(maximum, self.reactor)
        for listener in self.listeners:
            if listener.broker_clients:
                listener.ceiling = ceiling

    def startService(self):
        Service.startService(self)
        if self.startup_report is not None:
            self.startup_report.log_settings()
        d = defer.maybeDeferred(self._open_access)
        d.addCallback(lambda _: self.store.open())
        d.addCallback(self._opened)
        d.addCallback(lambda _: self.broker.recover())
        d.addCallback(self._open_vhost_stores)
        d.addCallback(self._recovered)
        d.addCallback(lambda _: self._load_definitions())
        d.addCallback(lambda _: self.ack_timeouts.start())
        d.addCallback(lambda _: defer.gatherResults(
            [listener.start() for listener in self.listeners], consumeErrors=True
        ))
        d.addCallback(lambda _: self.reactor.callWhenRunning(self._ready))
        d.addErrback(self._failed_to_start)

    def _open_access(self):
        """
        Load the access database (made on the first start), import --users, and
        serve its vhosts.
        """
        if self.access is None:
            return
        if self.access_defaults is not None:
            try:
                self._first_access_start = self.access.open(*self.access_defaults)
            except AccessDatabaseDamaged as damage:
                raise AccessDatabaseDamaged(f"--data-dir: {damage}") from None
        if self.users_file is not None:
            try:
                self.users_file.refresh()
            except (OSError, ValueError) as problem:
                raise ValueError(f"--users={self.users_file.path}: {problem}") from None
        for name in self.access.vhosts:
            # A vhost with its own store is served once that opens.
            if self.access.vhost_backend(name) is None:
                self.broker.add_vhost(name)

    @defer.inlineCallbacks
    def _open_vhost_stores(self, counts):
        """
        Open and recover each vhost's own store; one that fails takes down its
        vhost alone. Fires with C{counts}.
        """
        if self.access is None:
            return counts
        for name in self.access.vhosts:
            backend = self.access.vhost_backend(name)
            if backend is None:
                continue
            try:
                if self.broker.vhost_stores is None:
                    raise VhostStoreFailed(
                        name, "this broker has no data directory for vhosts' own stores"
                    )
                store = yield self.broker.vhost_stores.open(name, backend)
            except VhostStoreFailed as failed:
                log.error(
                    "vhost {vhost!r} is unavailable: its store cannot be opened: {problem}",
                    vhost=name, problem=failed.problem,
                )
                self.broker.mark_vhost_unavailable(name, failed.problem)
                continue
            self.broker.add_vhost(name, store)
            try:
                self.broker.recover(store)
            except Exception as problem:
                self.broker.forget_vhost(name)
                yield store.close()
                log.error(
                    "vhost {vhost!r} is unavailable: its store cannot be recovered: {problem}",
                    vhost=name, problem=problem,
                )
                self.broker.mark_vhost_unavailable(name, str(problem) or type(problem).__name__)
        return counts

    def _opened(self, _):
        self._store_opened = True
        if self.disk_monitor is not None:
            self.disk_monitor.start()  # the store made the data directory

    def _recovered(self, counts):
        if self._first_access_start:
            self._adopt_recovered_vhosts()
        if self.startup_report is not None:
            self.startup_report.warn_of_other_backends_data(self.store, counts)

    @defer.inlineCallbacks
    def _load_definitions(self):
        """
        Import the --load-definitions file, then tell every vhost its policies;
        a bad file stops the start.
        """
        if self.access is None:
            return
        if self.definitions_file is not None:
            try:
                yield load_definitions_file(self.broker, self.access, self.definitions_file)
            except DefinitionsRefused as refusal:
                raise DefinitionsRefused(
                    f"--load-definitions={self.definitions_file}: {refusal}"
                ) from None
            log.info(
                "definitions imported from {path} (--load-definitions)", path=self.definitions_file
            )
        publish_all_policies(self.broker, self.access)
        publish_all_limits(self.broker, self.access)

    def _adopt_recovered_vhosts(self):
        """
        A data directory from before the access database: the vhosts its
        store holds become vhosts of the new database, with every permission
        for the first start's administrator, so its clients keep their data.
        """
        administrator = self.access_defaults[0]
        for name in sorted(set(self.broker.vhosts) - set(self.access.vhosts)):
            self.access.add_vhost(name)
            if administrator is not None and self.access.user(administrator) is not None:
                self.access.set_permissions(administrator, name, *FULL_PERMISSIONS)
            log.info(
                "vhost {vhost!r}, found in the store, added to the new access database", vhost=name
            )

    def _ready(self):
        # Announced once the reactor runs (and has its signal handlers), so a
        # supervisor that starts talking to us or stops us from here on is safe.
        for listener in self.listeners:
            listener.announce()
        self._serving = True
        self.started.callback(self)

    def _failed_to_start(self, failure):
        if isinstance(failure.value, defer.FirstError):
            failure = failure.value.subFailure
        log.critical(
            "brokerd could not start: {problem}",
            problem=failure.getErrorMessage() or failure.type.__name__,
        )
        self.started.errback(failure)
        self.started.addErrback(lambda _: None)
        self.reactor.callWhenRunning(self._stop_after_failure)

    def _stop_after_failure(self):
        self.reactor.addSystemEventTrigger("after", "shutdown", _exit_with_failure)
        self.reactor.stop()

    @defer.inlineCallbacks
    def stopService(self):
        Service.stopService(self)
        ignore_further_stop_signals(self.reactor)
        self.ack_timeouts.stop()
        for listener in self.listeners:
            yield listener.stop()
        if self._serving:
            factories = list(dict.fromkeys(  # amqp and amqps share one
                listener.factory for listener in self.listeners if listener.broker_clients
            ))
            yield close_clients(self.reactor, self.broker.stores(), factories)
        for connection in list(self.broker.connections):
            connection.close()
        self.broker.stop()
        if self.disk_monitor is not None:
            self.disk_monitor.stop()
        if not self._store_opened:
            # A store that failed to open may hold a lock or files it opened
            # first; its stats mean nothing.
            try:
                yield self.store.close()
            except Exception as problem:
                log.debug("closing the store that failed to open: {problem!r}", problem=problem)
            return
        own_stores = dict(self.broker.own_stores)
        for name, store in own_stores.items():
            try:
                yield store.close()
            except Exception:
                log.failure("the store of vhost {vhost!r} failed to close", vhost=name)
        yield self.store.close()
        if not self._serving:
            return
        log.info(
            "store stats at stop: {stats}", stats=json.dumps(self.store.stats(), sort_keys=True)
        )
        for name, store in own_stores.items():
            log.info("store stats of vhost {vhost!r} at stop: {stats}", vhost=name,
                     stats=json.dumps(store.stats(), sort_keys=True))
        if getattr(self.reactor, "_exitSignal", None) == signal.SIGTERM:
            # twistd would end by re-raising SIGTERM (status
            # "killed by SIGTERM"); a clean stop exits 0.
            self.reactor._exitSignal = None
        log.info("brokerd stopped cleanly")


def _exit_with_failure():
    # twistd has no way to set its exit status; this runs after the reactor stops.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
