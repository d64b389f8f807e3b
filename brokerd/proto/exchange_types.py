"""The one mapping between AMQP exchange type names and the ExchangeType enum."""

from brokerd.proto import messages_pb2

EXCHANGE_TYPE_BY_NAME = {
    "direct": messages_pb2.DIRECT,
    "fanout": messages_pb2.FANOUT,
    "topic": messages_pb2.TOPIC,
    "headers": messages_pb2.HEADERS,
    "x-delayed-message": messages_pb2.DELAYED_MESSAGE,
}
EXCHANGE_TYPE_NAME = {value: name for name, value in EXCHANGE_TYPE_BY_NAME.items()}
