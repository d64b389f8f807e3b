"""One open native channel, both ways: the client's requests in, the broker's pushes out.

The server protocol (L{brokerd.native.server}) makes a L{NativeChannel} on
channel_open and hands it every later request on that channel that
L{CHANNEL_REQUESTS} names (exchanges, queues, bindings, basic and confirm
requests). Each C{on_KIND} method reads one request's fields, calls the
model's L{brokerd.session.channel.Channel} and sends the reply; the rules live
in the model and the channel, and an error they raise is answered by the
protocol (a L{brokerd.errors.ChannelError} closes only this channel). A
request's field table is checked against the rules every field table from a
client meets before it is used.

It is also the L{IChannelPeer} the model's channel pushes deliveries, returns,
confirms and cancels to: each is one C{Envelope} on the channel's number, with
the message's properties copied as they are (the native protocol carries them
as protobuf, as stored).
"""

from zope.interface import implementer

from brokerd.errors import CommandInvalid
from brokerd.interfaces import IChannelPeer
from brokerd.model.property_rules import ARGUMENT, check_table
from brokerd.native.replies import ok_frame, reply_to
from brokerd.proto import messages_pb2
from brokerd.proto.exchange_types import EXCHANGE_TYPE_NAME
from brokerd.proto.native_pb2 import Envelope
from brokerd.proto.tables import table_to_dict


def exchange_type_name(request):
    """
    The exchange type an ExchangeDeclare names (unset means AMQP's default,
    direct); 503 for an unknown one.
    """
    type_name = EXCHANGE_TYPE_NAME.get(request.type or messages_pb2.DIRECT)
    if type_name is None:
        raise CommandInvalid(f"unknown exchange type number {request.type}")
    return type_name


def _arguments(message):
    """
    A request's arguments as a dict, once they pass the rules every field table
    from a client meets.
    """
    if not message.arguments.fields:
        return {}
    check_table(message.arguments, ARGUMENT)
    return table_to_dict(message.arguments)


def fill_content(target, message):
    """Copy a message's exchange, routing key, properties and body into a
    BasicDeliver, BasicReturn or BasicGetOk (fields 1-4 of each)."""
    target.exchange = message.exchange
    target.routing_key = message.routing_key
    target.properties.CopyFrom(message.properties)
    target.body = message.body


