"""Native protocol lifecycles: exclusive and auto-delete queues, redelivery, server cancels, big and many messages."""

import random

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.native.client import ChannelClosed
from tests.support.broker import DeliveryCollector, connect_client, listen_native, wait_until


class LifecycleTestCase(unittest.TestCase):
    """A broker listening on 127.0.0.1; clients are connected per test."""

    timeout = 60

    def setUp(self):
        self.broker, self.endpoint = listen_native(self)

    def connected_clients(self):
        return len(self.broker.connections)

    @defer.inlineCallbacks
    def open_channel(self):
        """A new connection's channel (the connection is closed at cleanup)."""
        client = yield connect_client(self, self.endpoint)
        channel = yield client.channel()
        return client, channel

    @defer.inlineCallbacks
    def assert_channel_error(self, request, reply_code, *words):
        """C{request} (a Deferred) fails with ChannelClosed C{reply_code} whose text has every word."""
        error = yield self.assertFailure(request, ChannelClosed)
        self.assertEqual(error.reply_code, reply_code, error.reply_text)
        for word in words:
            self.assertIn(word, error.reply_text)


class ExclusiveQueueTests(LifecycleTestCase):
    @defer.inlineCallbacks
    def test_exclusive_queue_is_locked_to_its_connection_and_deleted_when_it_disconnects(self):
        owner, owner_channel = yield self.open_channel()
        other, _ = yield self.open_channel()
        yield owner_channel.queue_declare("private", exclusive=True)
        owner_channel.basic_publish("", "private", b"for the owner only")
        got = yield owner_channel.basic_get("private", no_ack=True)
        self.assertEqual(got.body, b"for the owner only")

        attempts = {
            "declare": lambda channel: channel.queue_declare("private", exclusive=True),
            "passive declare": lambda channel: channel.queue_declare("private", passive=True),
            "consume": lambda channel: channel.basic_consume("private", DeliveryCollector()),
            "get": lambda channel: channel.basic_get("private"),
            "purge": lambda channel: channel.queue_purge("private"),
            "delete": lambda channel: channel.queue_delete("private"),
        }
        for name, attempt in attempts.items():
            channel = yield other.channel()
            error = yield self.assertFailure(attempt(channel), ChannelClosed)
            self.assertEqual(error.reply_code, 405, f"{name}: {error.reply_text}")
            self.assertIn("RESOURCE_LOCKED", error.reply_text)
            self.assertIn("private", error.reply_text)

        yield owner.close()
        yield wait_until(lambda: self.connected_clients() == 1)
        channel = yield other.channel()
        yield self.assert_channel_error(channel.queue_declare("private", passive=True), 404, "private")
        channel = yield other.channel()
        declared = yield channel.queue_declare("private", exclusive=True)  # free for anyone now
        self.assertEqual(declared.message_count, 0)


class AutoDeleteQueueTests(LifecycleTestCase):
    @defer.inlineCallbacks
    def test_auto_delete_queue_is_deleted_when_its_last_consumer_cancels(self):
        client, channel = yield self.open_channel()
        second_channel = yield client.channel()
        yield channel.queue_declare("scratch", auto_delete=True)
        first_tag = yield channel.basic_consume("scratch", DeliveryCollector(ack=True))
        second_tag = yield second_channel.basic_consume("scratch", DeliveryCollector(ack=True))

        yield channel.basic_cancel(first_tag)
        declared = yield channel.queue_declare("scratch", passive=True)
        self.assertEqual(declared.consumer_count, 1)

        yield second_channel.basic_cancel(second_tag)
        yield self.assert_channel_error(channel.queue_declare("scratch", passive=True), 404, "scratch")

    @defer.inlineCallbacks
    def test_auto_delete_queue_is_deleted_when_its_consumers_connection_closes(self):
        consumer, consumer_channel = yield self.open_channel()
        _, watcher = yield self.open_channel()
        yield consumer_channel.queue_declare("session", auto_delete=True)
        yield consumer_channel.basic_consume("session", DeliveryCollector())
        self.assertEqual((yield watcher.queue_declare("session", passive=True)).consumer_count, 1)

        yield consumer.close()
        yield wait_until(lambda: self.connected_clients() == 1)
        yield self.assert_channel_error(watcher.queue_declare("session", passive=True), 404, "session")


