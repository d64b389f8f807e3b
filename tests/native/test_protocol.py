"""Native protocol through the real client against a real broker: topology, publish, consume, settle, confirms."""

import datetime
import decimal

from twisted.internet import defer

from brokerd.native.client import ChannelClosed, make_properties
from brokerd.proto import messages_pb2
from tests.support.broker import DeliveryCollector
from tests.support.native_protocol import NativeProtocolTestCase

UTC = datetime.timezone.utc


class TopologyAndRoutingTests(NativeProtocolTestCase):
    @defer.inlineCallbacks
    def test_message_published_to_bound_exchange_reaches_queue_with_its_routing_data(self):
        yield self.channel.exchange_declare("orders", "direct")
        declared = yield self.channel.queue_declare("orders.eu")
        self.assertEqual((declared.queue, declared.message_count, declared.consumer_count), ("orders.eu", 0, 0))
        yield self.channel.queue_bind("orders.eu", "orders", "eu")

        self.channel.basic_publish("orders", "eu", b"order 1")
        self.channel.basic_publish("orders", "us", b"nobody is bound to us")
        got = yield self.channel.basic_get("orders.eu")

        self.assertEqual((got.body, got.exchange, got.routing_key), (b"order 1", "orders", "eu"))
        self.assertFalse(got.redelivered)
        self.assertEqual(got.message_count, 0)
        self.assertIsNone((yield self.channel.basic_get("orders.eu")))

    @defer.inlineCallbacks
    def test_exchange_to_exchange_binding_routes_on_until_unbound(self):
        yield self.channel.exchange_declare("events", "topic")
        yield self.channel.exchange_declare("audit", "fanout")
        yield self.channel.queue_declare("audit.log")
        yield self.channel.queue_bind("audit.log", "audit")
        yield self.channel.exchange_bind("audit", "events", "orders.#")

        self.channel.basic_publish("events", "orders.new", b"audited")
        self.channel.basic_publish("events", "invoices.new", b"not audited")
        got = yield self.channel.basic_get("audit.log", no_ack=True)
        self.assertEqual((got.body, got.exchange, got.routing_key), (b"audited", "events", "orders.new"))
        yield self.channel.exchange_unbind("audit", "events", "orders.#")
        yield self.channel.exchange_unbind("audit", "events", "orders.#")  # gone already: not an error
        self.channel.basic_publish("events", "orders.new", b"unbound")
        self.assertEqual((yield self.queue_counts("audit.log")), (0, 0))
        error = yield self.assertFailure(self.channel.exchange_bind("", "events"), ChannelClosed)
        self.assertEqual((error.reply_code, error.reply_text),
                         (403, "ACCESS_REFUSED - operation not permitted on the default exchange"))
        channel = yield self.client.channel()
        error = yield self.assertFailure(channel.exchange_unbind("x" * 300, "events"), ChannelClosed)
        self.assertEqual(error.reply_code, 406)
        self.assertIn("exchange name is 300 bytes of UTF-8; the limit is 255", error.reply_text)

    @defer.inlineCallbacks
    def test_server_named_queue_is_reported_in_declare_ok(self):
        declared = yield self.channel.queue_declare("")
        self.assertTrue(declared.queue.startswith("amq.gen-"), declared.queue)
        self.channel.basic_publish("", declared.queue, b"to a generated name")
        got = yield self.channel.basic_get(declared.queue)
        self.assertEqual(got.body, b"to a generated name")

    @defer.inlineCallbacks
    def test_purge_and_delete_report_how_many_ready_messages_went(self):
        yield self.channel.queue_declare("work")
        for number in range(4):
            self.channel.basic_publish("", "work", b"job %d" % number)
        self.assertEqual((yield self.channel.queue_purge("work")), 4)
        self.assertEqual((yield self.queue_counts("work")), (0, 0))

        for number in range(3):
            self.channel.basic_publish("", "work", b"job %d" % number)
        held = yield self.channel.basic_get("work")  # delivered, un-acked: not a ready message
        self.assertEqual(held.body, b"job 0")
        self.assertEqual((yield self.channel.queue_delete("work")), 2)
        yield self.assert_queue_missing("work")


