"""C{/api/overview}, C{/api/whoami} and this node's C{/api/nodes} entry: the broker at a glance,
in RabbitMQ's shapes.

Message figures are the broker-wide counters since start
(L{brokerd.model.counters.MessageCounters.totals}: the open connections' counts
added to those every connection left when it closed, the management API's own
publishes and gets included), so a connection that published and closed between
two looks is counted as in RabbitMQ's global counters; rates are per second over
the last 5 to 10 seconds (L{brokerd.http.rates.CounterRates}), as RabbitMQ's
C{*_details.rate}.
"""

import os
import resource as os_resource
import socket

import twisted
from brokerd.access.parameters import CLUSTER_NAME
from brokerd.http.rates import CounterRates
from brokerd.model.exchange import DELAYED_TYPE, EXCHANGE_TYPES

MANAGEMENT_VERSION = "3.10.8"  # the RabbitMQ management API whose shapes this follows
PRODUCT_NAME = "brokerd"

# RabbitMQ's message_stats names (as its /api/overview gives them) for brokerd's counters
STAT_NAMES = {
    "publish": "messages_published",
    "confirm": "messages_confirmed",
    "return_unroutable": "messages_unroutable_returned",
    "drop_unroutable": "messages_unroutable_dropped",
    "deliver": "messages_delivered_manual_ack",
    "deliver_no_ack": "messages_delivered_no_ack",
    "get": "messages_got_manual_ack",
    "get_no_ack": "messages_got_no_ack",
    "get_empty": "gets_empty",
    "deliver_get": "messages_delivered",
    "redeliver": "messages_redelivered",
    "ack": "messages_acked",
}


def product_version():
    try:
        from importlib.metadata import version

        return version("brokerd")
    except Exception:  # noqa: BLE001 - run from a source tree, not installed
        return "0"


class MessageTotals:
    """
    The broker's message counters since start, every protocol's added up, and
    the rate of each per second.

    The rates' first sample is taken when this is made (the management API's
    start), so the first look after a burst already shows its rate.
    """

    def __init__(self, broker):
        self.broker = broker
        self._rates = CounterRates(broker.clock.seconds(), self._counts())

    def _counts(self):
        """The L{STAT_NAMES} counters' totals now, in that order."""
        broker = self.broker
        counts = [0] * len(STAT_NAMES)
        for protocol_counts in broker.counters.totals(broker.connections).values():
            for index, counter in enumerate(STAT_NAMES.values()):
                counts[index] += protocol_counts[counter]
        return tuple(counts)

    def message_stats(self):
        """
        RabbitMQ's C{message_stats}: C{publish}, C{deliver}, C{get}, C{deliver_get},
        C{ack}... each with C{*_details.rate}.
        """
        counts = self._counts()
        rates = self._rates.rates(self.broker.clock.seconds(), counts)
        stats = {}
        for name, count, rate in zip(STAT_NAMES, counts, rates):
            stats[name] = count
            stats[f"{name}_details"] = {"rate": round(rate, 1)}
        return stats


def unacked_by_queue(broker):
    """C{(vhost, queue name)} -> un-acked deliveries, from every open channel."""
    counts = {}
    for connection in broker.connections:
        for channel in connection.channels.values():
            for entry in channel.unacked_deliveries.values():
                key = entry.queue.key
                counts[key] = counts.get(key, 0) + 1
    return counts


