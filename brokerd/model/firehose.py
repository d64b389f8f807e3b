"""The firehose: a copy of every message published into, and delivered from, a traced vhost.

As RabbitMQ's C{rabbit_trace}: every vhost has the internal topic exchange
C{amq.rabbitmq.trace}; while tracing is on for a vhost (C{trace_on}, or the
management API's C{"tracing": true}), each publish into it is copied there
with the routing key C{publish.EXCHANGE} (the default exchange's is
C{publish.}) and each delivery (to a consumer or by basic.get) with
C{deliver.QUEUE}. A copy has the original body and no property but its
headers, in RabbitMQ's order and AMQP types: C{exchange_name},
C{routing_keys} (an array), C{properties} (a table of the original's
properties, integers as signed 32-bit, its headers as they came), C{node},
then for a delivery C{redelivered} (0 or 1), then C{vhost}, C{connection},
C{channel}, C{user}, and for a publish C{routed_queues} (the queues its
routing reached; through the default exchange, the queue its routing key
names, whether or not it exists, as RabbitMQ). A message published to the
trace exchange itself is never copied, so a consumer of the copies does not
feed the firehose.

A vhost's C{firehose} is None while tracing is off, so a publish or a
delivery pays one test for it. As in RabbitMQ, tracing is not kept across a
restart.
"""

from brokerd.model.message import Message
from brokerd.model.routing import route_onwards
from brokerd.proto import messages_pb2

TRACE_EXCHANGE = "amq.rabbitmq.trace"
DEFAULT_NODE = "brokerd@localhost"
SIGNED_32 = messages_pb2.INT32
SIGNED_64 = messages_pb2.INT64  # for a number a signed 32-bit field cannot hold (a late timestamp)

# The properties as RabbitMQ's trace table lists them: P_basic's fields in reverse order.
_TEXT, _INTEGER, _TABLE = "text", "integer", "table"
PROPERTY_FIELDS = (
    ("app_id", _TEXT), ("user_id", _TEXT), ("type", _TEXT), ("timestamp", _INTEGER),
    ("message_id", _TEXT), ("expiration", _TEXT), ("reply_to", _TEXT),
    ("correlation_id", _TEXT), ("priority", _INTEGER), ("delivery_mode", _INTEGER),
    ("headers", _TABLE), ("content_encoding", _TEXT), ("content_type", _TEXT),
)


class Firehose:
    """
    The tracing of one vhost, while it is on: what publishes and deliveries
    tell it goes to the vhost's C{amq.rabbitmq.trace}.
    """

    def __init__(self, vhost, node=DEFAULT_NODE):
        """
        @param vhost: the L{brokerd.model.vhost.VirtualHost} traced.
        @param node: the node name the copies carry in their C{node} header.
        """
        self.vhost = vhost
        self.node = node

    def published(self, message, connection_name, channel_number, user):
        """C{message} was published on channel C{channel_number} of a connection by C{user}."""
        if message.exchange == TRACE_EXCHANGE:
            return
        vhost = self.vhost
        exchange = vhost.exchanges.get(message.exchange)
        if not message.exchange:
            # RabbitMQ's default exchange names the queue whether or not it exists.
            routed = [message.routing_key]
        elif exchange is not None and not exchange.delayed:
            queues, _ = route_onwards(exchange, message, exchange.route(message), vhost.exchanges)
            routed = [queue.name for queue in queues]
        else:
            routed = []
        properties = self._copied_properties(message)
        headers = properties.headers
        _add_text(headers, "vhost", vhost.name)
        _add_text(headers, "connection", connection_name)
        _add_integer(headers, "channel", channel_number)
        _add_text(headers, "user", user)
        _add_texts(headers, "routed_queues", routed)
        self._send("publish." + message.exchange, properties, message.body)

    def delivered(self, queue_name, redelivered, message, connection_name, channel_number, user):
        """C{message} from queue C{queue_name} went to a client (a consumer, or basic.get)."""
        if message.exchange == TRACE_EXCHANGE:
            return
        properties = self._copied_properties(message)
        headers = properties.headers
        _add_integer(headers, "redelivered", 1 if redelivered else 0)
        _add_text(headers, "vhost", self.vhost.name)
        _add_text(headers, "connection", connection_name)
        _add_integer(headers, "channel", channel_number)
        _add_text(headers, "user", user)
        self._send("deliver." + queue_name, properties, message.body)

    def _copied_properties(self, message):
        """The copy's properties: headers only, their first fields (as RabbitMQ's msg_to_table)."""
        properties = messages_pb2.BasicProperties()
        headers = properties.headers
        _add_text(headers, "exchange_name", message.exchange)
        _add_texts(headers, "routing_keys", [message.routing_key])
        table = headers.fields.add()
        table.name = "properties"
        table.value.table_value.SetInParent()  # an empty table, not void, for no properties
        _property_table(message.properties, table.value.table_value)
        _add_text(headers, "node", self.node)
        return properties

    def _send(self, routing_key, properties, body):
        vhost = self.vhost
        exchange = vhost.exchanges.get(TRACE_EXCHANGE)
        if exchange is not None:
            vhost.route_now(exchange, Message(TRACE_EXCHANGE, routing_key, properties, body))


def _property_table(properties, table):
    for name, kind in PROPERTY_FIELDS:
        if kind == _TABLE:
            if properties.headers.fields:
                field = table.fields.add()
                field.name = name
                field.value.table_value.CopyFrom(properties.headers)
        elif name == "delivery_mode":
            if properties.delivery_mode:
                _add_integer(table, name, int(properties.delivery_mode))
        elif properties.HasField(name):
            value = getattr(properties, name)
            if kind == _INTEGER:
                _add_integer(table, name, value)
            else:
                _add_text(table, name, value)


def _add_text(table, name, value):
    field = table.fields.add()
    field.name = name
    field.value.string_value = value


def _add_integer(table, name, value):
    field = table.fields.add()
    field.name = name
    field.value.integer_value = value
    field.value.integer_kind = SIGNED_32 if -(2**31) <= value < 2**31 else SIGNED_64


def _add_texts(table, name, values):
    field = table.fields.add()
    field.name = name
    array = field.value.array_value
    array.SetInParent()
    for value in values:
        array.values.add().string_value = value


def start_tracing(vhost, node=DEFAULT_NODE):
    """Turn tracing on for C{vhost} (already on: no change). Returns whether it changed."""
    if vhost.firehose is not None:
        return False
    vhost.firehose = Firehose(vhost, node)
    return True


def stop_tracing(vhost):
    """Turn tracing off for C{vhost}. Returns whether it changed."""
    if vhost.firehose is None:
        return False
    vhost.firehose = None
    return True