class ConsumeAndSettleTests(NativeProtocolTestCase):
    @defer.inlineCallbacks
    def test_consumer_receives_messages_published_after_it_started(self):
        yield self.channel.queue_declare("inbox")
        received = DeliveryCollector()
        tag = yield self.channel.basic_consume("inbox", received, consumer_tag="reader")
        self.assertEqual(tag, "reader")
        for number in range(3):
            self.channel.basic_publish("", "inbox", b"message %d" % number)

        deliveries = yield received.wait_for(3)
        self.assertEqual(received.bodies(), [b"message 0", b"message 1", b"message 2"])
        self.assertEqual([d.delivery_tag for d in deliveries], [1, 2, 3])
        self.assertEqual({(d.consumer_tag, d.exchange, d.routing_key, d.redelivered) for d in deliveries},
                         {("reader", "", "inbox", False)})

    @defer.inlineCallbacks
    def test_consumer_receives_messages_that_were_waiting_before_it_started(self):
        yield self.channel.queue_declare("backlog")
        for number in range(3):
            self.channel.basic_publish("", "backlog", b"waiting %d" % number)
        self.assertEqual((yield self.queue_counts("backlog")), (3, 0))

        received = DeliveryCollector()
        yield self.channel.basic_consume("backlog", received)
        yield received.wait_for(3)
        self.assertEqual(received.bodies(), [b"waiting 0", b"waiting 1", b"waiting 2"])

    @defer.inlineCallbacks
    def test_single_acks_settle_only_their_own_delivery(self):
        yield self.channel.queue_declare("tasks")
        received = DeliveryCollector()
        yield self.channel.basic_consume("tasks", received)
        for number in range(4):
            self.channel.basic_publish("", "tasks", b"task %d" % number)
        deliveries = yield received.wait_for(4)
        deliveries[0].ack()
        deliveries[2].ack()
        yield self.channel.close()  # the two un-acked deliveries go back to the queue

        channel = yield self.client.channel()
        first, second = yield defer.gatherResults([channel.basic_get("tasks"), channel.basic_get("tasks")])
        self.assertEqual([(first.body, first.redelivered), (second.body, second.redelivered)],
                         [(b"task 1", True), (b"task 3", True)])
        self.assertIsNone((yield channel.basic_get("tasks")))

    @defer.inlineCallbacks
    def test_ack_multiple_settles_every_delivery_up_to_its_tag(self):
        yield self.channel.queue_declare("batch")
        for number in range(5):
            self.channel.basic_publish("", "batch", b"item %d" % number)
        gotten = yield defer.gatherResults([self.channel.basic_get("batch") for _ in range(5)])
        self.assertEqual([got.delivery_tag for got in gotten], [1, 2, 3, 4, 5])
        self.channel.basic_ack(3, multiple=True)
        yield self.channel.close()

        channel = yield self.client.channel()
        declared = yield channel.queue_declare("batch", passive=True)
        self.assertEqual(declared.message_count, 2)
        rest = yield defer.gatherResults([channel.basic_get("batch"), channel.basic_get("batch")])
        self.assertEqual([(got.body, got.redelivered) for got in rest], [(b"item 3", True), (b"item 4", True)])

    @defer.inlineCallbacks
    def test_nack_with_requeue_delivers_the_message_again_marked_redelivered(self):
        yield self.channel.queue_declare("retry")
        received = DeliveryCollector()
        yield self.channel.basic_consume("retry", received)
        self.channel.basic_publish("", "retry", b"flaky job")
        first = (yield received.wait_for(1))[0]
        self.assertFalse(first.redelivered)
        first.nack(requeue=True)

        second = (yield received.wait_for(2))[1]
        self.assertEqual((second.body, second.redelivered), (b"flaky job", True))
        self.assertNotEqual(second.delivery_tag, first.delivery_tag)
        second.ack()
        yield self.channel.basic_cancel(second.consumer_tag)
        self.assertEqual((yield self.queue_counts("retry")), (0, 0))

    @defer.inlineCallbacks
    def test_nack_without_requeue_drops_messages_and_multiple_covers_earlier_tags(self):
        yield self.channel.queue_declare("drop")
        for number in range(3):
            self.channel.basic_publish("", "drop", b"bad %d" % number)
        gotten = yield defer.gatherResults([self.channel.basic_get("drop") for _ in range(3)])
        self.channel.basic_nack(gotten[1].delivery_tag, multiple=True, requeue=False)
        yield self.channel.close()  # only the third delivery is still un-acked; it is requeued

        channel = yield self.client.channel()
        left = yield channel.basic_get("drop")
        self.assertEqual((left.body, left.redelivered, left.message_count), (b"bad 2", True, 0))
        self.assertIsNone((yield channel.basic_get("drop")))

    @defer.inlineCallbacks
    def test_reject_requeues_or_drops_one_message(self):
        yield self.channel.queue_declare("judged")
        self.channel.basic_publish("", "judged", b"keep me")
        self.channel.basic_publish("", "judged", b"drop me")
        keep = yield self.channel.basic_get("judged")
        drop = yield self.channel.basic_get("judged")
        drop.reject(requeue=False)
        keep.reject(requeue=True)

        again = yield self.channel.basic_get("judged")
        self.assertEqual((again.body, again.redelivered, again.message_count), (b"keep me", True, 0))
        again.ack()
        self.assertIsNone((yield self.channel.basic_get("judged")))

    @defer.inlineCallbacks
    def test_basic_get_reports_remaining_count_and_none_when_empty(self):
        yield self.channel.queue_declare("pull")
        self.assertIsNone((yield self.channel.basic_get("pull")))
        for number in range(3):
            self.channel.basic_publish("", "pull", b"pulled %d" % number)
        first = yield self.channel.basic_get("pull", no_ack=True)
        second = yield self.channel.basic_get("pull", no_ack=True)
        self.assertEqual([(first.body, first.message_count), (second.body, second.message_count)],
                         [(b"pulled 0", 2), (b"pulled 1", 1)])
        yield self.channel.close()  # no_ack gets are settled already: nothing comes back
        channel = yield self.client.channel()
        last = yield channel.basic_get("pull")
        self.assertEqual((last.body, last.redelivered, last.message_count), (b"pulled 2", False, 0))

    @defer.inlineCallbacks
    def test_recover_with_requeue_delivers_unacked_messages_again(self):
        yield self.channel.queue_declare("recover")
        received = DeliveryCollector()
        yield self.channel.basic_consume("recover", received)
        self.channel.basic_publish("", "recover", b"first")
        self.channel.basic_publish("", "recover", b"second")
        yield received.wait_for(2)
        received.deliveries[0].ack()
        yield self.channel.basic_recover(requeue=True)

        again = (yield received.wait_for(3))[2]
        self.assertEqual((again.body, again.redelivered), (b"second", True))
        again.ack()
        self.assertEqual((yield self.queue_counts("recover")), (0, 1))
        self.assertEqual(len(received.deliveries), 3)

    @defer.inlineCallbacks
    def test_cancelled_consumer_gets_no_more_deliveries(self):
        yield self.channel.queue_declare("news")
        received = DeliveryCollector(ack=True)
        tag = yield self.channel.basic_consume("news", received)
        self.channel.basic_publish("", "news", b"before cancel 1")
        self.channel.basic_publish("", "news", b"before cancel 2")
        yield received.wait_for(2)
        self.assertEqual((yield self.channel.basic_cancel(tag)), tag)

        for number in range(3):
            self.channel.basic_publish("", "news", b"after cancel %d" % number)
        self.assertEqual((yield self.queue_counts("news")), (3, 0))
        self.assertEqual(received.bodies(), [b"before cancel 1", b"before cancel 2"])

    @defer.inlineCallbacks
    def test_prefetch_limits_unacked_deliveries_per_consumer(self):
        yield self.channel.queue_declare("limited")
        yield self.channel.basic_qos(2)
        received = DeliveryCollector()
        yield self.channel.basic_consume("limited", received)
        for number in range(5):
            self.channel.basic_publish("", "limited", b"m%d" % number)
        yield received.wait_for(2)
        self.assertEqual((yield self.queue_counts("limited")), (3, 1))
        self.assertEqual(received.bodies(), [b"m0", b"m1"])

        received.deliveries[0].ack()
        yield received.wait_for(3)
        self.assertEqual((yield self.queue_counts("limited")), (2, 1))
        self.assertEqual(received.bodies(), [b"m0", b"m1", b"m2"])

        received.deliveries[2].ack(multiple=True)  # settles m1 and m2: room for two more
        yield received.wait_for(5)
        self.assertEqual((yield self.queue_counts("limited")), (0, 1))
        self.assertEqual(received.bodies(), [b"m0", b"m1", b"m2", b"m3", b"m4"])

    @defer.inlineCallbacks
    def test_global_prefetch_limits_the_whole_channel_across_consumers(self):
        yield self.channel.queue_declare("left")
        yield self.channel.queue_declare("right")
        yield self.channel.basic_qos(3, global_=True)
        received = DeliveryCollector()
        yield self.channel.basic_consume("left", received)
        yield self.channel.basic_consume("right", received)
        for number in range(3):
            self.channel.basic_publish("", "left", b"L%d" % number)
            self.channel.basic_publish("", "right", b"R%d" % number)
        yield received.wait_for(3)
        left_ready, _ = yield self.queue_counts("left")
        right_ready, _ = yield self.queue_counts("right")
        self.assertEqual((len(received.deliveries), left_ready + right_ready), (3, 3))


