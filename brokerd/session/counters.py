"""The names of the message counters a channel keeps, which its connection adds up.

Each is an attribute or property of L{brokerd.session.channel.Channel}; a connection
reads them by these names when it adds its channels' counts up (once per channel
closed and once per look at the totals), never per message.
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
# get_empty: basic.get counts its own (on the get path only), the consumers' are the rest of the
# delivery tags given out, split by what the deliveries count of those needing no ack.
DELIVERY_COUNTERS = (
    "messages_delivered_manual_ack", "messages_delivered_no_ack", "messages_got_manual_ack",
    "messages_got_no_ack", "gets_empty",
)

