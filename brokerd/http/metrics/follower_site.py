"""The Prometheus port of a cluster's follower: what a node that serves no clients can tell.

A follower runs no broker of its own (its client ports relay to the leader), so its metrics
are its identity and the C{brokerd_cluster_*} families as it sees the cluster; the
leader's port has every family, these included.
"""

from prometheus_client.registry import Collector, CollectorRegistry
from twisted.web.resource import Resource

from brokerd.http.metrics.cluster_status import cluster_families
from brokerd.http.metrics.node import identity
from brokerd.http.nodename import cluster_node_name
from brokerd.http.prometheus import MetricsPage, QuietSite


class FollowerCollector(Collector):
    """The families of a follower's L{brokerd.cluster.status.ClusterStatus}."""

    def __init__(self, status):
        self.status = status

    def collect(self):
        yield from identity(cluster_node_name(self.status.node_name), self.status.cluster_name)
        yield from cluster_families(self.status)


def follower_metrics_site(status):
    """The Site of a follower's C{--prometheus}: the same paths as the leader's, these families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FollowerCollector(status))
    page = MetricsPage(registry)
    for path in (b"per-object", b"detailed"):
        page.putChild(path, MetricsPage(registry))
    root = Resource()
    root.putChild(b"metrics", page)
    return QuietSite(root)