class PublisherConfirmTests(NativeProtocolTestCase):
    @defer.inlineCallbacks
    def test_each_publish_is_confirmed_with_its_sequence_number(self):
        yield self.channel.queue_declare("durable-jobs", durable=True)
        yield self.channel.queue_declare("transient-jobs")
        yield self.channel.confirm_select()
        confirms = [
            self.channel.basic_publish("", "durable-jobs", b"persistent", properties={"delivery_mode": 2}),
            self.channel.basic_publish("", "transient-jobs", b"transient"),
            self.channel.basic_publish("", "no-such-queue", b"unroutable, not mandatory"),
            self.channel.basic_publish("", "durable-jobs", b"persistent again", properties={"delivery_mode": 2}),
        ]
        self.assertEqual((yield defer.gatherResults(confirms)), [1, 2, 3, 4])
        self.assertEqual((yield self.queue_counts("durable-jobs")), (2, 0))

    @defer.inlineCallbacks
    def test_mandatory_unroutable_publish_is_returned_with_312_then_confirmed(self):
        yield self.channel.exchange_declare("events", "topic")
        yield self.channel.confirm_select()
        events = []
        self.channel.on_return = lambda returned: events.append(("returned", returned))
        confirmed = self.channel.basic_publish(
            "events", "user.created", b"nobody listens", properties={"message_id": "m-1"}, mandatory=True
        )
        confirmed.addCallback(lambda sequence: events.append(("confirmed", sequence)))
        yield confirmed

        self.assertEqual([kind for kind, _ in events], ["returned", "confirmed"])
        returned = events[0][1]
        self.assertEqual((returned.reply_code, returned.reply_text), (312, "NO_ROUTE"))
        self.assertEqual((returned.exchange, returned.routing_key, returned.body),
                         ("events", "user.created", b"nobody listens"))
        self.assertEqual(returned.properties.message_id, "m-1")
        self.assertEqual(events[1][1], 1)

    @defer.inlineCallbacks
    def test_unroutable_publish_without_mandatory_is_not_returned(self):
        returned = []
        self.channel.on_return = returned.append
        yield self.channel.confirm_select()
        yield self.channel.basic_publish("", "no-such-queue", b"dropped quietly")
        self.assertEqual(returned, [])


