"""The node's own figures: churn (connections, channels and queues opened or
created, closed or deleted), file descriptors and sockets, memory, and the
C{rabbitmq_build_info} and C{rabbitmq_identity_info} that every RabbitMQ dashboard
joins its queries on.
"""

import functools
import os
import resource
import sys

import prometheus_client
from prometheus_client.core import InfoMetricFamily

from brokerd import __version__
from brokerd.http.metrics.families import COUNTER, GAUGE, Family

RABBITMQ_VERSION = "3.10.8"  # the RabbitMQ whose interfaces brokerd follows


def _churn(broker):
    counters = broker.counters
    queues = counters.queues
    return (
        counters.connections_opened, counters.connections_closed, counters.channels_opened,
        counters.channels_closed, queues.declared, queues.created, queues.deleted,
    )


CHURN = Family("connection_churn_metrics", (
    ("connections_opened", COUNTER, "Total number of connections opened"),
    ("connections_closed", COUNTER, "Total number of connections closed or terminated"),
    ("channels_opened", COUNTER, "Total number of channels opened"),
    ("channels_closed", COUNTER, "Total number of channels closed"),
    ("queues_declared", COUNTER, "Total number of queues declared"),
    ("queues_created", COUNTER, "Total number of queues created"),
    ("queues_deleted", COUNTER, "Total number of queues deleted"),
), (), lambda broker, vhosts: [((), _churn(broker))])


def open_fds():
    """File descriptors this process has open (Linux's /proc; 0 where it cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def max_fds():
    """The most file descriptors this process may open (its soft RLIMIT_NOFILE)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def resident_memory_bytes():
    """This process's resident set size, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * resource.getpagesize()


def open_sockets(broker):
    """Client connections over a socket (AMQP and native; not the API's in-process ones)."""
    return sum(1 for connection in broker.connections if connection.protocol is not None)


NODE_COARSE = Family("node_coarse_metrics", (
    ("process_open_fds", GAUGE, "Open file descriptors"),
    ("process_open_tcp_sockets", GAUGE, "Open TCP sockets"),
    ("process_resident_memory_bytes", GAUGE, "Memory used in bytes"),
    ("disk_space_available_bytes", GAUGE, "Disk space available in bytes"),
), (), lambda broker, vhosts: [
    ((), (open_fds(), open_sockets(broker), resident_memory_bytes(), broker.disk_alarm.free or 0))
])

# brokerd has no socket limit of its own: a socket is a file descriptor.
NODE = Family("node_metrics", (
    ("process_max_fds", GAUGE, "Open file descriptors limit"),
    ("process_max_tcp_sockets", GAUGE, "Open TCP sockets limit"),
    ("resident_memory_limit_bytes", GAUGE, "Memory high watermark in bytes"),
), (), lambda broker, vhosts: [((), (max_fds(), max_fds(), broker.watermark.high))])


def identity(node, cluster=None):
    """
    C{rabbitmq_build_info} and C{rabbitmq_identity_info} of node C{node} in cluster C{cluster}
    (None: a node on its own, its cluster is itself), named as the management API names them.
    """
    build = InfoMetricFamily("rabbitmq_build", "RabbitMQ & Erlang/OTP version info")
    build.add_metric([], {
        "rabbitmq_version": RABBITMQ_VERSION, "prometheus_plugin_version": __version__,
        "prometheus_client_version": _client_version(), "erlang_version": "n/a",
        "product_name": "brokerd", "product_version": __version__,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
    })
    info = InfoMetricFamily("rabbitmq_identity", "RabbitMQ node & cluster identity info")
    info.add_metric([], {"rabbitmq_node": node, "rabbitmq_cluster": cluster or node,
                         "brokerd_version": __version__})
    return [build, info]


@functools.cache  # importlib.metadata reads the installed distributions: milliseconds
def _client_version():
    try:
        from importlib.metadata import version

        return version("prometheus_client")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return getattr(prometheus_client, "__version__", "unknown")
