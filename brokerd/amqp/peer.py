"""Pushes one AMQP channel's deliveries, returns, confirms and cancels to its client.

Deliveries reuse the content-header bytes a message was published with
(L{Message.encoded_properties}); a message that came another way has its
properties encoded once and kept, and messages that share one properties
object (a paging store reads each kind of head once) share its encoding.
Bodies are handed to the transport as they are, split into frames only when
they exceed the negotiated frame size.
"""

from zope.interface import implementer

from brokerd.amqp import frames
from brokerd.amqp.properties import encode_properties
from brokerd.interfaces import IChannelPeer


ENCODED_CACHE_ENTRIES = 256  # properties objects whose encoding is remembered

_encoded_by_properties = {}  # id(properties) -> (properties, encoded): holding it keeps its id from being reused


def encoded_properties(message):
    """The message's properties in AMQP form, encoded at most once per message and per shared properties object."""
    encoded = message.encoded_properties
    if encoded is None:
        properties = message.properties
        cached = _encoded_by_properties.get(id(properties))
        if cached is not None:
            encoded = cached[1]
        else:
            encoded = encode_properties(properties)
            if len(_encoded_by_properties) >= ENCODED_CACHE_ENTRIES:
                _encoded_by_properties.clear()
            _encoded_by_properties[id(properties)] = (properties, encoded)
        message.encoded_properties = encoded
    return encoded


@implementer(IChannelPeer)
class AmqpChannelPeer:
    __slots__ = ("_protocol", "_channel_id", "_consumer_tags")

    def __init__(self, protocol, channel_id):
        self._protocol = protocol
        self._channel_id = channel_id
        self._consumer_tags = {}  # consumer tag -> its UTF-8 bytes

    def deliver(self, consumer_tag, delivery_tag, redelivered, message):
        tag = self._consumer_tags.get(consumer_tag)
        if tag is None:
            tag = self._consumer_tags[consumer_tag] = consumer_tag.encode()
        protocol = self._protocol
        channel_id = self._channel_id
        body = message.body
        content = frames.content_frames(channel_id, encoded_properties(message), body, protocol.frame_max)
        # Everything is encoded before anything is queued, so a message that cannot be encoded never
        # leaves a basic.deliver without its content (which would hang the client).
        protocol.send(
            frames.encode_deliver(
                channel_id, tag, delivery_tag, redelivered, message.exchange.encode(), message.routing_key.encode()
            )
        )
        protocol.send_pieces(content, len(body))

    def returned(self, reply_code, reply_text, message):
        protocol = self._protocol
        content = frames.content_frames(self._channel_id, encoded_properties(message), message.body, protocol.frame_max)
        protocol.send(
            frames.encode_return(self._channel_id, reply_code, reply_text, message.exchange, message.routing_key)
        )
        protocol.send_pieces(content, len(message.body))

    def publish_confirmed(self, sequence, multiple, ack):
        self._protocol.send(frames.encode_confirm(self._channel_id, sequence, multiple, ack))

    def consumer_cancelled(self, consumer_tag):
        self._consumer_tags.pop(consumer_tag, None)
        if self._protocol.client_capabilities.get("consumer_cancel_notify"):
            self._protocol.send(frames.encode_cancel(self._channel_id, consumer_tag))

    def forget_consumer(self, consumer_tag):
        """The client cancelled C{consumer_tag}: drop its cached encoding."""
        self._consumer_tags.pop(consumer_tag, None)