class PropertiesRoundTripTests(NativeProtocolTestCase):
    HEADERS = {
        "string": "héllo wörld",
        "empty string": "",
        "int": 42,
        "negative int": -7,
        "int64 max": 2**63 - 1,
        "int64 min": -(2**63),
        "float": 3.141592653589793,
        "negative float": -0.5,
        "true": True,
        "false": False,
        "bytes": b"\x00\x01\xfe\xff",
        "timestamp": datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=UTC),
        "nested": {"level": 2, "inner": {"deep": "yes", "list": [1, "two"]}, "empty": {}},
        "list": [1, "two", 3.5, False, None, b"raw", [4, 5], {"key": "value"}],
        "empty list": [],
        "void": None,
        "decimal": decimal.Decimal("3.14"),
        "negative decimal": decimal.Decimal("-12.345"),
    }
    PROPERTIES = {
        "id": "internal-id-1",
        "delivery_mode": 2,
        "routing_key": "original.key",
        "content_type": "application/json",
        "content_encoding": "",  # present but empty: must stay present
        "headers": HEADERS,
        "priority": 9,
        "correlation_id": "corr-77",
        "reply_to": "rpc.replies",  # not amq.rabbitmq.reply-to, which needs a reply consumer
        "expiration": "60000",
        "message_id": "msg-0001",
        "timestamp": 1_700_000_000,
        "type": "order.created",
        "user_id": "guest",
        "app_id": "billing",
    }

    def assert_same_properties(self, delivery):
        expected = make_properties(self.PROPERTIES)
        self.assertEqual(delivery.properties, expected)
        self.assertEqual(delivery.properties.SerializeToString(deterministic=True),
                         expected.SerializeToString(deterministic=True))
        self.assertTrue(delivery.properties.HasField("content_encoding"))
        self.assertEqual(delivery.properties.delivery_mode, messages_pb2.PERSISTENT)
        self.assertEqual(delivery.headers, self.HEADERS)
        self.assertEqual(list(delivery.headers), list(self.HEADERS))  # tables keep their order

    @defer.inlineCallbacks
    def test_every_property_and_header_type_survives_consume_and_get(self):
        yield self.channel.queue_declare("typed")
        received = DeliveryCollector()
        yield self.channel.basic_consume("typed", received)
        self.channel.basic_publish("", "typed", b"consumed", properties=self.PROPERTIES)
        self.assert_same_properties((yield received.wait_for(1))[0])

        yield self.channel.queue_declare("typed-get")
        self.channel.basic_publish("", "typed-get", b"gotten", properties=self.PROPERTIES)
        self.assert_same_properties((yield self.channel.basic_get("typed-get")))

    @defer.inlineCallbacks
    def test_absent_properties_stay_absent(self):
        yield self.channel.queue_declare("bare")
        self.channel.basic_publish("", "bare", b"no properties")
        got = yield self.channel.basic_get("bare")
        self.assertEqual(got.properties, messages_pb2.BasicProperties())
        self.assertFalse(got.properties.HasField("content_type"))
        self.assertEqual(got.headers, {})


