"""Pushes one native channel's deliveries, returns, confirms and cancels to its client.

Each is one L{Envelope} on the channel's id, with the message's properties
copied as they are (the native protocol carries them as protobuf, as stored).
"""

from zope.interface import implementer

from brokerd.interfaces import IChannelPeer
from brokerd.proto.native_pb2 import Envelope


@implementer(IChannelPeer)
class NativeChannelPeer:
    """Pushes one channel's deliveries, returns and confirms to the client."""

    __slots__ = ("_send", "_channel_id")

    def __init__(self, protocol, channel_id):
        self._send = protocol.sendFrame
        self._channel_id = channel_id

    def deliver(self, consumer_tag, delivery_tag, redelivered, message):
        envelope = Envelope(channel=self._channel_id)
        deliver = envelope.basic_deliver
        fill_content(deliver, message)
        deliver.consumer_tag = consumer_tag
        deliver.delivery_tag = delivery_tag
        deliver.redelivered = redelivered
        self._send(envelope.SerializeToString())

    def returned(self, reply_code, reply_text, message):
        envelope = Envelope(channel=self._channel_id)
        returned = envelope.basic_return
        fill_content(returned, message)
        returned.reply_code = reply_code
        returned.reply_text = reply_text
        self._send(envelope.SerializeToString())

    def publish_confirmed(self, sequence, multiple, ack):
        envelope = Envelope(channel=self._channel_id)
        if ack:
            envelope.basic_ack.delivery_tag = sequence
            envelope.basic_ack.multiple = multiple
        else:
            envelope.basic_nack.delivery_tag = sequence
            envelope.basic_nack.multiple = multiple
            envelope.basic_nack.requeue = False
        self._send(envelope.SerializeToString())

    def consumer_cancelled(self, consumer_tag):
        envelope = Envelope(channel=self._channel_id)
        envelope.basic_cancel.consumer_tag = consumer_tag
        self._send(envelope.SerializeToString())


def fill_content(target, message):
    """Copy a message's exchange, routing key, properties and body into a
    BasicDeliver, BasicReturn or BasicGetOk (fields 1-4 of each)."""
    target.exchange = message.exchange
    target.routing_key = message.routing_key
    target.properties.CopyFrom(message.properties)
    target.body = message.body