class RedeliveryTests(LifecycleTestCase):
    @defer.inlineCallbacks
    def test_unacked_messages_of_a_dropped_connection_go_to_another_consumer_marked_redelivered(self):
        doomed, doomed_channel = yield self.open_channel()
        _, survivor_channel = yield self.open_channel()
        yield survivor_channel.queue_declare("jobs")
        doomed_received = DeliveryCollector()
        yield doomed_channel.basic_consume("jobs", doomed_received)
        bodies = [b"job %d" % number for number in range(10)]
        for body in bodies:
            survivor_channel.basic_publish("", "jobs", body)
        yield doomed_received.wait_for(10)
        doomed_received.deliveries[0].ack()  # the only one it finished
        yield doomed_channel.queue_declare("jobs", passive=True)  # the ack has reached the broker

        survivor_received = DeliveryCollector()
        yield survivor_channel.basic_consume("jobs", survivor_received)
        self.assertEqual(survivor_received.deliveries, [])
        doomed.transport.abortConnection()  # no goodbye: the broker notices the drop

        yield survivor_received.wait_for(9)
        self.assertEqual(survivor_received.bodies(), bodies[1:])
        self.assertTrue(all(delivery.redelivered for delivery in survivor_received.deliveries))
        survivor_received.deliveries[-1].ack(multiple=True)
        declared = yield survivor_channel.queue_declare("jobs", passive=True)
        self.assertEqual((declared.message_count, declared.consumer_count), (0, 1))
        self.assertEqual(len(survivor_received.deliveries), 9)


class ServerCancelTests(LifecycleTestCase):
    @defer.inlineCallbacks
    def test_deleting_a_queue_cancels_its_consumers_and_tells_them(self):
        _, consumer_channel = yield self.open_channel()
        _, admin_channel = yield self.open_channel()
        yield admin_channel.queue_declare("doomed")
        cancelled = defer.Deferred()
        consumer_channel.on_cancel = cancelled.callback
        received = DeliveryCollector()
        yield consumer_channel.basic_qos(1)
        tag = yield consumer_channel.basic_consume("doomed", received)

        admin_channel.basic_publish("", "doomed", b"last words")
        yield received.wait_for(1)
        admin_channel.basic_publish("", "doomed", b"never delivered")  # stays ready: prefetch 1 is used up
        self.assertEqual((yield admin_channel.queue_delete("doomed")), 1)
        self.assertEqual((yield cancelled), tag)

        # The channel stays open and usable; a new queue of the same name has no consumer.
        declared = yield consumer_channel.queue_declare("doomed")
        self.assertEqual((declared.message_count, declared.consumer_count), (0, 0))
        self.assertEqual(received.bodies(), [b"last words"])


class BigAndManyMessagesTests(LifecycleTestCase):
    @defer.inlineCallbacks
    def assert_body_round_trips(self, size):
        _, channel = yield self.open_channel()
        body = random.Random(size).randbytes(size)
        yield channel.queue_declare("big")
        channel.basic_publish("", "big", body, properties={"content_type": "application/octet-stream"})
        got = yield channel.basic_get("big", no_ack=True)
        self.assertEqual(len(got.body), size)
        self.assertTrue(got.body == body, "the body came back changed")
        self.assertEqual(got.properties.content_type, "application/octet-stream")

        received = DeliveryCollector(ack=True)
        yield channel.basic_consume("big", received)
        channel.basic_publish("", "big", body[::-1])
        delivered = (yield received.wait_for(1, timeout=30))[0]
        self.assertEqual(len(delivered.body), size)
        self.assertTrue(delivered.body == body[::-1], "the delivered body came back changed")

    def test_one_mebibyte_body_round_trips_intact(self):
        return self.assert_body_round_trips(1024 * 1024)

    def test_sixteen_mebibyte_body_round_trips_intact(self):
        return self.assert_body_round_trips(16 * 1024 * 1024)

    @defer.inlineCallbacks
    def test_five_thousand_messages_are_consumed_once_each_in_publish_order(self):
        _, publisher = yield self.open_channel()
        _, consumer = yield self.open_channel()
        yield publisher.queue_declare("stream")
        received = DeliveryCollector(ack=True)
        yield consumer.basic_consume("stream", received)
        bodies = [b"message %05d" % number for number in range(5000)]
        for body in bodies:
            publisher.basic_publish("", "stream", body)

        yield received.wait_for(5000, timeout=30)
        self.assertEqual(received.bodies(), bodies)
        self.assertEqual([d.delivery_tag for d in received.deliveries], list(range(1, 5001)))
        declared = yield consumer.queue_declare("stream", passive=True)
        self.assertEqual((declared.message_count, declared.consumer_count), (0, 1))
        self.assertEqual(len(received.deliveries), 5000)  # nothing duplicated after the barrier