class TwoChannelTests(NativeProtocolTestCase):
    @defer.inlineCallbacks
    def test_requests_in_flight_on_two_channels_get_their_own_answers_and_deliveries(self):
        left, right = yield defer.gatherResults([self.client.channel(), self.client.channel()])
        self.assertNotEqual(left.id, right.id)
        declared = yield defer.gatherResults([left.queue_declare("left-q"), right.queue_declare("right-q")])
        self.assertEqual([ok.queue for ok in declared], ["left-q", "right-q"])

        for number in range(2):
            left.basic_publish("", "left-q", b"L%d" % number)
            right.basic_publish("", "right-q", b"R%d" % number)
        gets = yield defer.gatherResults(
            [left.basic_get("left-q"), right.basic_get("right-q"), left.basic_get("left-q"), right.basic_get("right-q")]
        )
        self.assertEqual([got.body for got in gets], [b"L0", b"R0", b"L1", b"R1"])
        self.assertEqual([got.delivery_tag for got in gets], [1, 1, 2, 2])  # each channel numbers its own
        self.assertEqual([got.channel for got in gets], [left, right, left, right])

        left_received, right_received = DeliveryCollector(), DeliveryCollector()
        yield defer.gatherResults([
            left.basic_consume("left-q", left_received, consumer_tag="same-tag"),
            right.basic_consume("right-q", right_received, consumer_tag="same-tag"),
        ])
        for number in range(2, 8):
            right.basic_publish("", "right-q", b"R%d" % number)
            left.basic_publish("", "left-q", b"L%d" % number)
        yield defer.gatherResults([left_received.wait_for(6), right_received.wait_for(6)])

        self.assertEqual(left_received.bodies(), [b"L2", b"L3", b"L4", b"L5", b"L6", b"L7"])
        self.assertEqual(right_received.bodies(), [b"R2", b"R3", b"R4", b"R5", b"R6", b"R7"])
        self.assertTrue(all(d.channel is left for d in left_received.deliveries))
        self.assertTrue(all(d.channel is right for d in right_received.deliveries))
        self.assertEqual([d.delivery_tag for d in left_received.deliveries], [3, 4, 5, 6, 7, 8])
        self.assertEqual([d.delivery_tag for d in right_received.deliveries], [3, 4, 5, 6, 7, 8])
