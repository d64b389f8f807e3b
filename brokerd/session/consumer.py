"""A channel's consumer: what basic.consume makes, and the L{IConsumer} its queue serves.

The queue (L{brokerd.model.queue}) asks it for room and hands it entries; it
hands each to its channel's client under a delivery tag from the channel's
L{brokerd.session.deliveries.Deliveries}, where an entry the client must ack
stays until the channel settles it. It counts what it holds itself, for its own
prefetch limit; the channel-wide limits are the L{Deliveries}' to check.
"""

from zope.interface import implementer

from brokerd.interfaces import IConsumer

# A run is handed on to the client once its messages add up to this many bytes (bodies, and
# RUN_MESSAGE_BYTES for each message's frames), as the write buffer flushes at this size: a
# client that does not read then pauses deliveries as it would without runs, and a consumer
# without a prefetch limit never takes a deep queue whole into one run.
RUN_BYTES = 256 * 1024
RUN_MESSAGE_BYTES = 64


@implementer(IConsumer)
class Consumer:
    """
    A subscription of one channel to one queue.

    @ivar channel: the L{brokerd.session.channel.Channel} that made it.
    @ivar prefetch: the most un-acked deliveries it may hold (0: no limit).
    @ivar unacked: how many it holds now.
    @ivar priority: its x-priority: higher ones are served first.
    @ivar channel_limited: False for a consumer of a quorum queue, which the
        channel-wide (global) prefetch limit does not hold back, as in RabbitMQ.
    """

    __slots__ = (
        "tag", "queue", "channel", "no_ack", "exclusive", "prefetch", "unacked", "arguments",
        "priority", "channel_limited", "_deliveries", "_peer", "_channel_limit_applies",
        "_from_quorum_queue", "_vhost", "_run", "_run_bytes",
    )

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
        self._from_quorum_queue = queue.policy.quorum
        self.channel_limited = not self._from_quorum_queue
        self._deliveries = channel.deliveries
        self._peer = channel.peer
        self._channel_limit_applies = self.channel_limited and not no_ack
        self._vhost = channel.vhost
        self._run = None  # while a run is open: its (tag, redelivered, message) tuples
        self._run_bytes = 0

    def has_room(self):
        """True if a delivery now stays within this consumer's and its channel's limits."""
        prefetch = self.prefetch
        if prefetch and self.unacked >= prefetch:  # a no-ack consumer holds none
            return False
        return self._deliveries.has_room(self._channel_limit_applies)

    def deliver(self, entry):
        """
        Hand C{entry} to the client under the channel's next delivery tag; it
        stays un-acked unless no-ack.
        """
        if self.no_ack:
            tag = self._deliveries.give_tag(entry)
            entry.queue.forget(entry)
        else:
            self.unacked += 1
            tag = self._deliveries.hold_for_consumer(entry, self)
        message = entry.message
        # What delivered_message does, the queue's type known:
        if entry.delivery_count or self._from_quorum_queue:
            message = message.with_delivery_count(entry.delivery_count)
        run = self._run
        if run is not None:
            run.append((tag, entry.redelivered, message))
            self._run_bytes += len(message.body) + RUN_MESSAGE_BYTES
            if self._run_bytes >= RUN_BYTES:
                self._hand_on([])
        else:
            self._peer.deliver(self.tag, tag, entry.redelivered, message)
        if (firehose := self._vhost.firehose) is not None:  # tracing on (brokerd.model.firehose)
            trace_delivery(firehose, self.channel, self.queue.name, entry.redelivered, message)

    def start_run(self):
        """
        Deliveries from now until L{end_run} go to the client together. A run
        started inside another (a queue that dispatches again while it
        delivers) joins it.
        """
        if self._run is None:
            self._run = []

    def end_run(self):
        """Hand the run's deliveries to the client, in order."""
        self._hand_on(None)

    def _hand_on(self, following):
        """Hand the run so far to the client; C{following} ([] or None) is what comes after it."""
        run, self._run, self._run_bytes = self._run, following, 0
        if run:
            self._peer.deliver_run(self.tag, run)

    def released(self, count):
        """
        C{count} of its deliveries were settled or taken back: it holds that many fewer.

        @return: its queue, which may deliver to it again.
        """
        self.unacked -= count
        return self.queue

    def cancelled_by_broker(self):
        """Its queue went away: the channel forgets it and tells the client, after what it
        delivered."""
        self.end_run()
        self.channel.consumers.cancelled_by_broker(self)

    def __repr__(self):
        return f"<Consumer {self.tag!r} on {self.queue.name!r}>"


def delivered_message(entry):
    """The message as its consumer gets it: a redelivery says how often it was
    returned (x-delivery-count), and so does every delivery from a quorum
    queue, its first with 0, as RabbitMQ's quorum queues do."""
    if entry.delivery_count or entry.queue.policy.quorum:
        return entry.message.with_delivery_count(entry.delivery_count)
    return entry.message


def trace_delivery(firehose, channel, queue_name, redelivered, message):
    """Tell C{firehose} (its vhost's tracing is on) that C{channel} delivered C{message}."""
    connection = channel.connection
    firehose.delivered(
        queue_name, redelivered, message, connection.name, channel.id, connection.user or ""
    )
