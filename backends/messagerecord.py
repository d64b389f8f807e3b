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


def record_of_stored(stored, body=None):
    """
    The record of a parsed StoredMessage: of a whole one, or of a body-less
    head whose C{body} is kept apart. The properties are copied out: a parsed
    message's own properties keep all of it alive (a body it holds too), at
    over twice the memory of a copy, for as long as the record is held.
    """
    properties = messages_pb2.BasicProperties()
    properties.CopyFrom(stored.properties)
    published_at = stored.published_at if stored.HasField("published_at") else None
    return MessageRecord(stored.exchange, stored.routing_key, properties, stored.body if body is None else body,
                         published_at)
