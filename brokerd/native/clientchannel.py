"""The channel half of the native client: a L{ClientChannel}'s requests as
Deferreds (topology, publishing with confirms, consuming, getting, settling,
management commands, whose long answers arrive in several frames),
the L{Delivery} objects it hands to consumers, the message properties it
accepts, and the errors its Deferreds fail with.

L{brokerd.native.client} holds the connection half and re-exports all of these.
"""

from collections import OrderedDict

from twisted.internet import defer

from brokerd.proto import messages_pb2
from brokerd.proto.exchange_types import EXCHANGE_TYPE_BY_NAME
from brokerd.proto.native_pb2 import Envelope
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
    """A C{BasicProperties} (of C{brokerd.proto.messages_pb2}) from a
    BasicProperties, a dict of its fields, or None.

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

    def __init__(
        self, channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties,
        body, message_count=None,
    ):
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


class ClientChannel:
    """
    One channel of a L{NativeClientProtocol}.

    @ivar closed: a Deferred firing with the L{ChannelClosed} reason when the
        channel closes, whoever closed it.
    @ivar on_return: called with a L{Delivery} (reply code and text added as
        attributes) for each mandatory message the broker returns.
    @ivar on_cancel: called with a consumer tag when the broker cancels a
        consumer (e.g. its queue was deleted).
    """

    def __init__(self, protocol, channel_id):
        self.protocol = protocol
        self.id = channel_id
        self.closed = defer.Deferred()
        self.close_reason = None
        self.on_return = None
        self.on_cancel = None
        self._pending = {}  # correlation id -> (Deferred, expected response kind)
        # correlation id -> the parts of a reply that comes in several frames
        self._reply_parts = {}
        self._consumers = {}  # consumer tag -> callback
        self._unconfirmed = None  # publish sequence -> Deferred, once in confirm mode
        self._publish_sequence = 0

    # -- plumbing

    def _request(self, kind, expected="ok", **fields):
        if self.close_reason is not None:
            return defer.fail(self.close_reason)
        envelope = Envelope(channel=self.id)
        payload = getattr(envelope, kind)
        payload.SetInParent()
        for name, value in fields.items():
            if name == "arguments" and isinstance(value, dict):
                dict_to_table(value, payload.arguments)
            elif name == "arguments":
                payload.arguments.extend(value)  # a management request's positional arguments
            else:
                setattr(payload, name, value)
        d = defer.Deferred()
        correlation_id = next(self.protocol._correlation_ids)
        envelope.correlation_id = correlation_id
        self._pending[correlation_id] = (d, expected)
        self.protocol.sendFrame(envelope.SerializeToString())
        return d

    def _send(self, kind, **fields):
        if self.close_reason is not None:
            raise self.close_reason
        envelope = Envelope(channel=self.id)
        payload = getattr(envelope, kind)
        payload.SetInParent()
        for name, value in fields.items():
            setattr(payload, name, value)
        self.protocol.sendFrame(envelope.SerializeToString())

    def _frame_received(self, envelope, kind):
        payload = getattr(envelope, kind)
        # A channel_close answering a request is an error: _on_channel_close
        # fails every pending request.
        pending = None
        if envelope.correlation_id and kind != "channel_close":
            pending = self._pending.pop(envelope.correlation_id, None)
        if pending is not None:
            d, expected = pending
            # A part: the request stays pending for the rest.
            if kind == "management_reply" and payload.more:
                self._pending[envelope.correlation_id] = pending
                self._reply_parts.setdefault(envelope.correlation_id, []).append(payload)
            elif kind == expected or expected == "*":
                parts = self._reply_parts.pop(envelope.correlation_id, None)
                d.callback(payload if parts is None else [*parts, payload])
            else:
                d.errback(ValueError(f"expected {expected} from the broker, got {kind}"))
            return
        handler = getattr(self, "_on_" + kind, None)
        if handler is not None:
            handler(payload)

    def _on_basic_deliver(self, deliver):
        callback = self._consumers.get(deliver.consumer_tag)
        if callback is None:
            # Not a consumer of ours (any more): give the message back rather than strand it.
            self.basic_reject(deliver.delivery_tag, requeue=True)
        else:
            callback(
                Delivery(
                    self,
                    deliver.consumer_tag,
                    deliver.delivery_tag,
                    deliver.redelivered,
                    deliver.exchange,
                    deliver.routing_key,
                    deliver.properties,
                    deliver.body,
                )
            )

    def _on_basic_return(self, returned):
        if self.on_return is not None:
            delivery = Delivery(
                self, "", 0, False, returned.exchange, returned.routing_key, returned.properties,
                returned.body,
            )
            delivery.reply_code = returned.reply_code
            delivery.reply_text = returned.reply_text
            self.on_return(delivery)

    def _on_basic_ack(self, ack):
        self._settle_publishes(ack.delivery_tag, ack.multiple, None)

    def _on_basic_nack(self, nack):
        self._settle_publishes(
            nack.delivery_tag, nack.multiple, PublishNacked(f"publish {nack.delivery_tag} refused")
        )

    def _settle_publishes(self, sequence, multiple, error):
        unconfirmed = self._unconfirmed
        if not unconfirmed:
            return
        settled = []
        if multiple:
            while unconfirmed and next(iter(unconfirmed)) <= sequence:
                settled.append(unconfirmed.popitem(last=False))
        elif sequence in unconfirmed:
            settled.append((sequence, unconfirmed.pop(sequence)))
        for own_sequence, d in settled:
            if error is None:
                d.callback(own_sequence)
            else:
                d.errback(error)

    def _on_basic_cancel(self, cancel):
        self._consumers.pop(cancel.consumer_tag, None)
        if self.on_cancel is not None:
            self.on_cancel(cancel.consumer_tag)

    def _on_channel_close(self, close):
        self._send_close_ok()
        self._closed(ChannelClosed(close.reply_code, close.reply_text))

    def _send_close_ok(self):
        envelope = Envelope(channel=self.id)
        envelope.channel_close_ok.SetInParent()
        self.protocol.sendFrame(envelope.SerializeToString())

    def _closed(self, reason):
        if self.close_reason is not None:
            return
        self.close_reason = reason
        self.protocol._channels.pop(self.id, None)
        pending, self._pending = self._pending, {}
        for d, _ in pending.values():
            d.errback(reason)
        unconfirmed, self._unconfirmed = self._unconfirmed or {}, None
        for d in unconfirmed.values():
            d.errback(reason)
        self.closed.callback(reason)

    # -- topology

    def exchange_declare(
        self, exchange, type="direct", passive=False, durable=False, auto_delete=False,
        internal=False, arguments=None,
    ):
        return self._request(
            "exchange_declare",
            exchange=exchange,
            type=EXCHANGE_TYPE_BY_NAME[type],
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments or {},
        )

    def exchange_delete(self, exchange, if_unused=False):
        return self._request("exchange_delete", exchange=exchange, if_unused=if_unused)

    def exchange_bind(self, destination, source, routing_key="", arguments=None):
        """
        Route what C{source} takes under C{routing_key} (and C{arguments}) on
        to exchange C{destination}.
        """
        return self._request(
            "exchange_bind", destination=destination, source=source, routing_key=routing_key,
            arguments=arguments or {},
        )

    def exchange_unbind(self, destination, source, routing_key="", arguments=None):
        """Remove an exchange-to-exchange binding; one that does not exist is not an error."""
        return self._request(
            "exchange_unbind", destination=destination, source=source, routing_key=routing_key,
            arguments=arguments or {},
        )

    def queue_declare(
        self, queue="", passive=False, durable=False, exclusive=False, auto_delete=False,
        arguments=None,
    ):
        """Fires with a C{QueueDeclareOk} (C{queue}, C{message_count}, C{consumer_count})."""
        return self._request(
            "queue_declare",
            "queue_declare_ok",
            queue=queue,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments or {},
        )

    def queue_bind(self, queue, exchange, routing_key="", arguments=None):
        return self._request(
            "queue_bind", queue=queue, exchange=exchange, routing_key=routing_key,
            arguments=arguments or {},
        )

    def queue_unbind(self, queue, exchange, routing_key="", arguments=None):
        return self._request(
            "queue_unbind", queue=queue, exchange=exchange, routing_key=routing_key,
            arguments=arguments or {},
        )

    def queue_purge(self, queue):
        """Fires with the number of messages purged."""
        d = self._request("queue_purge", "message_count", queue=queue)
        return d.addCallback(lambda reply: reply.message_count)

    def queue_delete(self, queue, if_unused=False, if_empty=False):
        """Fires with the number of messages deleted with the queue."""
        d = self._request(
            "queue_delete", "message_count", queue=queue, if_unused=if_unused, if_empty=if_empty
        )
        return d.addCallback(lambda reply: reply.message_count)

    # -- publishing

    def confirm_select(self):
        """Confirm mode: from now on C{basic_publish} returns a Deferred per publish."""
        d = self._request("confirm_select")

        def selected(reply):
            if self._unconfirmed is None:
                self._unconfirmed = OrderedDict()
            return reply

        return d.addCallback(selected)

    def basic_publish(self, exchange, routing_key, body, properties=None, mandatory=False):
        """
        Publish a message.

        @return: None, or in confirm mode a Deferred firing with the publish's
            sequence number once the broker confirms it (failing with
            L{PublishNacked} if it refuses it).
        """
        envelope = Envelope(channel=self.id)
        publish = envelope.basic_publish
        publish.exchange = exchange
        publish.routing_key = routing_key
        publish.body = body
        publish.mandatory = mandatory
        if properties is not None:
            publish.properties.CopyFrom(make_properties(properties))
        if self.close_reason is not None:
            return defer.fail(self.close_reason)
        self.protocol.sendFrame(envelope.SerializeToString())
        if self._unconfirmed is None:
            return None
        self._publish_sequence += 1
        d = self._unconfirmed[self._publish_sequence] = defer.Deferred()
        return d

    # -- consuming

    def basic_qos(self, prefetch_count, global_=False):
        # "global" is a Python keyword, hence the dict.
        return self._request("basic_qos", prefetch_count=prefetch_count, **{"global": global_})

    def basic_consume(
        self, queue, callback, consumer_tag="", no_ack=False, exclusive=False, arguments=None
    ):
        """Start consuming; C{callback} gets each L{Delivery}. Fires with the consumer tag."""
        d = self._request(
            "basic_consume",
            "basic_consume_ok",
            queue=queue,
            consumer_tag=consumer_tag,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments or {},
        )

        def started(reply):
            self._consumers[reply.consumer_tag] = callback
            return reply.consumer_tag

        return d.addCallback(started)

    def basic_cancel(self, consumer_tag):
        d = self._request("basic_cancel", consumer_tag=consumer_tag)

        def cancelled(reply):
            self._consumers.pop(consumer_tag, None)
            return consumer_tag

        return d.addCallback(cancelled)

    def basic_get(self, queue, no_ack=False):
        """Fires with a L{Delivery} (with C{message_count}), or None if the queue is empty."""
        d = self._request("basic_get", "*", queue=queue, no_ack=no_ack)

        def got(reply):
            if reply.DESCRIPTOR.name == "BasicGetEmpty":
                return None
            return Delivery(
                self, "", reply.delivery_tag, reply.redelivered, reply.exchange, reply.routing_key,
                reply.properties, reply.body, reply.message_count,
            )

        return d.addCallback(got)

    def basic_ack(self, delivery_tag, multiple=False):
        self._send("basic_ack", delivery_tag=delivery_tag, multiple=multiple)

    def basic_nack(self, delivery_tag, multiple=False, requeue=True):
        self._send("basic_nack", delivery_tag=delivery_tag, multiple=multiple, requeue=requeue)

    def basic_reject(self, delivery_tag, requeue=True):
        self._send("basic_reject", delivery_tag=delivery_tag, requeue=requeue)

    def basic_recover(self, requeue=True):
        return self._request("basic_recover", requeue=requeue)

    # -- management

    def management(self, command, arguments=(), vhost="", backend=""):
        """
        Run rabbitmqctl's C{command} (e.g. C{"list_users"}) with its positional
        C{arguments} (the logged-in user must be an administrator); fires with
        C{(columns, rows)} once the change is durable, rows as tuples of text.
        """
        d = self._request("management_request", "management_reply", command=command, vhost=vhost,
                          backend=backend, arguments=list(arguments))

        def table(reply):
            parts = reply if isinstance(reply, list) else [reply]
            rows = [tuple(row.values) for part in parts for row in part.rows]
            return tuple(parts[0].columns), rows

        return d.addCallback(table)

    # -- closing

    def close(self):
        """Close the channel; fires once the broker has confirmed."""
        if self.close_reason is not None:
            return defer.succeed(None)
        d = self._request("channel_close", "channel_close_ok", reply_code=200, reply_text="OK")
        d.addCallback(lambda _: self._closed(ChannelClosed(200, "OK")))
        return d
