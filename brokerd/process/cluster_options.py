"""Command-line options of cluster mode, and the L{ClusterSettings} they make.

Cluster mode is off unless C{--cluster-etcd} is given; without it a node runs alone,
as it always did, and needs no etcd. Each parser raises C{usage.UsageError} with the
option's name and the problem.
"""

import socket
from dataclasses import dataclass

from twisted.python import usage

from brokerd.cluster.lease import DEFAULT_TTL
from brokerd.cluster.view import check_name
from brokerd.units import parse_size

DEFAULT_CLUSTER_NAME = "brokerd"
# LavinMQ's clustering port.
DEFAULT_REPLICATION = "tcp:5679:interface=127.0.0.1"
DEFAULT_MAX_LAG_BYTES = "16M"
DEFAULT_MAX_LAG_SECONDS = "5"

CLUSTER_PARAMETERS = [
    [
        "cluster-etcd",
        None,
        None,
        "Run as a node of a replicated cluster whose leadership, members and in-sync set live"
        " in etcd at these URLs (http://HOST:PORT or https://..., comma-separated; http only"
        " on loopback). Default: no cluster, no etcd.",
    ],
    [
        "cluster-etcd-ca",
        None,
        None,
        "CA certificates (PEM) that etcd's https certificate must chain to (default: the"
        " system's trust store).",
    ],
    ["cluster-name", None, DEFAULT_CLUSTER_NAME, "The cluster this node belongs to."],
    [
        "node-name",
        None,
        None,
        "This node's name in the cluster, unique among its nodes (default: the host name).",
    ],
    [
        "replication",
        None,
        DEFAULT_REPLICATION,
        "Endpoint where this node, while it leads, streams its stores' changes to the"
        " followers (an ssl: endpoint as for --amqps serves it over TLS).",
    ],
    [
        "replication-trust-roots",
        None,
        None,
        "A directory of CA certificates (PEM) the leader's replication certificate must chain"
        " to when --replication is TLS (default: the system's trust store); its name is"
        " checked too.",
    ],
    [
        "cluster-advertise-host",
        None,
        None,
        "The host name or address other nodes reach this node's ports at (default: the"
        " interface each endpoint listens on, or the host name when that is every interface).",
    ],
    [
        "cluster-lease-ttl",
        None,
        str(int(DEFAULT_TTL)),
        "Seconds of this node's etcd lease: a leader that cannot renew it stops confirming"
        " within 2/3 of this, and another node takes over after it.",
    ],
    [
        "cluster-min-isr",
        None,
        "1",
        "Fewest nodes (the leader included) that must hold a persistent message before it is"
        " confirmed; with fewer in sync, confirms wait and publishing connections are not read"
        " (AMQP clients get connection.blocked naming the in-sync count).",
    ],
    [
        "cluster-max-lag-bytes",
        None,
        DEFAULT_MAX_LAG_BYTES,
        "A follower whose durable copy lags the leader by more than this (K, M, G) leaves the"
        " in-sync set until it catches up.",
    ],
    [
        "cluster-max-lag-seconds",
        None,
        DEFAULT_MAX_LAG_SECONDS,
        "A follower that has not made durable a change older than this many seconds leaves"
        " the in-sync set until it catches up.",
    ],
]


@dataclass(frozen=True)
class ClusterSettings:
    """What cluster mode was told: where etcd is and how this node takes part."""

    etcd_urls: tuple
    etcd_ca: str
    cluster_name: str
    node_name: str
    replication: str
    replication_trust_roots: str
    advertise_host: str
    lease_ttl: float
    min_isr: int
    max_lag_bytes: int
    max_lag_seconds: float


def _number(options, name, kind, minimum):
    try:
        value = kind(options[name])
        if value < minimum:
            raise ValueError
    except ValueError:
        raise usage.UsageError(
            f"--{name}: {options[name]!r} is not a number of at least {minimum}"
        ) from None
    return value


def cluster_settings(options):
    """The L{ClusterSettings} of parsed options, or None when C{--cluster-etcd} is absent."""
    if not options["cluster-etcd"]:
        return None
    urls = tuple(url.strip() for url in options["cluster-etcd"].split(",") if url.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise usage.UsageError(f"--cluster-etcd: {url!r} is not an http:// or https:// URL")
    node_name = options["node-name"] or socket.gethostname().split(".")[0]
    for option, value in (("cluster-name", options["cluster-name"]), ("node-name", node_name)):
        try:
            check_name(value, option.replace("-", " "))
        except ValueError as problem:
            raise usage.UsageError(f"--{option}: {problem}") from None
    try:
        max_lag_bytes = parse_size(options["cluster-max-lag-bytes"])
    except ValueError as problem:
        raise usage.UsageError(f"--cluster-max-lag-bytes: {problem}") from None
    return ClusterSettings(
        etcd_urls=urls,
        etcd_ca=options["cluster-etcd-ca"],
        cluster_name=options["cluster-name"],
        node_name=node_name,
        replication=options["replication"],
        replication_trust_roots=options["replication-trust-roots"],
        advertise_host=options["cluster-advertise-host"],
        lease_ttl=_number(options, "cluster-lease-ttl", float, 1),
        min_isr=_number(options, "cluster-min-isr", int, 1),
        max_lag_bytes=max_lag_bytes,
        max_lag_seconds=_number(options, "cluster-max-lag-seconds", float, 0.1),
    )
