"""brokerd's own families of a cluster's node (L{brokerd.cluster.status.ClusterStatus}), under
C{brokerd_cluster_}: whether it leads, the leader changes it saw, the in-sync set's and the live
members' sizes, whether it blocks publishers for want of nodes in sync, and, on the leader, each
follower's lag. RabbitMQ has no equivalent: its
C{rabbitmq_raft_*} families are the Raft logs of quorum queues (terms, log indexes, commit
latency), one per queue, and brokerd runs no Raft. A node on its own gives none of these.
"""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from brokerd.http.nodename import cluster_node_name


def cluster_families(status, in_sync_alarm=None):
    """
    The C{brokerd_cluster_*} metric families of C{status} now, with the state of the
    broker's L{brokerd.model.in_sync_alarm.InSyncAlarm} where the node runs a broker.
    """
    yield GaugeMetricFamily("brokerd_cluster_leader", "1 while this node leads its cluster, else 0",
                            value=int(status.is_leader()))
    yield CounterMetricFamily(
        "brokerd_cluster_leader_changes",
        "Leader changes this node has seen since it started (a leader seen at start included)",
        value=status.leader_changes,
    )
    yield GaugeMetricFamily("brokerd_cluster_in_sync_replicas",
                            "Nodes in the cluster's in-sync set, as etcd holds it",
                            value=len(status.in_sync_set()))
    yield GaugeMetricFamily("brokerd_cluster_members",
                            "Nodes of the cluster with a live member key (lease) in etcd",
                            value=len(status.running_members()))
    if in_sync_alarm is not None:
        yield GaugeMetricFamily(
            "brokerd_cluster_in_sync_alarm",
            "1 while this node, leading, blocks publishers: fewer nodes in sync than"
            " --cluster-min-isr asks for; else 0", value=int(in_sync_alarm.blocked))
    lag_bytes = GaugeMetricFamily(
        "brokerd_cluster_follower_lag_bytes",
        "Bytes of operations a follower has yet to acknowledge (on the leader only)",
        labels=["node"])
    lag_operations = GaugeMetricFamily(
        "brokerd_cluster_follower_lag_operations",
        "Operations a follower has yet to acknowledge (on the leader only)", labels=["node"])
    for lag in status.followers():
        name = cluster_node_name(lag.node)  # as the management API and the identity name it
        lag_bytes.add_metric([name], lag.lag_bytes)
        lag_operations.add_metric([name], lag.lag_operations)
    yield lag_bytes
    yield lag_operations
