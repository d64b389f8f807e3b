"""pika's Twisted adapter against a real ``twistd brokerd`` subprocess: declaring
and binding with publisher confirms, consuming and settling (acks, nacks,
rejects, prefetch, cancel), mandatory returns and a 10 MiB body. Frame size,
heartbeats and closing are in L{tests.interop.test_pika_twisted_connection}.

TwistedProtocolConnection is connected with ClientCreator on 127.0.0.1; every
channel method returns a Deferred and consumers hand deliveries over through a
ClosableDeferredQueue. Each test case class has its own broker, each test its
own queue names (L{tests.support.pika_twisted_clients}).
"""

import os

import pika
from pika import exceptions as pika_exceptions
from twisted.internet import defer

from tests.support.client_broker import first_difference
from tests.support.pika_twisted_clients import PikaTwistedTestCase, unique, within

TEN_MIB = 10 * 1024 * 1024


class TopologyAndConfirmTests(PikaTwistedTestCase):
    @defer.inlineCallbacks
    def test_declared_exchange_routes_bound_key_to_queue_and_confirms_every_publish(self):
        channel = yield self.open_channel()
        exchange = unique("orders")
        frame = yield within(channel.exchange_declare(exchange=exchange, exchange_type="direct"), "exchange.declare-ok")
        self.assertIsInstance(frame.method, pika.spec.Exchange.DeclareOk)
        queue = yield self.declare_queue(channel, "orders-eu")
        frame = yield within(channel.queue_bind(queue=queue, exchange=exchange, routing_key="eu"), "queue.bind-ok")
        self.assertIsInstance(frame.method, pika.spec.Queue.BindOk)

        frame = yield within(channel.confirm_delivery(), "confirm.select-ok")
        self.assertIsInstance(frame.method, pika.spec.Confirm.SelectOk)
        acks = yield self.publish_confirmed(channel, exchange, "eu", *(b"order %d" % n for n in range(20)))
        self.assertEqual(len(acks), 20)
        # Not mandatory, so an unroutable message is simply confirmed and dropped.
        yield self.publish_confirmed(channel, exchange, "us", b"nobody is bound to us")

        self.assertEqual((yield self.queue_counts(channel, queue)), (20, 0))
        got = yield within(channel.basic_get(queue=queue), "basic.get-ok")
        self.assertEqual(got.body, b"order 0")
        self.assertEqual(
            (got.method.exchange, got.method.routing_key, got.method.redelivered, got.method.message_count),
            (exchange, "eu", False, 19),
        )

    @defer.inlineCallbacks
    def test_unbound_queue_stops_receiving(self):
        channel = yield self.open_channel()
        exchange = unique("events")
        yield within(channel.exchange_declare(exchange=exchange, exchange_type="direct"), "exchange.declare-ok")
        queue = yield self.declare_queue(channel, "events")
        yield within(channel.queue_bind(queue=queue, exchange=exchange, routing_key="k"), "queue.bind-ok")
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, exchange, "k", b"while bound")
        frame = yield within(channel.queue_unbind(queue=queue, exchange=exchange, routing_key="k"), "queue.unbind-ok")
        self.assertIsInstance(frame.method, pika.spec.Queue.UnbindOk)
        yield self.publish_confirmed(channel, exchange, "k", b"after unbind")
        self.assertEqual((yield self.queue_counts(channel, queue)), (1, 0))

    @defer.inlineCallbacks
    def test_basic_get_reports_remaining_count_and_empty_queue(self):
        channel = yield self.open_channel()
        queue = yield self.declare_queue(channel, "get")
        self.assertIsNone((yield within(channel.basic_get(queue=queue), "basic.get-empty")))

        yield within(channel.confirm_delivery(), "confirm.select-ok")
        properties = pika.BasicProperties(content_type="text/plain", headers={"attempt": 1}, delivery_mode=2)
        yield self.publish_confirmed(channel, "", queue, b"one", b"two", b"three", properties=properties)

        first = yield within(channel.basic_get(queue=queue), "first basic.get-ok")
        self.assertEqual((first.body, first.method.message_count, first.method.redelivered), (b"one", 2, False))
        self.assertEqual((first.method.exchange, first.method.routing_key), ("", queue))
        self.assertEqual(
            (first.properties.content_type, first.properties.headers, first.properties.delivery_mode),
            ("text/plain", {"attempt": 1}, 2),
        )
        channel.basic_ack(first.method.delivery_tag)

        second = yield within(channel.basic_get(queue=queue, auto_ack=True), "second basic.get-ok")
        self.assertEqual((second.body, second.method.message_count), (b"two", 1))
        self.assertGreater(second.method.delivery_tag, first.method.delivery_tag)
        # The auto-acked one and the acked one are gone; "three" is left.
        self.assertEqual((yield self.queue_counts(channel, queue)), (1, 0))


