"""RabbitMQ's direct reply-to: RPC replies straight to a requester's channel, with no queue.

A requester consumes (no-ack) from the pseudo-queue C{amq.rabbitmq.reply-to} and
publishes requests with that name as their reply_to; the broker rewrites it to
C{amq.rabbitmq.reply-to.<token>}, a name for that channel's reply consumer. A reply
published to the default exchange under that name goes straight to the consumer:
it is not stored, never redelivered, and dropped if the consumer is gone (a
mandatory publisher gets it back with 312 NO_ROUTE either way, as from RabbitMQ,
whose default exchange routes reply names to no queue).

The token is random (not guessable, not secret) and names one consume: after a
cancel a new reply consumer on the same channel has a new token. Any other string
simply names no consumer.
"""

import secrets
from collections import deque

from twisted.logger import Logger

from brokerd.errors import NotFound, PreconditionFailed
from brokerd.model.message import Message, QueuedMessage
from brokerd.proto import messages_pb2

log = Logger()

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."
TOKEN_BYTES = 18  # 24 URL-safe characters: a reply name stays far below the 255 of a short string
# Reply bodies held for a consumer that cannot take them now (flow, slow reader):
HELD_REPLY_BYTES = 16 * 1024 * 1024


class _Classic:
    """
    The queue policy the channel reads of a reply consumer's queue: none of a
    quorum queue's rules.
    """

    quorum = False


class ReplyConsumerQueue:
    """
    What stands for a queue behind one channel's reply consumer, so the channel's
    ordinary consumer, delivery, cancel and close paths serve it unchanged.

    Replies arriving while the consumer cannot take them (channel.flow off, or its
    client not reading) wait here, counted against the memory watermark, up to
    L{HELD_REPLY_BYTES} of bodies; past that a reply is dropped, as RabbitMQ drops a
    reply that finds no consumer.
    """

    policy = _Classic()

    def __init__(self, registry, channel, token):
        self.registry = registry
        self.channel = channel
        self.vhost = channel.vhost
        self.token = token
        self.name = REPLY_PREFIX + token
        self.consumer = None
        self._held = deque()
        self._held_bytes = 0
        self._dropped = 0
        self._sequence = 0

    def __repr__(self):
        return f"<ReplyConsumerQueue {self.name!r} of {self.channel!r}>"

    def add_consumer(self, consumer):
        self.consumer = consumer
        self.registry._register(self)

    def remove_consumer(self, consumer):
        """The reply consumer was cancelled or its channel closed: its name stops working."""
        self.registry._unregister(self)
        self.consumer = None
        self._held.clear()
        self._release(self._held_bytes)

    def forget(self, entry):
        pass  # nothing is stored or held once delivered (the consumer is no-ack)

    def offer(self, message):
        """
        Deliver a reply now if the consumer can take it, else hold it (within
        the limit) for L{dispatch}.
        """
        consumer = self.consumer
        if consumer is None:
            return
        if not self._held and consumer.has_room():
            self._deliver(message)
            return
        size = len(message.body)
        if self._held_bytes + size > HELD_REPLY_BYTES:
            self._dropped += 1
            if self._dropped == 1:
                log.warn(
                    "dropping direct replies to {name!r}: its consumer is not taking them and"
                    " {limit} bytes of replies wait already",
                    name=self.name, limit=HELD_REPLY_BYTES,
                )
            return
        self._held.append(message)
        self._held_bytes += size
        self.vhost.watermark.add(size)

    def dispatch(self):
        """The consumer may have room again: hand it the replies held for it, in order."""
        consumer = self.consumer
        held = self._held
        while held and consumer is not None and consumer.has_room():
            message = held.popleft()
            self._release(len(message.body))
            self._deliver(message)

    def _release(self, size):
        self._held_bytes -= size
        if size:
            self.vhost.watermark.release(size)

    def _deliver(self, message):
        self._sequence += 1
        self.consumer.deliver(QueuedMessage(message, self, self._sequence))


class ReplyConsumers:
    """The broker's reply consumers, by the token in their reply name."""

    def __init__(self):
        self._by_token = {}
        self._by_channel = {}

    def reply_queue(self, channel, no_ack):
        """
        The pseudo-queue for a new reply consumer on C{channel} (basic.consume of
        C{amq.rabbitmq.reply-to}); it takes the name when the consumer is added.
        """
        if not no_ack:
            raise PreconditionFailed("reply consumer cannot acknowledge")
        if channel in self._by_channel:
            raise PreconditionFailed("reply consumer already set")
        token = secrets.token_urlsafe(TOKEN_BYTES)
        while token in self._by_token:
            token = secrets.token_urlsafe(TOKEN_BYTES)
        return ReplyConsumerQueue(self, channel, token)

    def _register(self, queue):
        self._by_token[queue.token] = queue
        self._by_channel[queue.channel] = queue

    def _unregister(self, queue):
        if self._by_token.get(queue.token) is queue:
            del self._by_token[queue.token]
        if self._by_channel.get(queue.channel) is queue:
            del self._by_channel[queue.channel]

    def with_reply_address(self, channel, message):
        """
        C{message} (whose reply_to is C{amq.rabbitmq.reply-to}) addressed back
        to C{channel}'s reply consumer.
        """
        queue = self._by_channel.get(channel)
        if queue is None:
            raise PreconditionFailed("fast reply consumer does not exist")
        properties = messages_pb2.BasicProperties()
        properties.CopyFrom(message.properties)
        properties.reply_to = queue.name
        return Message(message.exchange, message.routing_key, properties, message.body,
                       published_at=message.published_at)

    def deliver(self, vhost, message):
        """
        A message published to the default exchange of C{vhost} under a reply
        name: to its consumer, if any.
        """
        queue = self._by_token.get(message.routing_key[len(REPLY_PREFIX):])
        if queue is not None and queue.vhost is vhost:
            queue.offer(message)

    def declare(self, channel, name):
        """
        queue.declare of a name beginning C{amq.rabbitmq.reply-to}: RabbitMQ answers
        declare-ok (0 messages, 1 consumer) for the pseudo-queue itself and for a live
        reply name, and 404 for any other.

        @return: C{(name, message_count, consumer_count)}
        """
        if name != REPLY_QUEUE:
            queue = None
            if name.startswith(REPLY_PREFIX):
                queue = self._by_token.get(name[len(REPLY_PREFIX):])
            if queue is None or queue.vhost is not channel.vhost:
                raise NotFound(f"no queue {name!r} in vhost {channel.vhost.name!r}")
        return name, 0, 1
