"""Prometheus metrics, with the names of RabbitMQ's rabbitmq_prometheus plugin.

L{BrokerCollector} is a C{prometheus_client} collector on a registry of its
own (not the library's global one) that reads the broker's state when
scraped: queues, connections, channels and consumers, the broker-wide message
counters (L{brokerd.model.counters}), the memory watermark, the stores'
figures (fsyncs, commit times, chunk reads, cache hit ratio, labelled with the
backend) and the failed logins, and RabbitMQ's further families of channels,
connections, churn, the node and queue bytes (L{brokerd.http.metrics}). Nothing
is counted per message for it, and a scrape costs O(queues + connections +
channels + consumers + un-acked deliveries).

L{metrics_site} serves it with twisted.web on the reactor thread (the state
it reads belongs to that thread, so prometheus_client's WSGI resource, which
runs in a thread pool, would not do): C{/metrics} with queue figures summed
over the queues, C{/metrics/per-object} with one sample per queue, labelled
C{vhost} and C{queue}, as RabbitMQ's two endpoints, and C{/metrics/detailed}
with the families its query names (L{brokerd.http.metrics.detailed}).
"""


from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry
from twisted.web.resource import Resource
from twisted.web.server import Site

from brokerd.http.metrics.cluster_status import cluster_families
from brokerd.http.metrics.detailed import DetailedMetricsPage, added_families
from brokerd.http.metrics.node import identity, resident_memory_bytes
from brokerd.http.nodename import cluster_node_name, node_name
from brokerd.interfaces import ITimedCommits

# The text format every Prometheus server reads, and what RabbitMQ's plugin answers with.
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

# (metric name, help, counter name in MessageCounters.totals) -- RabbitMQ's global counters
GLOBAL_COUNTERS = (
    (
        "messages_received", "Total number of messages received from publishers",
        "messages_published",
    ),
    (
        "messages_received_confirm",
        "Total number of messages received from publishers expecting confirmations",
        "messages_received_confirm",
    ),
    (
        "messages_unroutable_dropped",
        "Total number of messages published as non-mandatory into an exchange"
        " and dropped as unroutable",
        "messages_unroutable_dropped",
    ),
    (
        "messages_unroutable_returned",
        "Total number of messages published as mandatory into an exchange"
        " and returned to the publisher as unroutable",
        "messages_unroutable_returned",
    ),
    (
        "messages_confirmed", "Total number of messages confirmed to publishers",
        "messages_confirmed",
    ),
    (
        "messages_delivered",
        "Total number of messages delivered to consumers (basic.get included)",
        "messages_delivered",
    ),
    (
        "messages_redelivered", "Total number of messages redelivered to consumers",
        "messages_redelivered",
    ),
    (
        "messages_acknowledged", "Total number of messages acknowledged by consumers",
        "messages_acked",
    ),
    (
        "messages_delivered_consume_manual_ack",
        "Total number of messages delivered to consumers using manual acknowledgement mode",
        "messages_delivered_manual_ack",
    ),
    (
        "messages_delivered_consume_auto_ack",
        "Total number of messages delivered to consumers using automatic acknowledgement mode",
        "messages_delivered_no_ack",
    ),
    (
        "messages_delivered_get_manual_ack",
        "Total number of messages fetched with basic.get using manual acknowledgement mode",
        "messages_got_manual_ack",
    ),
    (
        "messages_delivered_get_auto_ack",
        "Total number of messages fetched with basic.get using automatic acknowledgement mode",
        "messages_got_no_ack",
    ),
    (
        "messages_get_empty", "Total number of times basic.get operations fetched no message",
        "gets_empty",
    ),
)
QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
)


