"""A metric family as RabbitMQ's rabbitmq_prometheus plugin groups its metrics, and how
one is written out: one sample per object (a channel, a queue, a connection) with its
labels, or one sample for the node.

A L{Family} is data: RabbitMQ's name for the group (C{channel_queue_metrics}), the
metrics in it (names without their C{rabbitmq_} or C{rabbitmq_detailed_} prefix), the
labels of an object, and two readers: C{objects(broker, vhosts)} gives each object's
label values and figures, C{total(broker)} the node's (for counters, since start: what
closed connections counted stays in it). Nothing is counted for a family: the readers
read what the broker counts anyway, when scraped.
"""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

COUNTER, GAUGE = "counter", "gauge"


class Family:
    """
    One of RabbitMQ's metric families.

    @ivar name: RabbitMQ's name for it, as C{/metrics/detailed?family=} takes it.
    @ivar metrics: C{(name, COUNTER or GAUGE, help)} of each metric; a counter's
        name without its C{_total}, which the exposition adds.
    @ivar labels: the label names of one object's samples.
    @ivar vhost_filtered: True for a family of queues, which C{vhost=} narrows.
    """

    def __init__(self, name, metrics, labels, objects, total=None, vhost_filtered=False):
        """
        @param objects: C{objects(broker, vhosts)} -> C{(label values, figures)} per
            object; C{vhosts} is None (all) or the set of vhost names to keep.
        @param total: C{total(broker)} -> the node's figures; None: the objects' sums.
        """
        self.name = name
        self.metrics = metrics
        self.labels = labels
        self.vhost_filtered = vhost_filtered
        self._objects = objects
        self._total = total

    def write(self, broker, prefix, per_object, vhosts=None, skip=frozenset()):
        """
        The family's C{prometheus_client} metric families, each named C{prefix} + its
        name: one sample per object (C{per_object}) or one for the node. Metrics named
        in C{skip} are left out (another part of the exposition gives them).
        """
        if per_object:
            labels = list(self.labels)
            rows = list(self._objects(broker, vhosts if self.vhost_filtered else None))
        else:
            labels = []
            rows = [((), self._node_figures(broker))]
        written = []
        for index, (name, kind, text) in enumerate(self.metrics):
            if name in skip:
                continue
            maker = CounterMetricFamily if kind == COUNTER else GaugeMetricFamily
            family = maker(prefix + name, text, labels=labels)
            for label_values, figures in rows:
                family.add_metric(list(label_values), figures[index])
            written.append(family)
        return written

    def _node_figures(self, broker):
        if self._total is not None:
            return self._total(broker)
        sums = [0] * len(self.metrics)
        for _, figures in self._objects(broker, None):
            for index, figure in enumerate(figures):
                sums[index] += figure
        return sums
