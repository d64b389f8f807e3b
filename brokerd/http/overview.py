"""C{/api/overview}, C{/api/whoami} and C{/api/nodes}: the broker at a glance, in RabbitMQ's shapes.

Message figures add up the counters every connection keeps
(L{brokerd.session.connection.Connection.message_counts}, closed connections and
the management API's own publishes and gets included through
L{MessageTotals}); rates are per second over the last 5 to 10 seconds
(L{brokerd.http.rates.CounterRates}), as RabbitMQ's C{*_details.rate}.
"""

import os
import resource as os_resource
import socket

import twisted
from brokerd.http.rates import CounterRates
from brokerd.http.routes import not_found
from brokerd.session.channel import MESSAGE_COUNTERS

MANAGEMENT_VERSION = "3.10.8"  # the RabbitMQ management API whose shapes this follows
PRODUCT_NAME = "brokerd"

# RabbitMQ's message_stats names for brokerd's connection counters
STAT_NAMES = {"messages_published": "publish", "messages_delivered": "deliver_get",
              "messages_redelivered": "redeliver", "messages_acked": "ack"}


def product_version():
    try:
        from importlib.metadata import version

        return version("brokerd")
    except Exception:  # noqa: BLE001 - run from a source tree, not installed
        return "0"


class MessageTotals:
    """
    The broker's message counters since start: the open connections' added
    to those of connections that closed (noted when the overview sees them
    gone), and the rate of each per second.
    """

    def __init__(self, clock):
        self.clock = clock
        self._seen = {}  # connection -> its counts when last looked at
        self._closed = dict.fromkeys(MESSAGE_COUNTERS, 0)
        self._rates = None  # CounterRates of the STAT_NAMES counters, from the first look

    def count_closed(self, connection):
        """Add the counts of a connection that closed unseen (a management request's own)."""
        counts = connection.message_counts()
        for name in MESSAGE_COUNTERS:
            self._closed[name] += counts[name]

    def totals(self, connections):
        current = {connection: connection.message_counts() for connection in connections}
        for connection, counts in self._seen.items():
            if connection not in current:
                for name in MESSAGE_COUNTERS:
                    self._closed[name] += counts[name]
        self._seen = current
        totals = dict(self._closed)
        for counts in current.values():
            for name in MESSAGE_COUNTERS:
                totals[name] += counts[name]
        return totals

    def message_stats(self, connections):
        """
        RabbitMQ's C{message_stats}: C{publish}, C{deliver_get}, C{ack}... each
        with C{*_details.rate}.
        """
        totals = self.totals(connections)
        now = self.clock.seconds()
        counts = tuple(totals[counter] for counter in STAT_NAMES)
        if self._rates is None:
            self._rates = CounterRates(now, counts)
        stats = {}
        for (counter, name), rate in zip(STAT_NAMES.items(), self._rates.rates(now, counts)):
            stats[name] = totals[counter]
            stats[f"{name}_details"] = {"rate": round(rate, 1)}
        # brokerd counts deliveries and gets together (deliver_get).
        stats["deliver"] = stats["get"] = 0
        stats["deliver_details"] = stats["get_details"] = {"rate": 0.0}
        stats["confirm"] = stats["publish"]
        stats["confirm_details"] = dict(stats["publish_details"])
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
        "cluster_name": context.node,
        "node": context.node,
        "erlang_version": "n/a",
        "message_stats": context.totals.message_stats(broker.connections),
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
    }


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
    }


def nodes(api):
    api.check_monitor()
    return [node_info(api.context)]


def node(api, name):
    api.check_monitor()
    if name != api.context.node:
        raise not_found()
    return node_info(api.context)


def resident_bytes():
    """This process's resident memory now (Linux), or 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
