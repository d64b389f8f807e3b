"""The encoded C{StoredMessage} of a published message without its body, as the backends
store it, encoded once for a run of messages published alike."""

from brokerd.proto import messages_pb2


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


class MessageHeads:
    """
    L{encode_head} for one store, remembering the last head. Messages published alike share
    one properties object (the AMQP adapter decodes each distinct content header once), so a
    run of them with the same exchange, routing key and publish time costs one encoding; the
    properties object is held, so the identity test cannot be fooled by a new object at the
    old one's address. Properties are never changed once a message is published.
    """

    def __init__(self, valid=False):
        self._valid = valid
        self._last = (None, None, None, None, b"")

    def encode(self, message):
        properties, exchange, routing_key, published_at, head = self._last
        if (message.properties is not properties or message.routing_key != routing_key
                or message.exchange != exchange or message.published_at != published_at):
            head = encode_head(message, self._valid)
            self._last = (message.properties, message.exchange, message.routing_key,
                          message.published_at, head)
        return head
