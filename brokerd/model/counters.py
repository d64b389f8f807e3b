"""Broker-wide message and connection counters, for metrics that outlive connections.

The channels count what they publish, deliver and have acked, one integer
increment per message (L{brokerd.session.counters.MESSAGE_COUNTERS}); a connection adds
its channels' counts up. When a connection closes its counts would be lost, so
L{MessageCounters.connection_closed} folds them into the totals here, once per
connection: nothing is added to the per-message paths. A total since start is
then these closed totals plus the open connections' counts, which
L{MessageCounters.totals} adds up in O(connections + channels) when asked (a
metrics scrape), never per message.

Totals are kept per protocol (C{"amqp091"}, C{"native"}, C{"internal"}), the
label RabbitMQ's global counters carry. Besides those four counters the channels
count unroutable publishes (on the unroutable path only) and read confirms from
their publisher confirms (L{brokerd.session.counters.ROUTING_COUNTERS}), and tell
consumers' deliveries with and without acks from basic.get's
(L{brokerd.session.counters.DELIVERY_COUNTERS}: the get path counts its own).

The churn RabbitMQ counts (connections, channels and queues opened or created,
closed or deleted) is counted here too, one increment where each happens.
"""


# Connection.protocol -> RabbitMQ's label
PROTOCOL_LABELS = {"AMQP 0-9-1": "amqp091", "native": "native"}


def protocol_label(connection):
    """
    The protocol label of C{connection}: C{"amqp091"}, C{"native"}, or
    C{"internal"} (made in-process).
    """
    return PROTOCOL_LABELS.get(connection.protocol, "internal")


class QueueChurn:
    """
    Queues declared (queue.declare, passive ones not counted), created and deleted since
    start, counted where a vhost does each (one increment), as RabbitMQ's C{queues_*_total}.
    """

    __slots__ = ("declared", "created", "deleted")

    def __init__(self):
        self.declared = self.created = self.deleted = 0


class MessageCounters:
    """
    What the broker counted since it started, beyond what open connections hold.

    @ivar connections_opened: connections opened since start.
    @ivar connections_closed: connections closed since start.
    @ivar channels_opened: channels opened since start.
    @ivar channels_closed: channels closed since start (those of closing connections included).
    @ivar queues: the L{QueueChurn} every vhost of the broker counts its queues in.
    @ivar closed: protocol label -> message counter name -> the total of the
        connections of that protocol closed so far.
    @ivar bytes_received: bytes read from the connections closed so far.
    @ivar bytes_sent: bytes written to the connections closed so far.
    """

    def __init__(self):
        self.connections_opened = 0
        self.connections_closed = 0
        self.channels_opened = self.channels_closed = 0
        self.queues = QueueChurn()
        self.closed = {}
        self.bytes_received = self.bytes_sent = 0

    def connection_closed(self, connection):
        """Keep C{connection}'s message counts (it has closed all its channels)."""
        self.connections_closed += 1
        self.bytes_received += connection.bytes_received
        self.bytes_sent += connection.bytes_sent
        _add(self.closed, connection)

    def totals(self, connections):
        """
        Protocol label -> counter name -> the total since start: the closed
        connections' totals plus those of C{connections}, the open ones.
        """
        result = {protocol: dict(counts) for protocol, counts in self.closed.items()}
        for connection in connections:
            _add(result, connection)
        return result


def _add(totals, connection):
    """Add C{connection}'s counts to C{totals[its protocol label]}."""
    counts = {
        **connection.message_counts(), **connection.routing_counts(),
        **connection.delivery_counts(),
    }
    mine = totals.get(protocol_label(connection))
    if mine is None:
        totals[protocol_label(connection)] = counts
    else:
        for name, count in counts.items():
            mine[name] += count
