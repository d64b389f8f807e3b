"""``twistd brokerd``: command-line options and the service they build.

Imported by twistd only when the ``brokerd`` subcommand is used, so ``twistd
--help`` stays fast. Option values are checked here, before anything starts; a
bad value ends twistd with a one-line error naming the option.
"""

import gc
import os
import sys

from twisted.python import usage

from brokerd.access.database import DEFAULT_PASS, DEFAULT_USER, AccessDatabase
from brokerd.amqp import auth
from brokerd.amqp.settings import (
    DEFAULT_FRAME_MAX,
    DEFAULT_HEARTBEAT,
    DEFAULT_MAX_MESSAGE_SIZE,
    AmqpSettings,
)
from brokerd.native.server import DEFAULT_CHANNEL_MAX as DEFAULT_NATIVE_CHANNEL_MAX
from brokerd.native.server import DEFAULT_MAX_FRAME_SIZE
from brokerd.process.cluster_options import CLUSTER_PARAMETERS, cluster_settings
from brokerd.process.disk_monitor import parse_disk_free_limit
from brokerd.process.resource_options import connection_memory_limits, parse_consumer_timeout
from brokerd.process.service import BrokerService
from brokerd.process.startup_report import StartupReport
from brokerd.session.ack_timeouts import DEFAULT_CONSUMER_TIMEOUT
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy
from brokerd.storage.vhost_stores import NoOwnStores, VhostStores
from brokerd.units import parse_size
from brokerd.wire.endpoints import TlsFileProblem, endpoint_problem, is_tls, server_endpoint

