"""Broker-wide message and connection counters, for metrics that outlive connections.

The channels count what they publish, deliver and have acked, one integer
increment per message (L{brokerd.session.channel.MESSAGE_COUNTERS}); a connection adds
its channels' counts up. When a connection closes its counts would be lost, so
L{MessageCounters.connection_closed} folds them into the totals here, once per
connection: nothing is added to the per-message paths. A total since start is
then these closed totals plus the open connections' counts, which
L{MessageCounters.totals} adds up in O(connections + channels) when asked (a
metrics scrape), never per message.

Totals are kept per protocol (C{"amqp091"}, C{"native"}, C{"internal"}), the
label RabbitMQ's global counters carry. Besides those four counters the channels
count unroutable publishes (on the unroutable path only) and read confirms from
their publisher confirms (L{brokerd.session.channel.ROUTING_COUNTERS}).
"""


# Connection.protocol -> RabbitMQ's label
PROTOCOL_LABELS = {"AMQP 0-9-1": "amqp091", "native": "native"}


def protocol_label(connection):
    """
    The protocol label of C{connection}: C{"amqp091"}, C{"native"}, or
    C{"internal"} (made in-process).
    """
    return PROTOCOL_LABELS.get(connection.protocol, "internal")


class MessageCounters:
    """
    What the broker counted since it started, beyond what open connections hold.

    @ivar connections_opened: connections opened since start.
    @ivar connections_closed: connections closed since start.
    @ivar closed: protocol label -> message counter name -> the total of the
        connections of that protocol closed so far.
    """

    def __init__(self):
        self.connections_opened = 0
        self.connections_closed = 0
        self.closed = {}

    def connection_closed(self, connection):
        """Keep C{connection}'s message counts (it has closed all its channels)."""
        self.connections_closed += 1
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
    counts = {**connection.message_counts(), **connection.routing_counts()}
    mine = totals.get(protocol_label(connection))
    if mine is None:
        totals[protocol_label(connection)] = counts
    else:
        for name, count in counts.items():
            mine[name] += count
