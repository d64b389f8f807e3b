"""The queue lifecycle rules through the native client against a real broker:
priorities, message TTLs, dead-lettering with x-death, reject-publish nacks,
x-delivery-count, alternate exchanges, delayed delivery and refused arguments. The same checks as
tests/interop/test_pika_lifecycle.py, so both protocols carry them alike."""

import datetime

from twisted.internet import defer, reactor, task

from brokerd.native.client import ChannelClosed, PublishNacked
from tests.support.broker import DeliveryCollector
from tests.support.native_protocol import NativeProtocolTestCase

WAIT = 5.0


class LifecycleRulesTestCase(NativeProtocolTestCase):

    @defer.inlineCallbacks
    def poll(self, check, what):
        """Calls C{check()} (a Deferred or a value) until it gives something true; fires with that."""
        deadline = reactor.seconds() + WAIT
        while True:
            result = yield check()
            if result:
                return result
            if reactor.seconds() > deadline:
                raise AssertionError(f"timed out after {WAIT} s waiting for {what}")
            yield task.deferLater(reactor, 0.02, lambda: None)

    @defer.inlineCallbacks
    def count(self, queue):
        declared = yield self.channel.queue_declare(queue, passive=True)
        return declared.message_count

    def wait_for_count(self, queue, count):
        return self.poll(lambda: self.count(queue).addCallback(lambda found: found == count), f"{count} in {queue}")

    def get_one(self, queue, no_ack=True):
        return self.poll(lambda: self.channel.basic_get(queue, no_ack=no_ack), f"a message in {queue}")

    @defer.inlineCallbacks
    def bodies(self, queue):
        bodies = []
        while (got := (yield self.channel.basic_get(queue, no_ack=True))) is not None:
            bodies.append(got.body)
        return bodies

    @defer.inlineCallbacks
    def dead_letter_queues(self, arguments=None):
        """A source queue dead-lettering through fanout "dlx" into "dead"."""
        yield self.channel.exchange_declare("dlx", "fanout")
        yield self.channel.queue_declare("dead")
        yield self.channel.queue_bind("dead", "dlx")
        yield self.channel.queue_declare("source", arguments={"x-dead-letter-exchange": "dlx", **(arguments or {})})

    def assert_death(self, delivery, reason, queue="source", exchange="", routing_keys=None, count=1):
        headers = delivery.headers
        first = headers["x-death"][0]
        self.assertEqual(
            (first["reason"], first["queue"], first["count"], first["exchange"], first["routing-keys"]),
            (reason, queue, count, exchange, routing_keys if routing_keys is not None else [queue]),
        )
        self.assertIsInstance(first["time"], datetime.datetime)
        self.assertEqual((headers["x-first-death-reason"], headers["x-first-death-queue"]), (reason, queue))
        self.assertEqual((headers["x-last-death-reason"], headers["x-last-death-queue"]), (reason, queue))
        return first


class PriorityAndTtlTests(LifecycleRulesTestCase):
    @defer.inlineCallbacks
    def test_priority_queue_delivers_highest_first_and_fifo_within_a_priority(self):
        yield self.channel.queue_declare("prio", arguments={"x-max-priority": 10})
        for index, priority in enumerate([1, 5, 9, 5, 1]):
            self.channel.basic_publish("", "prio", b"p%d-%d" % (priority, index), {"priority": priority})
        self.channel.basic_publish("", "prio", b"none")
        self.assertEqual((yield self.count("prio")), 6)
        collector = DeliveryCollector(ack=True)
        yield self.channel.basic_consume("prio", collector)
        yield collector.wait_for(6)
        self.assertEqual(collector.bodies(), [b"p9-2", b"p5-1", b"p5-3", b"p1-0", b"p1-4", b"none"])

    @defer.inlineCallbacks
    def test_queue_message_ttl_empties_the_queue(self):
        yield self.channel.queue_declare("ttl", arguments={"x-message-ttl": 200})
        published = reactor.seconds()
        self.channel.basic_publish("", "ttl", b"plain")
        self.channel.basic_publish("", "ttl", b"own ttl longer", {"expiration": "60000"})
        yield self.wait_for_count("ttl", 0)
        self.assertGreaterEqual(reactor.seconds() - published, 0.19)
        self.assertIsNone((yield self.channel.basic_get("ttl")))

    @defer.inlineCallbacks
    def test_expired_message_behind_a_longer_lived_head_leaves_on_time(self):
        yield self.channel.queue_declare("behind")
        self.channel.basic_publish("", "behind", b"head", {"expiration": "60000"})
        self.channel.basic_publish("", "behind", b"short", {"expiration": "100"})
        self.channel.basic_publish("", "behind", b"tail")
        yield self.wait_for_count("behind", 2)
        self.assertEqual((yield self.bodies("behind")), [b"head", b"tail"])