DEFAULT_BACKEND = "chunked"
MESSAGE_HEAD_ALLOWANCE = 1 << 20  # for a stored message's exchange, routing key and properties
DEFAULT_DATA_DIR = "./brokerd-data"
DEFAULT_NATIVE = "tcp:5673:interface=127.0.0.1"
DEFAULT_AMQP = "tcp:5672:interface=127.0.0.1"
# The port of RabbitMQ's rabbitmq_prometheus plugin:
DEFAULT_PROMETHEUS = "tcp:15692:interface=127.0.0.1"
DEFAULT_HTTP = "tcp:15672:interface=127.0.0.1"  # RabbitMQ's management plugin's port
# twistd's own default pid file, in the working directory; brokerd's is in --data-dir:
TWISTD_DEFAULT_PIDFILE = "twistd.pid"
PIDFILE_NAME = "brokerd.pid"


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Runs brokerd, a message broker following the AMQP 0-9-1 model, with the"
        " chosen storage backend. Endpoint options take Twisted endpoint strings"
        " (e.g. tcp:5673:interface=0.0.0.0, unix:/run/brokerd.sock)."
    )

    optFlags = [
        [
            "http-access-log",
            None,
            "Log a line per request to the HTTP API and dashboard (off by default, as"
            " RabbitMQ's management listener: an open dashboard polls every few seconds).",
        ],
    ]

    optParameters = [
        [
            "backend",
            None,
            DEFAULT_BACKEND,
            "Storage backend and its options, NAME[:key=value...]; see --help-backends.",
        ],
        [
            "memory-high-watermark",
            None,
            "1G",
            "Message bytes in memory (queued bodies, bodies and transactions on their way in,"
            " replies clients have not read) above which publishing connections are not read"
            " (AMQP clients get connection.blocked; K, M, G suffixes); they resume below 80%"
            " of it.",
        ],
        [
            "connection-memory-share",
            None,
            "0.25",
            "What one client connection may hold on its way in (unfinished message bodies,"
            " publishes of uncommitted transactions, partial frames) before that connection"
            " alone is blocked (AMQP clients get connection.blocked and it is read a step a"
            " second): a fraction of --memory-high-watermark (0.25) or a size (K, M, G).",
        ],
        [
            "connection-memory-limit",
            None,
            "0.5",
            "What one client connection may hold on its way in before it is closed with"
            " 530 NOT_ALLOWED naming the limit: a fraction of --memory-high-watermark (0.5)"
            " or a size (K, M, G); above --connection-memory-share.",
        ],
        [
            "consumer-timeout",
            None,
            str(DEFAULT_CONSUMER_TIMEOUT),
            "Milliseconds a delivery (to a consumer or by basic.get) may stay un-acked before"
            " its channel is closed with 406 PRECONDITION_FAILED and the message requeued, as"
            " RabbitMQ's consumer_timeout; 0 or none: no limit. A queue's x-consumer-timeout"
            " argument or consumer-timeout policy key overrides it.",
        ],
        [
            "disk-free-limit",
            None,
            "50MB",
            "Free space of the data directory's file system below which publishing connections"
            " are not read (AMQP clients get connection.blocked, 'low on disk'), as RabbitMQ's"
            " disk_free_limit: bytes with a unit (50MB, 2GB: powers of 1000; 512MiB, 1G: of"
            " 1024) or mem_relative:RATIO (that many times the physical memory).",
        ],
        [
            "data-dir",
            None,
            DEFAULT_DATA_DIR,
            "Directory where durable backends keep their files, and the access database"
            " (access.json).",
        ],
        [
            "sync",
            None,
            "always",
            "When publisher confirms go out for persistent messages: always (after the fsync"
            " covering them, shared by many messages), interval:MS (fsync every MS ms), or none"
            " (after the write; unsafe on power loss).",
        ],
        [
            "amqp",
            None,
            DEFAULT_AMQP,
            "Endpoint for AMQP 0-9-1 clients (pika, kombu, aio-pika); 'none' to disable it.",
        ],
        [
            "amqps",
            None,
            None,
            "Endpoint for AMQP 0-9-1 over TLS, e.g. ssl:5671:privateKey=key.pem:certKey=cert.pem"
            "[:extraCertChain=chain.pem][:caCerts=ca.pem]; with caCerts, clients must present"
            " a certificate signed by one of those authorities. Default: none.",
        ],
        [
            "native",
            None,
            DEFAULT_NATIVE,
            "Endpoint for the native protobuf protocol (an ssl: endpoint as for --amqps serves it"
            " over TLS); 'none' to disable it.",
        ],
        [
            "prometheus",
            None,
            DEFAULT_PROMETHEUS,
            "Endpoint for Prometheus metrics, at /metrics (aggregated) and /metrics/per-object"
            " (per queue), with the names of RabbitMQ's rabbitmq_prometheus plugin; 'none' to"
            " disable it.",
        ],
        [
            "http",
            None,
            DEFAULT_HTTP,
            "Endpoint for the HTTP management API (RabbitMQ's /api/..., basic authentication"
            " against the broker's users); 'none' to disable it.",
        ],
        [
            "auth-mechanisms",
            None,
            ",".join(auth.MECHANISMS),
            "SASL mechanisms AMQP clients may log in with, comma-separated, from PLAIN, AMQPLAIN"
            " and EXTERNAL (EXTERNAL: the user named by the TLS client certificate's subject CN,"
            " offered on TLS connections that presented one).",
        ],
        [
            "users",
            None,
            None,
            "File of UTF-8 user:password lines imported into the access database at start and"
            " whenever it changes; its new users get every permission on vhost /. Given on the"
            " first start, it replaces guest.",
        ],
        [
            "load-definitions",
            None,
            None,
            "A definitions file in RabbitMQ's JSON format (users with their password hashes,"
            " vhosts, permissions, policies, exchanges, queues, bindings) imported at every start,"
            " after recovery and before clients are accepted (as RabbitMQ's load_definitions);"
            " what exists already is left as it is.",
        ],
        [
            "default-user",
            None,
            None,
            "The administrator the first start creates, with every permission on /"
            " (default: $RABBITMQ_DEFAULT_USER, else guest, who may log in from loopback only).",
        ],
        [
            "default-pass",
            None,
            None,
            "That administrator's password (default: $RABBITMQ_DEFAULT_PASS, else guest).",
        ],
        [
            "heartbeat",
            None,
            str(DEFAULT_HEARTBEAT),
            "AMQP heartbeat interval offered to clients in connection.tune, in seconds (0: off);"
            " a client silent for two intervals is dropped.",
        ],
        [
            "frame-max",
            None,
            str(DEFAULT_FRAME_MAX),
            "Largest AMQP frame offered to clients in connection.tune, in bytes (K, M suffixes);"
            " a larger frame closes the connection with 501.",
        ],
        [
            "max-message-size",
            None,
            str(DEFAULT_MAX_MESSAGE_SIZE),
            "Largest AMQP message body accepted, in bytes (K, M, G suffixes); a larger one closes"
            " its channel with 406.",
        ],
        [
            "native-max-frame",
            None,
            str(DEFAULT_MAX_FRAME_SIZE),
            "Largest native-protocol frame accepted, in bytes (K, M, G suffixes allowed);"
            " a larger one closes that client's connection.",
        ],
        [
            "connection-max",
            None,
            "infinity",
            "Most client connections (AMQP, AMQPS and native together) open at once, as"
            " RabbitMQ's connection_max; one more is closed before a byte is read. infinity:"
            " no ceiling.",
        ],
        [
            "native-channel-max",
            None,
            str(DEFAULT_NATIVE_CHANNEL_MAX),
            "Most channels one native-protocol connection may have open; opening one more closes"
            " the connection with 530 NOT_ALLOWED.",
        ],
        *CLUSTER_PARAMETERS,
    ]

    def opt_help_backends(self):
        """List the storage backends and their options, then exit."""
        for line in registry.describe_backends():
            print(line)
        sys.exit(0)

    def parseOptions(self, options=None):
        try:
            super().parseOptions(options)
        except usage.UsageError as problem:
            raise SystemExit(f"twistd brokerd: {problem}") from None

    def postOptions(self):
        from twisted.internet import reactor

        try:
            self["native-max-frame"] = parse_size(self["native-max-frame"])
        except ValueError as problem:
            raise usage.UsageError(f"--native-max-frame: {problem}") from None
        try:
            self["native-channel-max"] = int(self["native-channel-max"])
            if self["native-channel-max"] < 1:
                raise ValueError
        except ValueError:
            raise usage.UsageError(
                f"--native-channel-max: {self['native-channel-max']!r}"
                " is not a positive number of channels"
            ) from None
        self["connection-max"] = _connection_max(self["connection-max"])
        for name in ("native", "amqp", "amqps", "prometheus", "http"):
            self[name] = _endpoint_option(reactor, name, self[name])
        if self["amqps"] is not None and not is_tls(self["amqps"]):
            raise usage.UsageError(
                f"--amqps: {self['amqps']!r} is not a TLS endpoint; use ssl:PORT:privateKey=..."
            )
        self["amqp-settings"] = self._amqp_settings()
        try:
            self["memory-high-watermark"] = parse_size(self["memory-high-watermark"])
        except ValueError as problem:
            raise usage.UsageError(f"--memory-high-watermark: {problem}") from None
        try:
            self["connection-memory"] = connection_memory_limits(
                self["memory-high-watermark"], self["connection-memory-share"],
                self["connection-memory-limit"],
            )
        except ValueError as problem:
            raise usage.UsageError(str(problem)) from None
        try:
            self["consumer-timeout"] = parse_consumer_timeout(self["consumer-timeout"])
        except ValueError as problem:
            raise usage.UsageError(f"--consumer-timeout: {problem}") from None
        try:
            self["disk-free-limit"] = parse_disk_free_limit(self["disk-free-limit"])
        except ValueError as problem:
            raise usage.UsageError(f"--disk-free-limit: {problem}") from None
        try:
            self["sync"] = SyncPolicy.parse(self["sync"])
        except ValueError as problem:
            raise usage.UsageError(f"--sync: {problem}") from None
        try:
            self["store"] = registry.make_store(
                self["backend"], self["data-dir"], self["sync"], reactor=reactor
            )
        except registry.BackendError as problem:
            raise usage.UsageError(f"--backend: {problem}") from None
        self._check_message_fits(self["store"], self["amqp-settings"].max_message_size)
        self._pidfile_in_data_dir()
        self["cluster"] = cluster_settings(self)
        if self["load-definitions"] is not None:
            try:
                with open(self["load-definitions"], "rb"):
                    pass
            except OSError as problem:
                raise usage.UsageError(
                    f"--load-definitions: cannot read {self['load-definitions']!r}:"
                    f" {problem.strerror}"
                ) from None

    def _pidfile_in_data_dir(self):
        """
        twistd's pid file, unless C{--pidfile} named another, goes into the
        data directory (as RabbitMQ's does) instead of C{./twistd.pid}, so
        brokers with their own data directories can start in one directory,
        and a second broker on the same data directory is refused.
        """
        parent = getattr(self, "parent", None)  # twistd's options; None when parsed alone
        if parent is None or parent.get("pidfile") != TWISTD_DEFAULT_PIDFILE:
            return
        try:
            os.makedirs(self["data-dir"], exist_ok=True)
        except OSError as problem:
            raise usage.UsageError(
                f"--data-dir: cannot create {self['data-dir']!r}: {problem.strerror}"
            ) from None
        parent["pidfile"] = os.path.join(self["data-dir"], PIDFILE_NAME)

    @staticmethod
    def _check_message_fits(store, max_message_size):
        """
        A store whose records have a size limit (the chunked one's chunks) must
        hold the largest message.
        """
        capacity = getattr(store, "chunk_capacity", None)
        if capacity is not None and max_message_size + MESSAGE_HEAD_ALLOWANCE > capacity:
            raise usage.UsageError(
                f"--max-message-size: a message of {max_message_size} bytes would not fit"
                f" in the {store.name} backend's chunks of {capacity} bytes;"
                " raise its chunk_size or lower --max-message-size"
            )

    def _amqp_settings(self):
        try:
            heartbeat = int(self["heartbeat"])
            if not 0 <= heartbeat <= 65535:
                raise ValueError
        except ValueError:
            raise usage.UsageError(
                f"--heartbeat: {self['heartbeat']!r} is not a number of seconds (0-65535)"
            ) from None
        sizes = {}
        for name in ("frame-max", "max-message-size"):
            try:
                sizes[name] = parse_size(self[name])
            except ValueError as problem:
                raise usage.UsageError(f"--{name}: {problem}") from None
        if not 4096 <= sizes["frame-max"] <= 2**32 - 1:
            raise usage.UsageError(f"--frame-max: {sizes['frame-max']} is outside 4096..4294967295")
        return AmqpSettings(
            authenticator=self._authenticator(),
            frame_max=sizes["frame-max"],
            heartbeat=heartbeat,
            max_message_size=sizes["max-message-size"],
        )

    def _authenticator(self):
        """
        The access database in --data-dir (opened at start) and the --users
        file to import into it.
        """
        access = AccessDatabase.in_directory(self["data-dir"])
        users_file = None
        if self["users"] is not None:
            try:
                with open(self["users"], "rb"):
                    pass
            except OSError as problem:
                raise usage.UsageError(
                    f"--users: cannot read {self['users']!r}: {problem.strerror}"
                ) from None
            users_file = auth.UsersFileImport(self["users"], access)
        default_user = self["default-user"] or os.environ.get("RABBITMQ_DEFAULT_USER")
        if default_user is None and users_file is None:
            default_user = DEFAULT_USER
        default_pass = (
            self["default-pass"] or os.environ.get("RABBITMQ_DEFAULT_PASS") or DEFAULT_PASS
        )
        self["access-defaults"] = (default_user, default_pass)
        mechanisms = tuple(
            name.strip().upper() for name in self["auth-mechanisms"].split(",") if name.strip()
        )
        unknown = [name for name in mechanisms if name not in auth.ALL_MECHANISMS]
        if unknown or not mechanisms:
            raise usage.UsageError(
                f"--auth-mechanisms: {self['auth-mechanisms']!r} must name some of"
                f" {', '.join(auth.ALL_MECHANISMS)}"
            )
        return auth.Authenticator(access, users_file=users_file, mechanisms=mechanisms)


