"""A channel's consumer: what basic.consume makes, and the L{IConsumer} its queue serves.

The queue (L{brokerd.model.queue}) asks it for room and hands it entries; it
hands each to its channel's client under the channel's next delivery tag and
keeps it among the channel's un-acked deliveries (unless it acks nothing).
It is part of its channel: it reads the channel's limits and writes its
delivery state directly, so that a delivery costs the queue one call.
"""

from zope.interface import implementer

from brokerd.interfaces import IConsumer


@implementer(IConsumer)
class Consumer:
    """
    A subscription of one channel to one queue.

    @ivar prefetch: the most un-acked deliveries it may hold (0: no limit).
    @ivar unacked: how many it holds now.
    @ivar priority: its x-priority: higher ones are served first.
    @ivar channel_limited: False for a consumer of a quorum queue, which the
        channel-wide (global) prefetch limit does not hold back, as in RabbitMQ.
    """

    __slots__ = ("tag", "queue", "channel", "no_ack", "exclusive", "prefetch", "unacked", "arguments", "priority",
                 "channel_limited")

    def __init__(self, tag, queue, channel, no_ack, exclusive, prefetch, arguments, priority=0):
        self.tag = tag
        self.queue = queue
        self.channel = channel
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments
        self.priority = priority
        self.channel_limited = not queue.policy.quorum

    def has_room(self):
        """True if a delivery now stays within this consumer's and its channel's limits."""
        channel = self.channel
        if not channel.flow_active or channel.connection.deliveries_paused:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        limit = channel.prefetch_count
        return not (limit and self.channel_limited) or channel.consumer_unacked < limit

    def deliver(self, entry):
        """Hand C{entry} to the client under the channel's next delivery tag; it stays un-acked unless no-ack."""
        channel = self.channel
        tag = channel.next_delivery_tag
        channel.next_delivery_tag = tag + 1
        if self.no_ack:
            entry.queue.forget(entry)
        else:
            entry.consumer = self
            self.unacked += 1
            channel.consumer_unacked += 1
            channel.unacked_deliveries[tag] = entry
        redelivered = entry.redelivered
        if redelivered:
            channel.messages_redelivered += 1
        channel.peer.deliver(self.tag, tag, redelivered, delivered_message(entry))

    def cancelled_by_broker(self):
        """Its queue went away: the channel forgets it and tells the client."""
        self.channel.consumer_cancelled_by_broker(self)

    def __repr__(self):
        return f"<Consumer {self.tag!r} on {self.queue.name!r}>"


def delivered_message(entry):
    """The message as its consumer gets it: a redelivery says how often it was returned (x-delivery-count),
    and so does every delivery from a quorum queue, its first with 0, as RabbitMQ's quorum queues do."""
    if entry.delivery_count or entry.queue.policy.quorum:
        return entry.message.with_delivery_count(entry.delivery_count)
    return entry.message
