"""The consumers of one channel, by tag (basic.consume, basic.cancel).

A channel's L{ChannelConsumers} starts each consumer on its queue under the
tag the client chose, or a generated one, with the per-consumer prefetch
limit basic.qos set last; stops it at basic.cancel, when the channel closes,
or when its queue goes (telling the client then); and gives the un-acked
deliveries of a basic.recover without requeue back to the consumers that had
them.
"""

from brokerd.errors import MethodNotImplemented, NotAllowed
from brokerd.model.consumers import consumer_priority
from brokerd.model.names import check_short_string, generate_consumer_tag
from brokerd.session.consumer import Consumer


class ChannelConsumers(dict):
    """
    Consumer tag -> its L{Consumer}, in the order they started, for one
    channel: read it as a dict, start and stop consumers through its methods.
    """

    def __init__(self, channel):
        super().__init__()
        self._channel = channel

    def start(self, queue, tag, no_ack, exclusive, arguments):
        """
        Start a consumer of C{queue} under C{tag} (a generated one if it is
        empty) with C{arguments}; returns its tag. Deliveries start on the
        next reactor turn, after the adapter has had the chance to confirm the
        consumer to its client.

        @raise NotAllowed: if C{tag} is in use on the channel.
        @raise MethodNotImplemented: for a quorum queue on a channel with a
            channel-wide prefetch limit (basic.qos with global).
        """
        channel = self._channel
        priority = consumer_priority(arguments, queue)
        if queue.policy.quorum and channel.prefetch_count:
            raise MethodNotImplemented(
                f"queue {queue.name!r} in vhost {channel.vhost.name!r} does not support global qos"
            )
        if tag:
            check_short_string("consumer tag", tag)
            if tag in self:
                raise NotAllowed(f"attempt to reuse consumer tag {tag!r}")
        else:
            tag = generate_consumer_tag()
        consumer = Consumer(
            tag, queue, channel, no_ack, exclusive, channel.consumer_prefetch,
            dict(arguments or {}), priority,
        )
        queue.add_consumer(consumer)
        self[tag] = consumer
        channel.clock.callLater(0, queue.dispatch)
        return tag

    def cancel(self, tag):
        """
        Stop the consumer under C{tag}; its un-acked deliveries stay un-acked.
        Unknown tags are ignored.
        """
        consumer = self.pop(tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)

    def cancel_all(self):
        """Stop every consumer: the channel closes."""
        consumers = list(self.values())
        self.clear()
        for consumer in consumers:
            consumer.queue.remove_consumer(consumer)

    def cancelled_by_broker(self, consumer):
        """
        The consumer's queue went away: forget it, and tell the client on the
        next turn, after the reply to what deleted the queue (RabbitMQ sends
        queue.delete-ok before the basic.cancel).
        """
        if self.pop(consumer.tag, None) is not None:
            self._channel.clock.callLater(0, self._tell_cancelled, consumer.tag)

    def _tell_cancelled(self, tag):
        channel = self._channel
        if not channel.closed:
            channel.peer.consumer_cancelled(tag)

    def queues(self):
        """The queues these consumers consume from."""
        return {consumer.queue for consumer in self.values()}

    def redeliver(self, entries, deliveries):
        """
        basic.recover without requeue: each of C{entries}, taken from the
        channel's C{deliveries}, goes again to the consumer that had it, if
        that is still one of these, as a return of it; returns the others.
        """
        others = []
        for entry in entries:
            consumer = entry.consumer
            if consumer is not None and self.get(consumer.tag) is consumer:
                deliveries.release((entry,))
                if entry.queue.returned(entry):  # False: past its delivery limit, it died
                    consumer.deliver(entry)
            else:
                others.append(entry)
        return others