class DeadLetterTests(LifecycleRulesTestCase):
    @defer.inlineCallbacks
    def test_rejected(self):
        yield self.dead_letter_queues()
        yield self.channel.queue_bind("source", "amq.direct", "orders")
        self.channel.basic_publish("amq.direct", "orders", b"bad", {"message_id": "m-1", "headers": {"app": "kept"}})
        got = yield self.get_one("source", no_ack=False)
        got.reject(requeue=False)
        dead = yield self.get_one("dead")
        self.assertEqual((dead.body, dead.exchange, dead.routing_key), (b"bad", "dlx", "orders"))
        self.assertEqual((dead.properties.message_id, dead.headers["app"]), ("m-1", "kept"))
        self.assert_death(dead, "rejected", exchange="amq.direct", routing_keys=["orders"])

    @defer.inlineCallbacks
    def test_expired_keeps_the_original_expiration(self):
        yield self.dead_letter_queues()
        self.channel.basic_publish("", "source", b"late", {"expiration": "100"})
        dead = yield self.get_one("dead")
        self.assertEqual(self.assert_death(dead, "expired")["original-expiration"], "100")
        self.assertFalse(dead.properties.HasField("expiration"))
        self.assertEqual((yield self.count("source")), 0)

    @defer.inlineCallbacks
    def test_drop_head_overflow(self):
        yield self.dead_letter_queues({"x-max-length": 2})
        for body in (b"a", b"b", b"c"):
            self.channel.basic_publish("", "source", body)
        dead = yield self.get_one("dead")
        self.assertEqual(dead.body, b"a")
        self.assert_death(dead, "maxlen")
        self.assertEqual((yield self.bodies("source")), [b"b", b"c"])

    @defer.inlineCallbacks
    def test_delivery_limit(self):
        yield self.dead_letter_queues({"x-delivery-limit": 1})
        self.channel.basic_publish("", "source", b"poison")
        for _ in range(2):
            got = yield self.get_one("source", no_ack=False)
            got.nack(requeue=True)
        dead = yield self.get_one("dead")
        self.assertEqual(dead.body, b"poison")
        self.assert_death(dead, "delivery_limit")
        self.assertEqual((yield self.count("source")), 0)

    @defer.inlineCallbacks
    def test_second_death_for_the_same_reason_counts_up_the_first_entry(self):
        """As RabbitMQ does: the (queue, reason) entry keeps its first exchange, routing keys and time."""
        yield self.dead_letter_queues()
        yield self.channel.queue_bind("source", "dlx")
        self.channel.basic_publish("", "source", b"twice")
        for _ in range(2):
            got = yield self.get_one("source", no_ack=False)
            got.reject(requeue=False)
        first_copy = yield self.get_one("dead")
        second_copy = yield self.get_one("dead")
        self.assertEqual(len(second_copy.headers["x-death"]), 1, second_copy.headers["x-death"])
        death = self.assert_death(second_copy, "rejected", exchange="", count=2)
        self.assertEqual(death["time"], first_copy.headers["x-death"][0]["time"])
        self.assertEqual(second_copy.headers["x-last-death-exchange"], "dlx")


