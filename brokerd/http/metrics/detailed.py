"""The families by RabbitMQ's names, what C{/metrics} and C{/metrics/per-object} add
of them to L{brokerd.http.prometheus}'s, and C{/metrics/detailed}.

C{/metrics/detailed} gives only the families its C{family} query parameters name
(repeated for several; names it does not know are ignored, as RabbitMQ ignores
them), one sample per object under the prefix C{rabbitmq_detailed_} (the vhost
and exchange families under C{rabbitmq_cluster_}); its C{vhost} parameters narrow
the queue families to those vhosts (unknown ones ignored, so naming only unknown
ones leaves no queue). Build and identity info always come with it, so that
queries can join on the node and cluster names.
"""

from prometheus_client import generate_latest
from twisted.web.resource import Resource

from brokerd.http.metrics import clients, cluster, node, queues

DETAILED_PREFIX = "rabbitmq_detailed_"
CLUSTER_PREFIX = "rabbitmq_cluster_"
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

FAMILIES = {family.name: family for family in (
    node.CHURN, node.NODE_COARSE, node.NODE, queues.QUEUE_COARSE, queues.QUEUE_CONSUMER_COUNT,
    queues.QUEUE, clients.CHANNEL, clients.CHANNEL_EXCHANGE, clients.CHANNEL_QUEUE,
    clients.CONNECTION_COARSE, clients.CONNECTION, queues.QUEUE_PUBLISHED,
)}
CLUSTER_FAMILIES = {family.name: family for family in (
    cluster.VHOST_STATUS, cluster.EXCHANGE_BINDINGS, cluster.EXCHANGE_NAMES,
)}
# What /metrics and /metrics/per-object give besides brokerd.http.prometheus's own families,
# and the metrics of these that it gives already (so that no name is written twice).
ADDED_FAMILIES = (
    node.CHURN, node.NODE_COARSE, node.NODE, queues.QUEUE, queues.QUEUE_PUBLISHED,
    clients.CHANNEL, clients.CHANNEL_EXCHANGE, clients.CHANNEL_QUEUE,
    clients.CONNECTION_COARSE, clients.CONNECTION,
)
GIVEN_ALREADY = frozenset((
    "connections_opened", "connections_closed", "process_resident_memory_bytes",
    "resident_memory_limit_bytes", "queue_consumers",
))


def added_families(broker, per_object):
    """The metric families C{/metrics} (or with C{per_object}, C{/metrics/per-object}) adds."""
    written = []
    for family in ADDED_FAMILIES:
        written += family.write(broker, "rabbitmq_", per_object, skip=GIVEN_ALREADY)
    return written


class DetailedCollector:
    """The families of one C{/metrics/detailed} request, read when collected."""

    def __init__(self, broker, node_name, families, vhosts, cluster_name=None):
        """
        @param families: the family names the request gave.
        @param vhosts: the vhost names the request gave, or None for every vhost.
        @param cluster_name: the cluster's name in the identity (None: a node on its own).
        """
        self.broker = broker
        self.node_name = node_name
        self.cluster_name = cluster_name
        self.families = families
        self.vhosts = vhosts

    def collect(self):
        broker, asked = self.broker, set(self.families)
        vhosts = None if self.vhosts is None else set(self.vhosts) & set(broker.vhosts)
        # A queue's consumers are in queue_metrics already when both are asked for (as RabbitMQ).
        if "queue_metrics" in asked:
            asked.discard("queue_consumer_count")
        for name, family in FAMILIES.items():
            if name in asked:
                yield from family.write(broker, DETAILED_PREFIX, True, vhosts)
        for name, family in CLUSTER_FAMILIES.items():
            if name in asked:
                yield from family.write(broker, CLUSTER_PREFIX, True, vhosts)
        yield from node.identity(self.node_name, self.cluster_name)


class DetailedMetricsPage(Resource):
    """C{/metrics/detailed}: the families asked for, made on the reactor thread at each GET."""

    isLeaf = True

    def __init__(self, broker, node_name, cluster_name=None):
        super().__init__()
        self.broker = broker
        self.node_name = node_name
        self.cluster_name = cluster_name

    def render_GET(self, request):
        families = [_text(name) for name in request.args.get(b"family", [])]
        vhosts = request.args.get(b"vhost")
        collector = DetailedCollector(
            self.broker, self.node_name, families,
            None if vhosts is None else [_text(name) for name in vhosts], self.cluster_name,
        )
        request.setHeader(b"Content-Type", CONTENT_TYPE)
        return generate_latest(collector)


def _text(value):
    return value.decode("utf-8", "replace")
