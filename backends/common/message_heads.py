"""The encoded C{StoredMessage} of a published message without its body, as the backends
store it, encoded once for a run of messages published alike."""

from brokerd.interfaces import SerializedPropertiesMessage
from brokerd.proto import messages_pb2
from brokerd.proto.wire_format import LENGTH_DELIMITED, field_key, varint

PROPERTIES_KEY = field_key(
    messages_pb2.StoredMessage.DESCRIPTOR.fields_by_name["properties"].number, LENGTH_DELIMITED
)


def encode_head(message, valid=False):
    """The C{StoredMessage} of a published message, without its body (kept apart, or added by
    the caller), with its C{valid} field set first if C{valid}."""
    stored = messages_pb2.StoredMessage(
        exchange=message.exchange, routing_key=message.routing_key, properties=message.properties
    )
    if valid:
        stored.valid = True
    if message.published_at is not None:
        stored.published_at = message.published_at
    return stored.SerializeToString()


def _around_properties(message, valid):
    """The encoded fields of a message's C{StoredMessage} that come before its properties
    (C{valid} first, if set) and after them, without its body."""
    before = messages_pb2.StoredMessage(exchange=message.exchange, routing_key=message.routing_key)
    if valid:
        before.valid = True
    after = b""
    if message.published_at is not None:
        after = messages_pb2.StoredMessage(published_at=message.published_at).SerializeToString()
    return before.SerializeToString(), after


class MessageHeads:
    """
    L{encode_head} for one store, remembering the last head. Messages published alike share
    one properties object (the AMQP adapter decodes each distinct content header once), so a
    run of them with the same exchange, routing key and publish time costs one encoding; the
    properties object is held, so the identity test cannot be fooled by a new object at the
    old one's address. Properties are never changed once a message is published.

    A L{SerializedPropertiesMessage} brings its properties encoded: its head is the fields
    around them (remembered for a run alike) with those bytes in between, as they are.
    """

    def __init__(self, valid=False):
        self._valid = valid
        self._last = (None, None, None, None, b"")
        self._last_around = (None, None, None, b"", b"")

    def encode(self, message):
        if type(message) is SerializedPropertiesMessage:
            return self._encode_around(message)
        properties, exchange, routing_key, published_at, head = self._last
        if (message.properties is not properties or message.routing_key != routing_key
                or message.exchange != exchange or message.published_at != published_at):
            head = encode_head(message, self._valid)
            self._last = (message.properties, message.exchange, message.routing_key,
                          message.published_at, head)
        return head

    def _encode_around(self, message):
        exchange, routing_key, published_at, before, after = self._last_around
        if (message.routing_key != routing_key or message.exchange != exchange
                or message.published_at != published_at):
            before, after = _around_properties(message, self._valid)
            self._last_around = (message.exchange, message.routing_key, message.published_at,
                                 before, after)
        properties = message.serialized_properties
        return b"".join((before, PROPERTIES_KEY, varint(len(properties)), properties, after))