@implementer(IChannelPeer)
class NativeChannel:
    """
    One open channel of one native connection.

    @ivar id: the channel number.
    @ivar model: the model's channel every request is translated into.
    """

    __slots__ = ("id", "model", "_send", "_gate", "_watermark", "_disk_alarm", "_in_sync_alarm")

    def __init__(self, channel_id, connection, send_frame, gate, watermark):
        """
        Open channel C{channel_id} on the model's C{connection} (504 if it is open already).

        @param send_frame: queues one encoded envelope for the client
            (L{brokerd.wire.write_buffer.WriteBuffer.send_frame}).
        @param gate: the connection's L{brokerd.wire.backpressure.PublisherGate},
            checked after each publish while the broker is blocked.
        @param watermark: the broker's L{brokerd.model.watermark.MemoryWatermark}.
        """
        self.id = channel_id
        self._send = send_frame
        self._gate = gate
        self._watermark = watermark
        self._disk_alarm = connection.broker.disk_alarm
        self._in_sync_alarm = connection.broker.in_sync_alarm
        self.model = connection.open_channel(channel_id, self)

    # -- exchanges and queues

    def on_exchange_declare(self, envelope, request):
        self.model.exchange_declare(
            request.exchange,
            exchange_type_name(request),
            request.passive,
            request.durable,
            request.auto_delete,
            request.internal,
            _arguments(request),
        )
        self._send(ok_frame(envelope))

    def on_exchange_delete(self, envelope, request):
        self.model.exchange_delete(request.exchange, request.if_unused)
        self._send(ok_frame(envelope))

    def on_exchange_bind(self, envelope, request):
        self.model.exchange_bind(
            request.destination, request.source, request.routing_key, _arguments(request)
        )
        self._send(ok_frame(envelope))

    def on_exchange_unbind(self, envelope, request):
        self.model.exchange_unbind(
            request.destination, request.source, request.routing_key, _arguments(request)
        )
        self._send(ok_frame(envelope))

    def on_queue_declare(self, envelope, request):
        name, messages, consumers = self.model.queue_declare(
            request.queue, request.passive, request.durable, request.exclusive, request.auto_delete,
            _arguments(request),
        )
        reply = reply_to(envelope)
        reply.queue_declare_ok.queue = name
        reply.queue_declare_ok.message_count = messages
        reply.queue_declare_ok.consumer_count = consumers
        self._send(reply.SerializeToString())

    def on_queue_bind(self, envelope, request):
        self.model.queue_bind(
            request.queue, request.exchange, request.routing_key, _arguments(request)
        )
        self._send(ok_frame(envelope))

    def on_queue_unbind(self, envelope, request):
        self.model.queue_unbind(
            request.queue, request.exchange, request.routing_key, _arguments(request)
        )
        self._send(ok_frame(envelope))

    def on_queue_purge(self, envelope, request):
        self._send_message_count(envelope, self.model.queue_purge(request.queue))

    def on_queue_delete(self, envelope, request):
        count = self.model.queue_delete(request.queue, request.if_unused, request.if_empty)
        self._send_message_count(envelope, count)

    def _send_message_count(self, envelope, count):
        reply = reply_to(envelope)
        reply.message_count.message_count = count
        self._send(reply.SerializeToString())

    # -- basic and confirm

    def on_basic_qos(self, envelope, request):
        self.model.basic_qos(request.prefetch_count, getattr(request, "global"))
        self._send(ok_frame(envelope))

    def on_basic_consume(self, envelope, request):
        tag = self.model.basic_consume(
            request.queue, request.consumer_tag, request.no_ack, request.exclusive,
            _arguments(request),
        )
        reply = reply_to(envelope)
        reply.basic_consume_ok.consumer_tag = tag
        self._send(reply.SerializeToString())

    def on_basic_cancel(self, envelope, request):
        self.model.basic_cancel(request.consumer_tag)
        self._send(ok_frame(envelope))

    def on_basic_publish(self, envelope, request):
        if request.properties.HasField("replication_id"):
            request.properties.ClearField("replication_id")  # a cluster's own, not a client's
        self.model.basic_publish(
            request.exchange, request.routing_key, request.properties, request.body,
            request.mandatory,
        )
        if self._watermark.blocked or self._disk_alarm.blocked or self._in_sync_alarm.blocked:
            self._gate.check()

    def on_basic_get(self, envelope, request):
        result = self.model.basic_get(request.queue, request.no_ack)
        reply = reply_to(envelope)
        if result is None:
            reply.basic_get_empty.SetInParent()
        else:
            delivery_tag, redelivered, message, message_count = result
            got = reply.basic_get_ok
            fill_content(got, message)
            got.delivery_tag = delivery_tag
            got.redelivered = redelivered
            got.message_count = message_count
        self._send(reply.SerializeToString())

    def on_basic_ack(self, envelope, request):
        self.model.basic_ack(request.delivery_tag, request.multiple)

    def on_basic_nack(self, envelope, request):
        self.model.basic_nack(request.delivery_tag, request.multiple, request.requeue)

    def on_basic_reject(self, envelope, request):
        self.model.basic_reject(request.delivery_tag, request.requeue)

    def on_basic_recover(self, envelope, request):
        self.model.basic_recover(request.requeue)
        self._send(ok_frame(envelope))

    def on_confirm_select(self, envelope, request):
        self.model.confirm_select()
        self._send(ok_frame(envelope))

    # -- IChannelPeer: what the broker pushes to the client

    def deliver(self, consumer_tag, delivery_tag, redelivered, message):
        envelope = Envelope(channel=self.id)
        deliver = envelope.basic_deliver
        fill_content(deliver, message)
        deliver.consumer_tag = consumer_tag
        deliver.delivery_tag = delivery_tag
        deliver.redelivered = redelivered
        self._send(envelope.SerializeToString())

    def deliver_run(self, consumer_tag, deliveries):
        for delivery_tag, redelivered, message in deliveries:
            self.deliver(consumer_tag, delivery_tag, redelivered, message)

    def returned(self, reply_code, reply_text, message):
        envelope = Envelope(channel=self.id)
        returned = envelope.basic_return
        fill_content(returned, message)
        returned.reply_code = reply_code
        returned.reply_text = reply_text
        self._send(envelope.SerializeToString())

    def publish_confirmed(self, sequence, multiple, ack):
        envelope = Envelope(channel=self.id)
        if ack:
            envelope.basic_ack.delivery_tag = sequence
            envelope.basic_ack.multiple = multiple
        else:
            envelope.basic_nack.delivery_tag = sequence
            envelope.basic_nack.multiple = multiple
            envelope.basic_nack.requeue = False
        self._send(envelope.SerializeToString())

    def consumer_cancelled(self, consumer_tag):
        envelope = Envelope(channel=self.id)
        envelope.basic_cancel.consumer_tag = consumer_tag
        self._send(envelope.SerializeToString())


# request kind (the Envelope's payload field) -> the NativeChannel method that answers it
CHANNEL_REQUESTS = {
    name[len("on_") :]: function
    for name, function in vars(NativeChannel).items()
    if name.startswith("on_")
}