def _endpoint_option(reactor, name, value):
    """An endpoint option's value checked, or None for 'none'."""
    if value is None or value.lower() == "none":
        return None
    try:
        problem = endpoint_problem(server_endpoint, reactor, value)
    except TlsFileProblem as problem:
        raise usage.UsageError(f"--{name}: {problem}") from None
    if problem is not None:
        raise usage.UsageError(f"--{name}: {value!r} is not a valid endpoint: {problem}")
    return value


def _connection_max(value):
    """C{--connection-max}: None for infinity, else a number of connections (0 or more)."""
    if value == "infinity":
        return None
    try:
        maximum = int(value)
        if maximum < 0:
            raise ValueError
    except ValueError:
        raise usage.UsageError(
            f"--connection-max: {value!r} is neither infinity nor a number of connections"
        ) from None
    return maximum


def makeService(options):
    from twisted.internet import reactor

    from brokerd.wire.stop_signals import stop_once_on_signals

    # Two quick SIGTERMs stop it once, quietly.
    reactor.callWhenRunning(stop_once_on_signals, reactor)
    if options["cluster"] is not None:
        from brokerd.process.cluster_node import node_of_options

        service = node_of_options(options, reactor, _broker_service)
    else:
        service = _broker_service(options, reactor, options["store"])
    # What exists before the store opens (modules, classes, functions: tens of thousands
    # of objects that live as long as the process) leaves the cyclic collector's care,
    # so that its full collections walk only what the broker made since: 67 ms each in a
    # run of 100,000 paged deliveries, 2 ms frozen (5 % of the CPU).
    gc.freeze()
    return service


