"""What the pika Twisted-adapter modules share: L{PikaTwistedTestCase}, a
trial case class with its own broker subprocess (started in setUpClass) and
helpers to connect, open channels, declare queues and publish with confirms
through pika's TwistedProtocolConnection; L{ClientConnection}, which also
counts the broker's heartbeats and reports when its TCP connection is gone;
and L{within}, the per-step timeout that turns a hang into a failure naming
the step (nothing else waits on a clock).
"""

import shutil
import tempfile

import pika
from pika import exceptions as pika_exceptions
from pika.adapters.twisted_connection import TwistedProtocolConnection
from twisted.internet import defer, protocol, reactor
from twisted.trial import unittest

from tests.support.client_broker import logged_errors, start_broker, unique_names

STEP_TIMEOUT = 10.0  # seconds any one awaited broker event may take
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

