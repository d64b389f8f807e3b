"""pika's Twisted adapter against a real ``twistd brokerd`` subprocess, the
connection's side: bodies split over the smallest frame size, an idle
connection kept alive by heartbeats, and channel errors, channel closes and
connection closes (an unacked delivery goes back to its queue).

Each test case class has its own broker, each test its own queue names
(L{tests.support.pika_twisted_clients}).
"""

import os

from pika import exceptions as pika_exceptions
from twisted.internet import defer, error

from tests.support.client_broker import first_difference
from tests.support.pika_twisted_clients import PikaTwistedTestCase, unique, within


class SmallFrameTests(PikaTwistedTestCase):
    """A broker offering the smallest frame_max: bodies span many frames both ways."""

    broker_arguments = ("--frame-max", "4096")

    @defer.inlineCallbacks
    def test_body_larger_than_the_frame_size_round_trips(self):
        channel = yield self.open_channel()
        queue = yield self.declare_queue(channel, "small-frames")
        body = os.urandom(1024 * 1024 + 17)
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, "", queue, body)
        queue_object, _ = yield within(channel.basic_consume(queue=queue, auto_ack=True), "basic.consume-ok")
        delivery = yield self.next_delivery(queue_object, "delivery of a 1 MiB message in 4 KiB frames")
        self.assertTrue(delivery.body == body, f"delivered body differs: {first_difference(body, delivery.body)}")


class HeartbeatTests(PikaTwistedTestCase):
    """A broker offering a one-second heartbeat."""

    broker_arguments = ("--heartbeat", "1")

    @defer.inlineCallbacks
    def test_idle_connection_is_kept_alive_by_heartbeats(self):
        connection = yield self.connect()
        channel = yield self.open_channel(connection)
        queue = yield self.declare_queue(channel, "heartbeat")
        # Several heartbeat timeouts pass with no traffic but heartbeats both ways.
        yield within(connection.wait_for_heartbeats(4), "four heartbeat frames from the broker")
        self.assertTrue(connection.is_open)
        self.assertFalse(connection.lost.called)
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, "", queue, b"still here")
        self.assertEqual((yield self.queue_counts(channel, queue)), (1, 0))


class ClosingTests(PikaTwistedTestCase):
    @defer.inlineCallbacks
    def test_channel_error_closes_only_that_channel(self):
        connection = yield self.connect()
        doomed = yield self.open_channel(connection)
        survivor = yield self.open_channel(connection)
        missing = unique("missing")

        failure = yield self.assertFailure(
            within(doomed.queue_declare(queue=missing, passive=True), "passive declare of a missing queue"),
            pika_exceptions.ChannelClosedByBroker,
        )
        self.assertEqual(failure.reply_code, 404)
        self.assertIn(missing, failure.reply_text)
        reason = yield within(doomed.on_closed, "channel closed by the broker")
        self.assertIsInstance(reason, pika_exceptions.ChannelClosedByBroker)
        self.assertTrue(doomed.is_closed)

        self.assertTrue(connection.is_open)
        queue = yield self.declare_queue(survivor, "survivor")
        yield within(survivor.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(survivor, "", queue, b"alive")
        got = yield within(survivor.basic_get(queue=queue, auto_ack=True), "basic.get-ok")
        self.assertEqual(got.body, b"alive")
        replacement = yield self.open_channel(connection)
        self.assertEqual((yield self.queue_counts(replacement, queue)), (0, 0))

    @defer.inlineCallbacks
    def test_closing_channel_and_connection_cleanly_requeues_unacked_delivery(self):
        connection = yield self.connect()
        channel = yield self.open_channel(connection)
        queue = yield self.declare_queue(channel, "close")
        yield within(channel.confirm_delivery(), "confirm.select-ok")
        yield self.publish_confirmed(channel, "", queue, b"unfinished")
        queue_object, _ = yield within(channel.basic_consume(queue=queue), "basic.consume-ok")
        held = yield self.next_delivery(queue_object, "delivery")
        self.assertFalse(held.method.redelivered)

        spare = yield self.open_channel(connection)
        spare.close(reply_code=200, reply_text="done with it")
        reason = yield within(spare.on_closed, "channel.close-ok")
        self.assertIsInstance(reason, pika_exceptions.ChannelClosedByClient)
        self.assertEqual((reason.reply_code, reason.reply_text), (200, "done with it"))
        self.assertTrue(channel.is_open)

        closed = connection.close()
        reason = yield within(closed, "connection.close-ok")
        # After close-ok the Twisted adapter reports how the socket ended: an orderly close.
        self.assertIsInstance(reason, (pika_exceptions.ConnectionClosedByClient, error.ConnectionDone))
        yield within(connection.lost, "TCP connection closed after connection.close-ok")
        self.assertTrue(connection.is_closed)
        self.assertTrue(channel.is_closed)

        other = yield self.open_channel()
        self.assertEqual((yield self.queue_counts(other, queue)), (1, 0))
        again = yield within(other.basic_get(queue=queue), "basic.get-ok of the requeued message")
        self.assertEqual(again.body, b"unfinished")
        self.assertTrue(again.method.redelivered)
