"""The families RabbitMQ gives under C{rabbitmq_cluster_} on C{/metrics/detailed}
only: whether each vhost runs, and its exchanges with their bindings.
"""

from brokerd.http.metrics.families import GAUGE, Family


def _exchanges(broker, vhosts):
    """Every exchange but the default one and internal ones, as RabbitMQ lists them."""
    for vhost in list(broker.vhosts.values()):
        for exchange in vhost.exchanges.values():
            if exchange.name and not exchange.internal:
                yield vhost, exchange


def _vhost_status(broker, vhosts):
    names = list(broker.vhosts) + [
        name for name in broker.unavailable_vhosts if name not in broker.vhosts
    ]
    return [((name,), (0 if name in broker.unavailable_vhosts else 1,)) for name in names]


VHOST_STATUS = Family("vhost_status", (
    ("vhost_status", GAUGE, "Whether a given vhost is running"),
), ("vhost",), _vhost_status)

EXCHANGE_BINDINGS = Family("exchange_bindings", (
    ("exchange_bindings", GAUGE, "Number of bindings for an exchange."
     " This value is cluster-wide."),
), ("vhost", "exchange", "type"), lambda broker, vhosts: [
    ((vhost.name, exchange.name, exchange.type_name), (len(exchange.bindings),))
    for vhost, exchange in _exchanges(broker, vhosts)
])

EXCHANGE_NAMES = Family("exchange_names", (
    ("exchange_name", GAUGE, "Enumerates exchanges without any additional info."
     " This value is cluster-wide. A cheaper alternative to `exchange_bindings`"),
), ("vhost", "exchange", "type"), lambda broker, vhosts: [
    ((vhost.name, exchange.name, exchange.type_name), (1,))
    for vhost, exchange in _exchanges(broker, vhosts)
])