class BrokerCollector(Collector):
    """
    Reads a L{brokerd.model.broker.Broker} (and its access database, for
    failed logins) at each scrape.

    @param per_object: one sample per queue (labels C{vhost}, C{queue}) instead
        of one summed over the queues.
    """

    def __init__(self, broker, access=None, per_object=False, node=None, cluster=None):
        self.broker = broker
        self.access = access
        self.per_object = per_object
        self.cluster = cluster  # a brokerd.cluster.status.ClusterStatus; None: a node on its own
        if node is None:  # as the management API names it
            node = node_name() if cluster is None else cluster_node_name(cluster.node_name)
        self.node = node

    def collect(self):
        broker = self.broker
        yield from self._queues(broker)
        yield from self._connections(broker)
        yield from self._global_counters(broker)
        yield from self._memory(broker)
        yield from self._disk(broker)
        yield from self._stores(broker)
        yield from added_families(broker, self.per_object)
        if self.access is not None:
            failed = CounterMetricFamily(
                "brokerd_failed_logins", "Logins refused, by the user name given", labels=["user"]
            )
            for user, count in sorted(self.access.failed_logins.items()):
                failed.add_metric([user], count)
            yield failed
        if self.cluster is not None:
            yield from cluster_families(self.cluster, broker.in_sync_alarm)
        cluster_name = self.cluster.cluster_name if self.cluster is not None else None
        yield from identity(self.node, cluster_name)  # rabbitmq_build_info, rabbitmq_identity_info

    def _unacked_by_queue(self, broker):
        """
        (vhost, queue) -> un-acked deliveries: the consumers' counts; a channel
        holding others (basic.get's, a cancelled consumer's) has those looked up one by one.
        """
        unacked = {}
        for connection in broker.connections:
            for channel in connection.channels.values():
                consumers = channel.consumers
                counted = 0
                for consumer in consumers.values():
                    key = consumer.queue.key
                    unacked[key] = unacked.get(key, 0) + consumer.unacked
                    counted += consumer.unacked
                if channel.unacked_count > counted:
                    for entry in channel.unacked_deliveries.values():
                        consumer = entry.consumer
                        if consumer is None or consumers.get(consumer.tag) is not consumer:
                            key = entry.queue.key
                            unacked[key] = unacked.get(key, 0) + 1
        return unacked

    def _queues(self, broker):
        labels = ["vhost", "queue"] if self.per_object else []
        families = [GaugeMetricFamily(name, text, labels=labels) for name, text in QUEUE_GAUGES]
        unacked = self._unacked_by_queue(broker)
        totals = [0, 0, 0, 0]
        queue_count = alarmed = 0
        alarms = GaugeMetricFamily(
            "brokerd_queue_backlog_alarm",
            "1 while a queue has more messages ready than its backlog alarm"
            " (x-backlog-alarm or the policy key backlog-alarm) allows, per queue that has one;"
            " summed: how many queues are in alarm",
            labels=labels)
        for vhost in broker.vhosts.values():
            for queue in vhost.queues.values():
                queue_count += 1
                if queue.backlog_alarm is not None:
                    alarmed += queue.backlog_alarmed
                    if self.per_object:
                        alarms.add_metric([vhost.name, queue.name], int(queue.backlog_alarmed))
                ready = queue.message_count
                held = unacked.get(queue.key, 0)
                values = (ready, held, ready + held, queue.consumer_count)
                if self.per_object:
                    for family, value in zip(families, values):
                        family.add_metric([vhost.name, queue.name], value)
                else:
                    totals = [total + value for total, value in zip(totals, values)]
        if not self.per_object:
            for family, total in zip(families, totals):
                family.add_metric([], total)
            alarms.add_metric([], alarmed)
        yield from families
        yield alarms
        yield GaugeMetricFamily("rabbitmq_queues", "Queues available", value=queue_count)

    def _connections(self, broker):
        connections = list(broker.connections)
        channels = sum(len(connection.channels) for connection in connections)
        consumers = sum(len(channel.consumers)
                        for connection in connections for channel in connection.channels.values())
        counters = broker.counters
        yield GaugeMetricFamily(
            "rabbitmq_connections", "Connections currently open", value=len(connections)
        )
        yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open", value=channels)
        yield GaugeMetricFamily(
            "rabbitmq_consumers", "Consumers currently connected", value=consumers
        )
        yield CounterMetricFamily(
            "rabbitmq_connections_opened", "Total number of connections opened",
            value=counters.connections_opened,
        )
        yield CounterMetricFamily(
            "rabbitmq_connections_closed", "Total number of connections closed or terminated",
            value=counters.connections_closed,
        )

    def _global_counters(self, broker):
        totals = broker.counters.totals(broker.connections)
        protocols = sorted(totals) or ["amqp091"]
        for name, text, counter in GLOBAL_COUNTERS:
            family = CounterMetricFamily(f"rabbitmq_global_{name}", text, labels=["protocol"])
            for protocol in protocols:
                family.add_metric([protocol], totals.get(protocol, {}).get(counter, 0))
            yield family
        routed = CounterMetricFamily(
            "rabbitmq_global_messages_routed", "Total number of messages routed to queues",
            labels=["protocol"],
        )
        for protocol in protocols:
            counts = totals.get(protocol, {})
            routed.add_metric([protocol], counts.get("messages_published", 0)
                              - counts.get("messages_unroutable_dropped", 0)
                              - counts.get("messages_unroutable_returned", 0))
        yield routed

    def _memory(self, broker):
        watermark = broker.watermark
        yield GaugeMetricFamily("rabbitmq_process_resident_memory_bytes", "Memory used in bytes",
                                value=resident_memory_bytes())
        yield GaugeMetricFamily(
            "rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes",
            value=watermark.high,
        )
        yield GaugeMetricFamily(
            "brokerd_memory_watermark_bytes",
            "Message bytes counted against the memory high watermark", value=watermark.queued_bytes,
        )
        yield GaugeMetricFamily(
            "brokerd_memory_watermark_blocked", "1 while publishers are blocked by the watermark",
            value=1 if watermark.blocked else 0,
        )

    def _disk(self, broker):
        """The disk alarm, with rabbitmq_prometheus' names, help and types."""
        alarm = broker.disk_alarm  # the free space itself is in node_coarse_metrics
        yield GaugeMetricFamily("rabbitmq_disk_space_available_limit_bytes",
                                "Free disk space low watermark in bytes", value=alarm.limit)
        yield UnknownMetricFamily(
            "rabbitmq_alarms_free_disk_space_watermark",
            "is 1 if free disk space watermark alarm is in effect", value=int(alarm.blocked),
        )

    def _stores(self, broker):
        # vhost: "" for the broker's store, else the vhost that has its own
        labels = ["backend", "vhost"]
        families = {
            "commits": CounterMetricFamily(
                "brokerd_store_commits", "Store commits (batches written)", labels=labels
            ),
            "fsyncs": CounterMetricFamily("brokerd_store_fsyncs", "Store fsyncs", labels=labels),
            "chunk_reads": CounterMetricFamily(
                "brokerd_chunk_reads", "Message records read back from chunks", labels=labels
            ),
            "cache_hit_ratio": GaugeMetricFamily(
                "brokerd_cache_hit_ratio", "Hits of the store's read cache per lookup",
                labels=labels,
            ),
        }
        histogram = HistogramMetricFamily(
            "brokerd_store_commit_seconds",
            "Time from a commit's hand-over to the writer thread until it is done",
            labels=labels,
        )
        stores = [("", broker.store), *sorted(broker.own_stores.items())]
        for vhost, store in stores:
            key = [store.name, vhost]
            stats = store.stats()
            for figure, family in families.items():
                if figure in stats:
                    family.add_metric(key, stats[figure])
            times = store.commit_times() if ITimedCommits.providedBy(store) else None
            if times is not None:
                buckets, cumulative = [], 0
                for bound, count in zip((*times.bounds, float("inf")), times.counts):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
                histogram.add_metric(key, buckets, times.total_seconds)
        yield from families.values()
        yield histogram


