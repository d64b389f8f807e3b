"""The L{MessageRecord} every store hands back, made from what a backend holds.

On disk the backends keep a message as a protobuf C{StoredMessage} (with or
without its body); that encoding stays inside them. Whatever a store gives
back from C{read}, C{recover}, C{load} or C{delayed_after} is a
L{brokerd.interfaces.MessageRecord}, built here once per message.
"""

from brokerd.interfaces import MessageRecord
from brokerd.proto import messages_pb2


def record_of(message):
    """The record of C{message} if it is one, else of an object with a record's attributes (a message appended)."""
    if type(message) is MessageRecord:
        return message
    return MessageRecord(message.exchange, message.routing_key, message.properties, bytes(message.body),
                         message.published_at)


def record_of_head(head, body):
    """
    The record of a body-less StoredMessage C{head} and the C{body} kept
    apart. The properties are the head's own: the head holds no body, so
    sharing them keeps nothing large alive.
    """
    published_at = head.published_at if head.HasField("published_at") else None
    return MessageRecord(head.exchange, head.routing_key, head.properties, body, published_at)


def record_of_stored(stored):
    """
    The record of a StoredMessage parsed whole, body included. The properties
    are copied out, so that keeping them does not keep the parsed message
    (and with it a second copy of the body) alive.
    """
    properties = messages_pb2.BasicProperties()
    properties.CopyFrom(stored.properties)
    published_at = stored.published_at if stored.HasField("published_at") else None
    return MessageRecord(stored.exchange, stored.routing_key, properties, stored.body, published_at)