class PublishAndRedeliveryTests(LifecycleRulesTestCase):
    @defer.inlineCallbacks
    def test_reject_publish_nacks_a_publish_to_a_full_queue(self):
        yield self.channel.queue_declare("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        yield self.channel.confirm_select()
        yield self.channel.basic_publish("", "full", b"first")
        yield self.assertFailure(self.channel.basic_publish("", "full", b"second"), PublishNacked)
        self.assertEqual((yield self.bodies("full")), [b"first"])
        yield self.channel.basic_publish("", "full", b"third")

    @defer.inlineCallbacks
    def test_requeued_message_comes_back_with_x_delivery_count(self):
        yield self.channel.queue_declare("again")
        self.channel.basic_publish("", "again", b"again")
        seen = []
        for _ in range(3):
            got = yield self.get_one("again", no_ack=False)
            seen.append((got.redelivered, got.headers))
            got.nack(requeue=True)
        self.assertEqual(seen, [(False, {}), (True, {"x-delivery-count": 1}), (True, {"x-delivery-count": 2})])

    @defer.inlineCallbacks
    def test_alternate_exchange(self):
        returned = []
        self.channel.on_return = returned.append
        yield self.channel.exchange_declare("ae", "fanout")
        yield self.channel.queue_declare("caught")
        yield self.channel.queue_bind("caught", "ae")
        yield self.channel.exchange_declare("main", "direct", arguments={"alternate-exchange": "ae"})
        yield self.channel.exchange_declare("empty-ae", "direct")
        yield self.channel.exchange_declare("main2", "direct", arguments={"alternate-exchange": "empty-ae"})
        self.channel.basic_publish("main", "unknown", b"caught", mandatory=True)
        self.channel.basic_publish("main2", "unknown", b"lost", mandatory=True)
        got = yield self.get_one("caught")
        self.assertEqual((got.body, got.exchange, got.routing_key), (b"caught", "main", "unknown"))
        yield self.poll(lambda: returned, "the basic.return")
        self.assertEqual([(r.reply_code, r.exchange, r.body) for r in returned], [(312, "main2", b"lost")])

    @defer.inlineCallbacks
    def test_delayed_messages_arrive_in_due_order(self):
        yield self.channel.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        yield self.channel.queue_declare("due")
        yield self.channel.queue_bind("due", "later", "k")
        started = reactor.seconds()
        for body, delay in ((b"third", 600), (b"first", 200), (b"second", 400)):
            self.channel.basic_publish("later", "k", b"%s" % body, {"headers": {"x-delay": delay}})
        collector = DeliveryCollector(ack=True)
        yield self.channel.basic_consume("due", collector)
        yield collector.wait_for(3)
        self.assertEqual(collector.bodies(), [b"first", b"second", b"third"])
        self.assertGreaterEqual(reactor.seconds() - started, 0.6)

    @defer.inlineCallbacks
    def test_invalid_arguments_close_the_channel_with_406_naming_them(self):
        cases = [
            ({"x-max-priority": 300}, "x-max-priority"),
            ({"x-overflow": "nonsense"}, "x-overflow"),
            ({"x-message-ttl": -1}, "x-message-ttl"),
            ({"x-dead-letter-routing-key": "dead"}, "x-dead-letter-routing-key"),
        ]
        for arguments, named in cases:
            channel = yield self.client.channel()
            error = yield self.assertFailure(channel.queue_declare("bad", arguments=arguments), ChannelClosed)
            self.assertEqual(error.reply_code, 406, error.reply_text)
            self.assertIn(named, error.reply_text)
        channel = yield self.client.channel()
        error = yield self.assertFailure(channel.queue_declare("bad", passive=True), ChannelClosed)
        self.assertEqual(error.reply_code, 404)
        channel = yield self.client.channel()
        yield channel.queue_declare("good", arguments={"x-max-priority": 5})
        channel.basic_publish("", "good", b"still works")
        self.assertEqual((yield channel.basic_get("good", no_ack=True)).body, b"still works")
