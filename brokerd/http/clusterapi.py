"""
C{/api/nodes}, C{/api/nodes/NAME} and brokerd's own C{/api/cluster}: the nodes of the cluster
as the answering node sees it (L{brokerd.cluster.status.ClusterStatus}).

A node on its own answers as before: one entry, itself. A node of a cluster answers one entry per
node it has seen, in RabbitMQ 3.10's shape (C{name} as C{brokerd@NODE}, C{type}, C{running}...),
with brokerd's fields added: C{cluster_name}, C{leader}, C{in_sync}, C{replication_lag_bytes},
C{replication_lag_operations} and, beside RabbitMQ's C{mem_alarm} and C{disk_free_alarm},
C{in_sync_alarm} (the leader holds its publishers back: too few nodes in sync). Its own entry
holds its own figures; another node's figures (memory, file descriptors, disk...) are not known
here, so they keep RabbitMQ's types with empty values (0, false, "", []): that node's own API
has them.
"""

from brokerd.http.nodename import cluster_node_name
from brokerd.http.overview import node_info
from brokerd.http.routes import not_found

# What another node's entry says of itself besides its name, running and type.
KNOWN_OF_ANOTHER = frozenset({"name", "type", "running", "rates_mode", "exchange_types"})


def nodes(api):
    api.check_monitor()
    return node_entries(api.context)


def node(api, name):
    api.check_monitor()
    for entry in node_entries(api.context):
        if entry["name"] == name:
            return entry
    raise not_found()


def node_entries(context):
    """One entry per node: this node alone, or every node of its cluster."""
    own = node_info(context)
    status = context.cluster
    if status is None:
        return [own]
    own["in_sync_alarm"] = context.broker.in_sync_alarm.blocked
    entries = []
    for seen in status.nodes():
        entry = own if seen.name == status.node_name else unknown_figures(own)
        entry.update({
            "name": cluster_node_name(seen.name),
            "running": seen.running,
            "cluster_name": status.cluster_name,
            "leader": seen.leader,
            "in_sync": seen.in_sync,
            "replication_lag_bytes": seen.lag_bytes,
            "replication_lag_operations": seen.lag_operations,
        })
        entries.append(entry)
    return entries


def unknown_figures(own):
    """Another node's entry: this node's fields, each figure this node cannot know of another
    emptied to the value of its type (so a client reads the types RabbitMQ gives)."""
    return {key: value if key in KNOWN_OF_ANOTHER else _empty(value) for key, value in own.items()}


def _empty(value):
    if isinstance(value, bool):
        return False
    return type(value)()


def cluster(api):
    """
    brokerd's C{/api/cluster}: the leader, when this node learnt of it (milliseconds since the
    epoch), the leader changes it has seen, the in-sync set, the minimum in-sync replicas if
    configured, and on the leader each follower's replication figures. 404 on a node on its own.
    """
    api.check_monitor()
    status = api.context.cluster
    if status is None:
        raise not_found()
    leader = status.leader_name()
    elected_at = status.leader_elected_at
    return {
        "cluster_name": status.cluster_name,
        "node": api.context.node,
        "leader": cluster_node_name(leader) if leader is not None else None,
        "leader_elected_at": int(elected_at * 1000) if elected_at is not None else None,
        "leader_changes": status.leader_changes,
        "running_nodes": [cluster_node_name(name) for name in status.running_members()],
        "in_sync": [cluster_node_name(name) for name in status.in_sync_set()],
        "min_in_sync": status.min_in_sync,
        "followers": [
            {"name": cluster_node_name(lag.node), "acked": lag.acked, "in_sync": lag.in_sync,
             "lag_operations": lag.lag_operations, "lag_bytes": lag.lag_bytes,
             "paused": lag.paused, "pauses": lag.pauses}
            for lag in status.followers()
        ],
    }