def overview(api):
    context = api.context
    broker = context.broker
    vhosts = [broker.vhosts[name] for name in api.visible_vhosts() if name in broker.vhosts]
    names = {vhost.name for vhost in vhosts}
    connections = [
        c for c in broker.connections
        if c.vhost.name in names and (api.is_monitor or c.user == api.user)
    ]
    unacked = unacked_by_queue(broker)
    ready = sum(queue.message_count for vhost in vhosts for queue in vhost.queues.values())
    unacked_total = sum(count for (vhost, _), count in unacked.items() if vhost in names)
    return {
        "management_version": MANAGEMENT_VERSION,
        "rates_mode": "basic",
        "rabbitmq_version": MANAGEMENT_VERSION,
        "product_version": product_version(),
        "product_name": PRODUCT_NAME,
        "cluster_name": cluster_name(context),
        "node": context.node,
        "erlang_version": "n/a",
        "message_stats": context.totals.message_stats(),
        "queue_totals": {"messages": ready + unacked_total, "messages_ready": ready,
                         "messages_unacknowledged": unacked_total},
        "object_totals": {
            "connections": len(connections),
            "channels": sum(len(c.channels) for c in connections),
            "exchanges": sum(len(vhost.exchanges) for vhost in vhosts),
            "queues": sum(len(vhost.queues) for vhost in vhosts),
            "consumers": sum(len(c.consumers()) for c in connections),
        },
        "listeners": listeners(context),
        "contexts": [],
        "exchange_types": exchange_types(),
        "disable_stats": False,
        "enable_queue_totals": False,  # RabbitMQ's setting for when stats are disabled
    }


def cluster_name(context):
    """
    As RabbitMQ: the cluster_name global parameter, the node's name without one; a node of a
    brokerd cluster says its cluster's name (the one all its nodes share in etcd).
    """
    if context.cluster is not None:
        return context.cluster.cluster_name
    return context.access.runtime.global_parameters.get(CLUSTER_NAME, context.node)


def exchange_types():
    """The exchange types one may declare, as RabbitMQ lists them (name, description, enabled)."""
    found = [
        {"name": name, "description": f"AMQP {name} exchange, as per the AMQP specification",
         "enabled": True}
        for name in sorted(EXCHANGE_TYPES)
    ]
    found.append({"name": DELAYED_TYPE, "description": "Delayed Message Exchange", "enabled": True})
    return found


def listeners(context):
    """The listeners as RabbitMQ lists them: node, protocol, ip_address, port."""
    found = []
    for listener in context.listeners:
        port = listener.port
        address = port.getHost() if port is not None else None
        if address is None or not hasattr(address, "port"):
            continue
        protocol = PROTOCOLS.get(listener.option, listener.option)
        found.append({"node": context.node, "protocol": protocol, "ip_address": address.host,
                      "port": address.port, "socket_opts": []})
    return found


PROTOCOLS = {"amqp": "amqp", "amqps": "amqp/ssl", "native": "brokerd-native", "http": "http"}


def whoami(api):
    return {"name": api.user, "tags": api.tag_list}


def node_info(context):
    clock = context.broker.clock
    usage = os_resource.getrusage(os_resource.RUSAGE_SELF)
    try:
        fd_used = len(os.listdir("/proc/self/fd"))
    except OSError:
        fd_used = 0
    fd_total = os_resource.getrlimit(os_resource.RLIMIT_NOFILE)[0]
    watermark = context.broker.watermark
    disk_alarm = context.broker.disk_alarm
    return {
        "name": context.node,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "uptime": int((clock.seconds() - context.started_at) * 1000),
        "mem_used": resident_bytes() or usage.ru_maxrss * 1024,
        "mem_limit": getattr(watermark, "high", 0),
        "mem_alarm": bool(getattr(watermark, "blocked", False)),
        "fd_used": fd_used,
        "fd_total": fd_total,
        "sockets_used": sum(1 for _ in context.broker.connections),
        "proc_used": 1,
        "disk_free_limit": disk_alarm.limit,
        "disk_free_alarm": disk_alarm.blocked,
        "disk_free": disk_alarm.free if disk_alarm.free is not None else 0,
        "processors": os.cpu_count() or 1,
        "applications": [
            {"name": "brokerd", "description": "brokerd", "version": product_version()},
            {"name": "twisted", "description": "Twisted", "version": twisted.__version__},
        ],
        "host": socket.gethostname(),
        "exchange_types": exchange_types(),
        "partitions": [],  # one node: never partitioned
        "rates_mode": "basic",
    }


def resident_bytes():
    """This process's resident memory now (Linux), or 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
