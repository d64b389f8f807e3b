"""What the native client hands its user: deliveries, the errors it raises, the properties it builds.

L{brokerd.native.client} gives each message the broker delivers (or basic.get
returns) as a L{Delivery}, fails requests with L{ChannelClosed} or
L{ConnectionClosed} carrying the broker's reply code, and takes message
properties as L{make_properties} does.
"""

from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict

_STRING_PROPERTIES = (
    "id",
    "routing_key",
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
)


class BrokerClosed(Exception):
    """The broker closed a channel or the connection; C{reply_code} says why."""

    def __init__(self, reply_code, reply_text):
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text


class ChannelClosed(BrokerClosed):
    """The channel is closed (by the broker after an error, or by us)."""


class ConnectionClosed(BrokerClosed):
    """The connection is closed (by the broker after an error, by us, or lost)."""


class PublishNacked(Exception):
    """The broker refused a publish made in confirm mode."""


def make_properties(properties=None):
    """A L{BasicProperties} from a BasicProperties, a dict of its fields, or None.

    In a dict, C{headers} is a dict of Python values and C{delivery_mode} may be
    1, 2, or the enum value.
    """
    if properties is None:
        return messages_pb2.BasicProperties()
    if isinstance(properties, messages_pb2.BasicProperties):
        return properties
    result = messages_pb2.BasicProperties()
    for name, value in properties.items():
        if name == "headers":
            dict_to_table(value, result.headers)
        elif name in _STRING_PROPERTIES or name in ("delivery_mode", "priority", "timestamp"):
            setattr(result, name, value)
        else:
            raise TypeError(f"{name!r} is not a message property")
    return result


class Delivery:
    """A message the broker delivered (or returned from basic.get)."""

    def __init__(self, channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties, body,
                 message_count=None):
        self.channel = channel
        self.consumer_tag = consumer_tag
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.message_count = message_count

    @property
    def headers(self):
        return table_to_dict(self.properties.headers)

    def ack(self, multiple=False):
        self.channel.basic_ack(self.delivery_tag, multiple)

    def nack(self, multiple=False, requeue=True):
        self.channel.basic_nack(self.delivery_tag, multiple, requeue)

    def reject(self, requeue=True):
        self.channel.basic_reject(self.delivery_tag, requeue)

    def __repr__(self):
        return f"<Delivery tag={self.delivery_tag} {self.routing_key!r} {len(self.body)} bytes>"