class ConsumeAndSettleTests(PikaTwistedTestCase):
    @defer.inlineCallbacks
    def test_consumer_queue_receives_deliveries_in_order_and_acks_remove_them(self):
        channel = yield self.open_channel()
        queue = yield self.declare_queue(channel, "consume")
        queue_object, consumer_tag = yield within(channel.basic_consume(queue=queue), "basic.consume-ok")
        self.assertIn(consumer_tag, channel.consumer_tags)

        yield within(channel.confirm_delivery(), "confirm.select-ok")
        properties = pika.BasicProperties(message_id="m", correlation_id="c", reply_to="replies")
        yield self.publish_confirmed(channel, "", queue, b"a", b"b", b"c", properties=properties)

        deliveries = []
        for number in range(3):
            deliveries.append((yield self.next_delivery(queue_object, f"delivery {number + 1} of 3")))
        self.assertEqual([d.body for d in deliveries], [b"a", b"b", b"c"])
        for delivery in deliveries:
            self.assertEqual(delivery.method.consumer_tag, consumer_tag)
            self.assertEqual((delivery.method.exchange, delivery.method.routing_key), ("", queue))
            self.assertFalse(delivery.method.redelivered)
            self.assertEqual(
                (delivery.properties.message_id, delivery.properties.correlation_id, delivery.properties.reply_to),
                ("m", "c", "replies"),
            )
        tags = [d.method.delivery_tag for d in deliveries]
        self.assertEqual(tags, sorted(set(tags)))

        channel.basic_ack(tags[0])
        channel.basic_ack(tags[2], multiple=True)
        self.assertEqual((yield self.queue_counts(channel, queue)), (0, 1))
        self.assertEqual(queue_object.pending, [])

    @defer.inlineCallbacks
    def test_nack_and_reject_with_requeue_redeliver_with_redelivered_set(self):
        channel = yield self.open_channel()
        queue = yield self.declare_queue(channel, "requeue")
        queue_object, _ = yield within(channel.basic_consume(queue=queue), "basic.consume-ok")
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, "", queue, b"retry me")

        first = yield self.next_delivery(queue_object, "first delivery")
        self.assertFalse(first.method.redelivered)
        channel.basic_nack(first.method.delivery_tag, requeue=True)

        second = yield self.next_delivery(queue_object, "redelivery after basic.nack(requeue=True)")
        self.assertEqual(second.body, b"retry me")
        self.assertTrue(second.method.redelivered)
        self.assertNotEqual(second.method.delivery_tag, first.method.delivery_tag)
        channel.basic_reject(second.method.delivery_tag, requeue=True)

        third = yield self.next_delivery(queue_object, "redelivery after basic.reject(requeue=True)")
        self.assertEqual(third.body, b"retry me")
        self.assertTrue(third.method.redelivered)
        channel.basic_nack(third.method.delivery_tag, requeue=False)

        self.assertEqual((yield self.queue_counts(channel, queue)), (0, 1))
        self.assertEqual(queue_object.pending, [])

    @defer.inlineCallbacks
    def test_prefetch_window_holds_exactly_qos_count_outstanding_until_an_ack(self):
        window = 3
        channel = yield self.open_channel()
        queue = yield self.declare_queue(channel, "prefetch")
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, "", queue, *(b"job %d" % n for n in range(window + 3)))
        frame = yield within(channel.basic_qos(prefetch_count=window), "basic.qos-ok")
        self.assertIsInstance(frame.method, pika.spec.Basic.QosOk)

        queue_object, _ = yield within(channel.basic_consume(queue=queue), "basic.consume-ok")
        outstanding = []
        for number in range(window):
            outstanding.append((yield self.next_delivery(queue_object, f"delivery {number + 1} of the window")))
        self.assertEqual([d.body for d in outstanding], [b"job 0", b"job 1", b"job 2"])
        # The declare-ok comes after anything the broker sent before it on this channel.
        self.assertEqual((yield self.queue_counts(channel, queue)), (3, 1))
        self.assertEqual(queue_object.pending, [], "the broker delivered more than the prefetch window")

        channel.basic_ack(outstanding[0].method.delivery_tag)
        refill = yield self.next_delivery(queue_object, "delivery after acking one of the window")
        self.assertEqual(refill.body, b"job 3")
        self.assertEqual((yield self.queue_counts(channel, queue)), (2, 1))
        self.assertEqual(queue_object.pending, [], "one ack made room for more than one delivery")

        channel.basic_ack(refill.method.delivery_tag, multiple=True)
        rest = []
        for number in (5, 6):
            rest.append((yield self.next_delivery(queue_object, f"delivery {number} after acking all")))
        self.assertEqual([d.body for d in rest], [b"job 4", b"job 5"])
        self.assertEqual((yield self.queue_counts(channel, queue)), (0, 1))

    @defer.inlineCallbacks
    def test_cancel_stops_deliveries_and_closes_the_consumer_queue(self):
        channel = yield self.open_channel()
        queue = yield self.declare_queue(channel, "cancel")
        queue_object, consumer_tag = yield within(channel.basic_consume(queue=queue), "basic.consume-ok")
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, "", queue, b"before cancel")
        held = yield self.next_delivery(queue_object, "delivery before cancel")

        frame = yield within(channel.basic_cancel(consumer_tag), "basic.cancel-ok")
        self.assertIsInstance(frame.method, pika.spec.Basic.CancelOk)
        self.assertEqual(frame.method.consumer_tag, consumer_tag)
        yield self.assertFailure(queue_object.get(), pika_exceptions.ConsumerCancelled)

        yield self.publish_confirmed(channel, "", queue, b"after cancel")
        self.assertEqual((yield self.queue_counts(channel, queue)), (1, 0))
        # The delivery taken before the cancel is still this channel's to ack.
        channel.basic_ack(held.method.delivery_tag)
        self.assertEqual((yield self.queue_counts(channel, queue)), (1, 0))
        self.assertTrue(channel.is_open)


