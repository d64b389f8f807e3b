"""The names of the message counters a channel keeps, which its connection adds up.

Each is an attribute or property of L{brokerd.session.channel.Channel} or of its
L{brokerd.session.deliveries.Deliveries}; a connection reads them by these names
(L{channel_count}) when it adds its channels' counts up (once per channel closed and
once per look at the totals), never per message.
"""

# The message counters every channel keeps (and its connection adds up), as RabbitMQ's
# message_stats: publish, deliver_get (consumer deliveries and basic.get), redeliver and ack.
MESSAGE_COUNTERS = (
    "messages_published", "messages_delivered", "messages_redelivered", "messages_acked"
)
# What else a channel counts for the broker-wide metrics (RabbitMQ's global counters): unroutable
# publishes dropped or returned (counted on that path only), and the publishes made and confirmed in
# confirm mode (read from its publisher confirms, not counted per message).
ROUTING_COUNTERS = (
    "messages_unroutable_dropped", "messages_unroutable_returned", "messages_received_confirm",
    "messages_confirmed",
)
# How the deliveries went out, for RabbitMQ's deliver / deliver_no_ack / get / get_no_ack /
# get_empty, kept by the channel's deliveries (brokerd.session.deliveries): basic.get counts its own
# (on the get path only), the consumers' are the rest of the delivery tags given out, split by what
# the deliveries count of those needing no ack.
DELIVERY_COUNTERS = (
    "messages_delivered_manual_ack", "messages_delivered_no_ack", "messages_got_manual_ack",
    "messages_got_no_ack", "gets_empty",
)
COUNTERS = MESSAGE_COUNTERS + ROUTING_COUNTERS + DELIVERY_COUNTERS
_OF_DELIVERIES = frozenset(DELIVERY_COUNTERS)


def channel_count(channel, counter):
    """The count of C{counter} (one of L{COUNTERS}) of C{channel}."""
    return getattr(channel.deliveries if counter in _OF_DELIVERIES else channel, counter)

