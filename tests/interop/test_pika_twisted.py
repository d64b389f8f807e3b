"""pika's Twisted adapter against a real ``twistd brokerd`` subprocess.

TwistedProtocolConnection is connected with ClientCreator on 127.0.0.1; every
channel method returns a Deferred and consumers hand deliveries over through a
ClosableDeferredQueue. Each test case class has its own broker (started in
setUpClass), each test its own queue names; nothing waits on a clock except
the per-step timeouts that turn a hang into a failure naming the step.
"""

import os
import shutil
import tempfile

import pika
from pika import exceptions as pika_exceptions
from pika.adapters.twisted_connection import TwistedProtocolConnection
from twisted.internet import defer, error, protocol, reactor
from twisted.trial import unittest

from tests.interop.conftest import first_difference, logged_errors, start_broker, unique_names

STEP_TIMEOUT = 10.0  # seconds any one awaited broker event may take
TEN_MIB = 10 * 1024 * 1024
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

unique = unique_names("pika-twisted")


def within(d, what, seconds=STEP_TIMEOUT):
    """C{d}, failing with an AssertionError naming C{what} if it has not fired after C{seconds}."""

    def timed_out(failure):
        failure.trap(defer.TimeoutError)
        raise AssertionError(f"{what}: nothing within {seconds} s")

    return d.addTimeout(seconds, reactor).addErrback(timed_out)


class ClientConnection(TwistedProtocolConnection):
    """A TwistedProtocolConnection that also reports when its TCP connection is gone."""

    def __init__(self, parameters):
        super().__init__(parameters)
        self.lost = defer.Deferred()
        self.heartbeats_received = 0
        self._heartbeat_waiters = []  # (count, Deferred)

    def dataReceived(self, data):
        heartbeats = data.count(HEARTBEAT_FRAME)
        if heartbeats:
            self.heartbeats_received += heartbeats
            waiting, self._heartbeat_waiters = self._heartbeat_waiters, []
            for count, d in waiting:
                if self.heartbeats_received >= count:
                    d.callback(self.heartbeats_received)
                else:
                    self._heartbeat_waiters.append((count, d))
        super().dataReceived(data)

    def wait_for_heartbeats(self, count):
        """A Deferred firing once C{count} more heartbeat frames came from the broker."""
        d = defer.Deferred()
        self._heartbeat_waiters.append((self.heartbeats_received + count, d))
        return d

    def connectionLost(self, reason=protocol.connectionDone):
        super().connectionLost(reason)
        self.lost.callback(None)


class PikaTwistedTestCase(unittest.TestCase):
    """A broker subprocess per test case class; helpers to connect to it with pika."""

    timeout = 30
    broker_arguments = ()

    @classmethod
    def setUpClass(cls):
        cls._directory = tempfile.mkdtemp(prefix="brokerd-pika-twisted-")
        cls.broker = start_broker(cls._directory, *cls.broker_arguments)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.broker.process.stop()
        finally:
            shutil.rmtree(cls._directory, ignore_errors=True)

    def setUp(self):
        log_start = len(self.broker.process.output)
        self.addCleanup(self.assert_broker_logged_no_errors, log_start)

    def assert_broker_logged_no_errors(self, log_start):
        """The broker wrote no traceback and no failure while the test ran."""
        if logged_errors(self.broker.process, log_start):
            lines = self.broker.process.output[log_start:]
            self.fail("the broker logged errors during the test:\n" + "\n".join(lines))

    @defer.inlineCallbacks
    def connect(self):
        """A ready pika connection to the broker, closed (and waited for) at test cleanup."""
        parameters = pika.ConnectionParameters(
            host=self.broker.host,
            port=self.broker.amqp_port,
            virtual_host="/",
            credentials=pika.PlainCredentials("guest", "guest"),
        )
        creator = protocol.ClientCreator(reactor, ClientConnection, parameters)
        connection = yield within(
            creator.connectTCP(self.broker.host, self.broker.amqp_port, timeout=STEP_TIMEOUT), "TCP connect"
        )
        self.addCleanup(self.disconnect, connection)
        yield within(connection.ready, "AMQP handshake (connection.open-ok)")
        return connection

    def disconnect(self, connection):
        """Close C{connection} if it is still open; abort the socket if the close never completes."""
        if connection.lost.called:
            return None
        try:
            connection.close()
        except pika_exceptions.ConnectionWrongStateError:
            pass  # already closing
        abort = reactor.callLater(STEP_TIMEOUT, connection.transport.abortConnection)

        def gone(result):
            if abort.active():
                abort.cancel()
            return result

        return connection.lost.addBoth(gone)

    @defer.inlineCallbacks
    def open_channel(self, connection=None):
        """A channel on C{connection} (by default a new connection)."""
        if connection is None:
            connection = yield self.connect()
        channel = yield within(connection.channel(), "channel.open-ok")
        return channel

    @defer.inlineCallbacks
    def declare_queue(self, channel, prefix):
        """Declare a new, uniquely named queue; returns its name."""
        name = unique(prefix)
        frame = yield within(channel.queue_declare(queue=name), f"queue.declare-ok for {name}")
        self.assertEqual(
            (frame.method.queue, frame.method.message_count, frame.method.consumer_count), (name, 0, 0)
        )
        return name

    @defer.inlineCallbacks
    def queue_counts(self, channel, queue):
        """(ready messages, consumers) from a passive declare; also a barrier for what was sent before."""
        frame = yield within(channel.queue_declare(queue=queue, passive=True), f"passive queue.declare of {queue}")
        return frame.method.message_count, frame.method.consumer_count

    @defer.inlineCallbacks
    def publish_confirmed(self, channel, exchange, routing_key, *bodies, properties=None):
        """Publish each body on a channel in confirm mode and wait for all of the broker's acks."""
        confirms = [
            channel.basic_publish(exchange=exchange, routing_key=routing_key, body=body, properties=properties)
            for body in bodies
        ]
        acks = yield within(
            defer.gatherResults(confirms, consumeErrors=True), f"publisher confirms for {len(bodies)} messages"
        )
        for ack in acks:
            self.assertIsInstance(ack, pika.spec.Basic.Ack)
        return acks

    def next_delivery(self, queue_object, what="a delivery"):
        return within(queue_object.get(), what)


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
