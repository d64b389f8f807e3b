"""What clients' channels and connections do: RabbitMQ's C{channel_*} and
C{connection_*} families.

Per object, one sample per open channel (labels C{vhost} and C{channel}, the
channel's name as the management API gives it) or connection (C{vhost},
C{connection}). For the node, the gauges are summed over what is open and the
counters are the broker's totals since start
(L{brokerd.model.counters.MessageCounters}), so a channel that closes takes
nothing away from a rate.
"""

from brokerd.http.metrics.families import COUNTER, GAUGE, Family
from brokerd.session.counters import channel_count

CHANNEL_LABELS = ("vhost", "channel")


def _channels(broker):
    for connection in broker.connections:
        for channel in connection.channels.values():
            yield connection, channel


def _channel_gauges(broker, vhosts):
    for connection, channel in _channels(broker):
        yield (connection.vhost.name, channel.name), (
            len(channel.consumers), channel.unacked_count,
            channel.messages_received_confirm - channel.messages_confirmed,
            channel.consumer_prefetch, channel.prefetch_count,
        )


CHANNEL = Family("channel_metrics", (
    ("channel_consumers", GAUGE, "Consumers on a channel"),
    ("channel_messages_unacked", GAUGE, "Delivered but not yet acknowledged messages"),
    ("channel_messages_unconfirmed", GAUGE, "Published but not yet confirmed messages"),
    ("consumer_prefetch", GAUGE, "Limit of unacknowledged messages for each consumer"),
    ("channel_prefetch", GAUGE,
     "Total limit of unacknowledged messages for all consumers on a channel"),
), CHANNEL_LABELS, _channel_gauges)


def _totals(broker, counters):
    """The broker's totals since start of C{counters} (channel counter names), every protocol's."""
    sums = [0] * len(counters)
    for counts in broker.counters.totals(broker.connections).values():
        for index, counter in enumerate(counters):
            sums[index] += counts[counter]
    return sums


def _counter_family(name, metrics):
    """A family of channel counters: C{metrics} are C{(name, help, channel counter name)}."""
    counters = tuple(counter for _, _, counter in metrics)

    def objects(broker, vhosts):
        for connection, channel in _channels(broker):
            yield (connection.vhost.name, channel.name), [
                channel_count(channel, counter) for counter in counters
            ]

    return Family(
        name, tuple((metric, COUNTER, text) for metric, text, _ in metrics), CHANNEL_LABELS,
        objects, total=lambda broker: _totals(broker, counters),
    )


CHANNEL_EXCHANGE = _counter_family("channel_exchange_metrics", (
    ("channel_messages_published", "Total number of messages published into an exchange"
     " on a channel", "messages_published"),
    ("channel_messages_confirmed", "Total number of messages published into an exchange"
     " and confirmed on the channel", "messages_confirmed"),
    ("channel_messages_unroutable_returned", "Total number of messages published as mandatory"
     " into an exchange and returned to the publisher as unroutable",
     "messages_unroutable_returned"),
    ("channel_messages_unroutable_dropped", "Total number of messages published as"
     " non-mandatory into an exchange and dropped as unroutable", "messages_unroutable_dropped"),
))

CHANNEL_QUEUE = _counter_family("channel_queue_metrics", (
    ("channel_get_ack", "Total number of messages fetched with basic.get in manual"
     " acknowledgement mode", "messages_got_manual_ack"),
    ("channel_get", "Total number of messages fetched with basic.get in automatic"
     " acknowledgement mode", "messages_got_no_ack"),
    ("channel_messages_delivered_ack", "Total number of messages delivered to consumers in"
     " manual acknowledgement mode", "messages_delivered_manual_ack"),
    ("channel_messages_delivered", "Total number of messages delivered to consumers in"
     " automatic acknowledgement mode", "messages_delivered_no_ack"),
    ("channel_messages_redelivered", "Total number of messages redelivered to consumers",
     "messages_redelivered"),
    ("channel_messages_acked", "Total number of messages acknowledged by consumers",
     "messages_acked"),
    ("channel_get_empty", "Total number of times basic.get operations fetched no message",
     "gets_empty"),
))


def _client_connections(broker):
    """The connections of clients over a socket (not the API's in-process ones)."""
    return [connection for connection in broker.connections if connection.protocol is not None]


CONNECTION_COARSE = Family("connection_coarse_metrics", (
    ("connection_incoming_bytes", COUNTER, "Total number of bytes received on a connection"),
    ("connection_outgoing_bytes", COUNTER, "Total number of bytes sent on a connection"),
), ("vhost", "connection"), lambda broker, vhosts: [
    ((connection.vhost.name, connection.name),
     (connection.bytes_received, connection.bytes_sent))
    for connection in _client_connections(broker)
], total=lambda broker: (
    broker.counters.bytes_received + sum(c.bytes_received for c in broker.connections),
    broker.counters.bytes_sent + sum(c.bytes_sent for c in broker.connections),
))

CONNECTION = Family("connection_metrics", (
    ("connection_channels", GAUGE, "Channels on a connection"),
), ("vhost", "connection"), lambda broker, vhosts: [
    ((connection.vhost.name, connection.name), (len(connection.channels),))
    for connection in _client_connections(broker)
])
