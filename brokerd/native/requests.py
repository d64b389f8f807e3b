"""The native protocol's requests on a channel, translated into channel calls.

L{ChannelRequests} is the part of L{brokerd.native.server.NativeServerProtocol}
that answers what a client asks of an open channel (exchanges, queues,
bindings, basic and confirm requests): each C{on_KIND} method reads one
request's fields, calls the connection's channel and sends the reply; the
rules live in the model and the channel. A request's field table is checked
against the rules every field table from a client meets before it is used.
"""

from brokerd.errors import CommandInvalid
from brokerd.model.property_rules import ARGUMENT, check_table
from brokerd.native.peer import fill_content
from brokerd.proto import messages_pb2
from brokerd.proto.exchange_types import EXCHANGE_TYPE_NAME
from brokerd.proto.tables import table_to_dict


def _arguments(message):
    """A request's arguments as a dict, once they pass the rules every field table from a client meets."""
    if not message.arguments.fields:
        return {}
    check_table(message.arguments, ARGUMENT)
    return table_to_dict(message.arguments)


class ChannelRequests:
    """
    The channel-level requests of one native connection; mixed into its
    server protocol, which provides C{connection}, C{broker}, C{sendFrame},
    C{_reply_to}, C{_ok} and C{_publisher_gate}.
    """

    def _channel(self, envelope):
        return self.connection.channel(envelope.channel)

    # -- exchanges and queues

    def on_exchange_declare(self, envelope, request):
        # An unset type means AMQP's default, direct.
        type_name = EXCHANGE_TYPE_NAME.get(request.type or messages_pb2.DIRECT)
        if type_name is None:
            raise CommandInvalid(f"unknown exchange type number {request.type}")
        self._channel(envelope).exchange_declare(
            request.exchange,
            type_name,
            request.passive,
            request.durable,
            request.auto_delete,
            request.internal,
            _arguments(request),
        )
        self._ok(envelope)

    def on_exchange_delete(self, envelope, request):
        self._channel(envelope).exchange_delete(request.exchange, request.if_unused)
        self._ok(envelope)

    def on_exchange_bind(self, envelope, request):
        self._channel(envelope).exchange_bind(
            request.destination, request.source, request.routing_key, _arguments(request)
        )
        self._ok(envelope)

    def on_exchange_unbind(self, envelope, request):
        self._channel(envelope).exchange_unbind(
            request.destination, request.source, request.routing_key, _arguments(request)
        )
        self._ok(envelope)

    def on_queue_declare(self, envelope, request):
        name, messages, consumers = self._channel(envelope).queue_declare(
            request.queue, request.passive, request.durable, request.exclusive, request.auto_delete, _arguments(request)
        )
        reply = self._reply_to(envelope)
        reply.queue_declare_ok.queue = name
        reply.queue_declare_ok.message_count = messages
        reply.queue_declare_ok.consumer_count = consumers
        self.sendFrame(reply.SerializeToString())

    def on_queue_bind(self, envelope, request):
        self._channel(envelope).queue_bind(request.queue, request.exchange, request.routing_key, _arguments(request))
        self._ok(envelope)

    def on_queue_unbind(self, envelope, request):
        self._channel(envelope).queue_unbind(request.queue, request.exchange, request.routing_key, _arguments(request))
        self._ok(envelope)

    def on_queue_purge(self, envelope, request):
        self._message_count(envelope, self._channel(envelope).queue_purge(request.queue))

    def on_queue_delete(self, envelope, request):
        count = self._channel(envelope).queue_delete(request.queue, request.if_unused, request.if_empty)
        self._message_count(envelope, count)

    def _message_count(self, envelope, count):
        reply = self._reply_to(envelope)
        reply.message_count.message_count = count
        self.sendFrame(reply.SerializeToString())

    # -- basic

    def on_basic_qos(self, envelope, request):
        self._channel(envelope).basic_qos(request.prefetch_count, getattr(request, "global"))
        self._ok(envelope)

    def on_basic_consume(self, envelope, request):
        tag = self._channel(envelope).basic_consume(
            request.queue, request.consumer_tag, request.no_ack, request.exclusive, _arguments(request)
        )
        reply = self._reply_to(envelope)
        reply.basic_consume_ok.consumer_tag = tag
        self.sendFrame(reply.SerializeToString())

    def on_basic_cancel(self, envelope, request):
        self._channel(envelope).basic_cancel(request.consumer_tag)
        self._ok(envelope)

    def on_basic_publish(self, envelope, request):
        self._channel(envelope).basic_publish(
            request.exchange, request.routing_key, request.properties, request.body, request.mandatory
        )
        if self.broker.watermark.blocked:
            self._publisher_gate().check()

    def on_basic_get(self, envelope, request):
        result = self._channel(envelope).basic_get(request.queue, request.no_ack)
        reply = self._reply_to(envelope)
        if result is None:
            reply.basic_get_empty.SetInParent()
        else:
            delivery_tag, redelivered, message, message_count = result
            got = reply.basic_get_ok
            fill_content(got, message)
            got.delivery_tag = delivery_tag
            got.redelivered = redelivered
            got.message_count = message_count
        self.sendFrame(reply.SerializeToString())

    def on_basic_ack(self, envelope, request):
        self._channel(envelope).basic_ack(request.delivery_tag, request.multiple)

    def on_basic_nack(self, envelope, request):
        self._channel(envelope).basic_nack(request.delivery_tag, request.multiple, request.requeue)

    def on_basic_reject(self, envelope, request):
        self._channel(envelope).basic_reject(request.delivery_tag, request.requeue)

    def on_basic_recover(self, envelope, request):
        self._channel(envelope).basic_recover(request.requeue)
        self._ok(envelope)

    def on_confirm_select(self, envelope, request):
        self._channel(envelope).confirm_select()
        self._ok(envelope)
