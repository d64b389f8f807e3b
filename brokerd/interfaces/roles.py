"""The roles the model and the session call through (see L{brokerd.interfaces}):
what a protocol adapter gives a channel to push to its client, and what the
model serves, belongs to and is called back by, implemented above it.
"""

from zope.interface import Attribute, Interface


class IChannelPeer(Interface):
    """
    The protocol side of one open channel: what the broker pushes to a client.

    A I{message} here is a L{brokerd.model.message.Message}: it has
    C{exchange}, C{routing_key}, C{properties} and C{body}.
    """

    def deliver(consumer_tag, delivery_tag, redelivered, message):
        """Send a message to the consumer C{consumer_tag} of this channel."""

    def deliver_run(consumer_tag, deliveries):
        """
        Send several messages to the consumer C{consumer_tag}, in order:
        C{deliveries} are C{(delivery_tag, redelivered, message)} tuples.
        """

    def returned(reply_code, reply_text, message):
        """Send back a mandatory message that no queue took."""

    def publish_confirmed(sequence, multiple, ack):
        """
        Tell a confirm-mode publisher the outcome of its publishes.

        @param sequence: the publish sequence number (1 for the channel's
            first publish after confirm-select).
        @param multiple: True if every outstanding publish up to C{sequence}
            has this outcome.
        @param ack: True for safely taken (basic.ack), False for refused
            (basic.nack).
        """

    def consumer_cancelled(consumer_tag):
        """The broker cancelled a consumer, e.g. because its queue was deleted."""


class IConsumer(Interface):
    """
    A subscription to one queue, as the queue serves it: the queue picks, by
    priority and round-robin, a consumer with room, hands it entries, and tells
    it when the broker cancels it. Everything else (delivery tags, un-acked
    tracking, the client) is the business of the channel that made it.
    """

    tag = Attribute("The consumer tag (str), unique on its channel.")
    priority = Attribute("Its x-priority (int): a queue serves higher priorities first.")
    exclusive = Attribute("True if it asked to be the queue's only consumer.")
    prefetch = Attribute("The most un-acked deliveries it may hold (int; 0 for no limit).")
    unacked = Attribute(
        "How many of its deliveries are un-acked now (int): a single-active-consumer queue lets"
        " the next consumer take over at once only from one that holds none."
    )

    def has_room():
        """
        True if one more delivery now stays within its limits and its
        channel's: the queue may hand it an entry.
        """

    def deliver(entry):
        """
        Take C{entry} (a L{brokerd.model.message.QueuedMessage} the queue has
        just taken out of its ready messages, its message loaded): the consumer
        holds it until it is settled, or is done with it at once if it acks nothing.
        """

    def start_run():
        """
        The queue is about to hand it several entries in a row: what it
        delivers until L{end_run} may reach its client together.
        """

    def end_run():
        """The run is over: everything delivered in it is on its way to the client."""

    def cancelled_by_broker():
        """
        The queue can serve it no longer (deleted, or its stored messages lost)
        and has forgotten it.
        """


class IQueueOwner(Interface):
    """
    What exclusive queues belong to (a client connection): only their owner
    may use them, and they are deleted when it closes.
    """

    def own(queue):
        """C{queue} was just declared exclusive by this owner."""

    def disown(queue):
        """C{queue}, declared exclusive by this owner, was deleted: forget it."""


class IExpiringQueue(Interface):
    """
    What the timer of a queue's message expiry
    (L{brokerd.model.expiry.MessageExpiry}) calls back.
    """

    def expire_due():
        """
        Take out (dead-lettering where the queue says so) every ready message
        whose time to live is over.
        """