class ReturnsAndLargeMessageTests(PikaTwistedTestCase):
    @defer.inlineCallbacks
    def test_unroutable_mandatory_message_is_returned_with_312_no_route(self):
        channel = yield self.open_channel()
        exchange = unique("nowhere")
        yield within(channel.exchange_declare(exchange=exchange, exchange_type="direct"), "exchange.declare-ok")
        returned = defer.Deferred()
        channel.add_on_return_callback(returned.callback)

        properties = pika.BasicProperties(content_type="application/json", headers={"k": "v"})
        channel.basic_publish(exchange, "no.binding", b'{"lost": true}', properties=properties, mandatory=True)
        message = yield within(returned, "basic.return for a mandatory unroutable message")

        self.assertIsInstance(message.method, pika.spec.Basic.Return)
        self.assertEqual(
            (message.method.reply_code, message.method.reply_text, message.method.exchange, message.method.routing_key),
            (312, "NO_ROUTE", exchange, "no.binding"),
        )
        self.assertEqual(message.body, b'{"lost": true}')
        self.assertEqual(message.properties.content_type, "application/json")
        self.assertEqual(message.properties.headers, {"k": "v"})
        self.assertTrue(channel.is_open)

    @defer.inlineCallbacks
    def test_unroutable_mandatory_publish_in_confirm_mode_fails_with_the_return(self):
        channel = yield self.open_channel()
        returned = defer.Deferred()
        channel.add_on_return_callback(returned.callback)
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        missing = unique("no-such-queue")

        unroutable = yield self.assertFailure(
            within(
                channel.basic_publish("", missing, b"to nobody", mandatory=True), "confirm for an unroutable message"
            ),
            pika_exceptions.UnroutableError,
        )
        [message] = unroutable.messages
        self.assertEqual((message.method.reply_code, message.method.routing_key), (312, missing))
        self.assertEqual(message.body, b"to nobody")
        self.assertEqual((yield within(returned, "return callback")).method.reply_code, 312)

        # The channel carries on: a routable publish is confirmed normally.
        queue = yield self.declare_queue(channel, "after-return")
        yield self.publish_confirmed(channel, "", queue, b"routable")
        self.assertEqual((yield self.queue_counts(channel, queue)), (1, 0))

    @defer.inlineCallbacks
    def test_ten_mebibyte_body_arrives_byte_exact_through_consume_and_get(self):
        channel = yield self.open_channel()
        queue = yield self.declare_queue(channel, "large")
        body = os.urandom(TEN_MIB)
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, "", queue, body, body[::-1])

        got = yield within(channel.basic_get(queue=queue), "basic.get-ok of a 10 MiB message", 30)
        self.assertTrue(got.body == body, f"basic.get body differs: {first_difference(body, got.body)}")
        channel.basic_ack(got.method.delivery_tag)

        queue_object, _ = yield within(channel.basic_consume(queue=queue), "basic.consume-ok")
        delivery = yield self.next_delivery(queue_object, "delivery of a 10 MiB message")
        self.assertTrue(
            delivery.body == body[::-1], f"delivered body differs: {first_difference(body[::-1], delivery.body)}"
        )
        channel.basic_ack(delivery.method.delivery_tag)
        self.assertEqual((yield self.queue_counts(channel, queue)), (0, 1))
