"""A published message and its place in one queue.

A L{Message} is shared by every queue it was routed to; a L{QueuedMessage} is
its entry in one queue, with that queue's redelivery state and store handle.
"""

from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict

PERSISTENT = messages_pb2.PERSISTENT
COUNTED_CACHE_ENTRIES = 256
# (id(properties), count) -> (properties, their copy with that x-delivery-count): holding the
# original keeps its id from being reused while the entry lives.
_counted_properties = {}


def _with_delivery_count(properties, count):
    """
    A copy of C{properties} whose headers say x-delivery-count: C{count},
    replacing any such header.
    """
    copy = messages_pb2.BasicProperties()
    copy.CopyFrom(properties)
    kept = [field for field in copy.headers.fields if field.name != "x-delivery-count"]
    del copy.headers.fields[:]
    copy.headers.fields.extend(kept)
    dict_to_table({"x-delivery-count": count}, copy.headers)
    return copy


class Message:
    """
    One published message: where it was published, its properties and body.

    Protocol adapters build it; the model reads only C{persistent} and
    C{headers} (for headers exchanges) and never touches the body. The
    properties are read-only: an adapter may share one C{BasicProperties}
    between messages published with the same properties.

    @ivar published_at: when it was published (ms on the broker's clock), set
        for messages with a time to live, whose TTL counts from then even
        across a restart; else None.
    @ivar encoded_properties: the properties in AMQP 0-9-1 content-header form
        (flags and property list), or None. A message published over AMQP
        keeps the bytes it came with, and an AMQP delivery sends them as they
        are; for other messages the AMQP adapter fills it on first delivery.
    """

    __slots__ = (
        "exchange", "routing_key", "properties", "body", "persistent", "_headers",
        "encoded_properties", "published_at",
    )

    def __init__(
        self, exchange, routing_key, properties, body, encoded_properties=None, published_at=None
    ):
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.persistent = properties.delivery_mode == PERSISTENT
        self._headers = None
        self.encoded_properties = encoded_properties
        self.published_at = published_at

    @property
    def headers(self):
        """The headers property as a dict, decoded on first use."""
        if self._headers is None:
            self._headers = table_to_dict(self.properties.headers)
        return self._headers

    def with_delivery_count(self, count):
        """
        A copy whose headers say x-delivery-count: C{count} (replacing any),
        for a delivery that counts returns (every one from a quorum queue, a
        redelivery from any); the body is shared. Messages that share
        properties share the copy's properties too (the last
        L{COUNTED_CACHE_ENTRIES} kinds), so a protocol adapter encodes them
        once, not once per delivery.
        """
        key = (id(self.properties), count)
        cached = _counted_properties.get(key)
        if cached is None:
            if len(_counted_properties) >= COUNTED_CACHE_ENTRIES:
                _counted_properties.clear()
            cached = _counted_properties[key] = (
                self.properties, _with_delivery_count(self.properties, count)
            )
        return Message(self.exchange, self.routing_key, cached[1], self.body)

    @classmethod
    def from_record(cls, record):
        """
        The message a store gave back: a L{brokerd.interfaces.MessageRecord}
        (from C{read}, C{recover}, C{load} or C{delayed_after}), or a message
        of ours that a paging store's C{load} still held unwritten, returned
        as it is. The record's properties hold no copy of the body, so they
        are shared, not copied.
        """
        if type(record) is cls:
            return record
        return cls(
            record.exchange, record.routing_key, record.properties, record.body, None,
            record.published_at,
        )

    def __repr__(self):
        return (
            f"<Message exchange={self.exchange!r} routing_key={self.routing_key!r}"
            f" {len(self.body)} bytes>"
        )


class QueuedMessage:
    """
    A message's entry in one queue.

    @ivar message: the L{Message}, or None while it is paged out: kept by the
        store alone (see L{brokerd.model.paging}) until it is delivered.
    @ivar sequence: the entry's position in arrival order, which requeueing
        keeps so a returned message goes back where it was.
    @ivar handle: the store's handle if the message is persisted for this
        queue, else None.
    @ivar consumer: the consumer it is delivered to and not yet acked by, if any.
    @ivar delivery_count: how often it was returned to the queue (x-delivery-count on redelivery).
    """

    __slots__ = (
        "message", "queue", "sequence", "handle", "redelivered", "delivery_count", "consumer",
        "expires_at",
    )

    def __init__(self, message, queue, sequence, handle=None, redelivered=False):
        self.message = message
        self.queue = queue
        self.sequence = sequence
        self.handle = handle
        self.redelivered = redelivered
        self.delivery_count = 0
        self.consumer = None
        # Milliseconds on the broker's clock, if the message has a time to live:
        self.expires_at = None