def _broker_service(options, reactor, store, bound_ports=None, cluster_status=None):
    """The L{BrokerService} the options describe, over C{store}."""
    service = BrokerService(
        store,
        reactor,
        native_endpoint=options["native"],
        native_max_frame_size=options["native-max-frame"],
        native_channel_max=options["native-channel-max"],
        amqp_endpoint=options["amqp"],
        amqps_endpoint=options["amqps"],
        amqp_settings=options["amqp-settings"],
        access_defaults=options["access-defaults"],
        vhost_stores=(VhostStores(options["data-dir"], options["sync"], reactor)
                      if cluster_status is None else NoOwnStores()),
        definitions_file=options["load-definitions"],
        http_endpoint=options["http"],
        http_access_log=options["http-access-log"],
        memory_high_watermark=options["memory-high-watermark"],
        connection_memory=options["connection-memory"],
        consumer_timeout=options["consumer-timeout"],
        disk_free_limit=options["disk-free-limit"],
        data_dir=options["data-dir"],
        prometheus_endpoint=options["prometheus"],
        bound_ports=bound_ports,
        cluster_status=cluster_status,
        startup_report=StartupReport(
            options["backend"], options["data-dir"], options["sync"], reactor
        ),
    )
    service.limit_client_connections(options["connection-max"])
    return service
