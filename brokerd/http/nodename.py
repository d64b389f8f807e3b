"""The node's name, one for the management API and the Prometheus metrics.

RabbitMQ names a node C{rabbit@} and the host's short name, and its API, its
metrics' C{rabbitmq_node} and C{rabbitmq_cluster} labels and its tools all say
that name; brokerd says C{brokerd@} and the host's short name in all of them.
"""

import socket

NODE_PREFIX = "brokerd"


def node_name():
    """C{brokerd@host}: this host's name up to its first dot (C{localhost} if it has none)."""
    host = socket.gethostname().split(".")[0] or "localhost"
    return f"{NODE_PREFIX}@{host}"


def cluster_node_name(name):
    """The API's name of cluster node C{name}: C{brokerd@NAME}, as RabbitMQ's C{rabbit@host};
    a name that already holds an C{@} is taken as it is."""
    return name if "@" in name else f"{NODE_PREFIX}@{name}"