class MetricsPage(Resource):
    """The text exposition of one registry, made on the reactor thread at each GET."""

    isLeaf = False

    def __init__(self, registry):
        super().__init__()
        self.registry = registry

    def getChild(self, path, request):
        if path == b"":
            return self
        return super().getChild(path, request)

    def render_GET(self, request):
        request.setHeader(b"Content-Type", CONTENT_TYPE)
        return generate_latest(self.registry)


def registry_for(broker, access=None, per_object=False, node=None, cluster=None):
    """
    A private C{prometheus_client.CollectorRegistry} holding a
    L{BrokerCollector} of C{broker} (and of its C{cluster}, if it is a cluster's node).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, access, per_object, node, cluster))
    return registry


class QuietSite(Site):
    """
    A twisted.web Site that writes no access-log line per request (a scrape a
    second would flood the log).
    """

    def log(self, request):
        pass


def metrics_site(broker, access=None, node=None, cluster=None):
    """
    The Site of C{--prometheus}: C{/metrics} (aggregated), C{/metrics/per-object} and
    C{/metrics/detailed} (L{brokerd.http.metrics.detailed}); C{cluster}: the
    L{brokerd.cluster.status.ClusterStatus} of a cluster's node (its C{brokerd_cluster_*}
    families), None for a node on its own.
    """
    if node is None:
        node = node_name() if cluster is None else cluster_node_name(cluster.node_name)
    aggregated = MetricsPage(registry_for(broker, access, node=node, cluster=cluster))
    aggregated.putChild(b"per-object", MetricsPage(registry_for(broker, access, True, node,
                                                                cluster)))
    cluster_name = cluster.cluster_name if cluster is not None else None
    aggregated.putChild(b"detailed", DetailedMetricsPage(broker, node, cluster_name))
    root = Resource()
    root.putChild(b"metrics", aggregated)
    return QuietSite(root)
