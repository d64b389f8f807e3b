"""Direct reply-to over the native protocol, through the real client and a real socket:
the same rule as AMQP's (it lives in the channel), with the same refusals."""

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.native.client import ChannelClosed
from tests.support.broker import DeliveryCollector, connect_client, listen_native

REPLY_TO = "amq.rabbitmq.reply-to"


class NativeDirectReplyToTests(unittest.TestCase):
    timeout = 30

    @defer.inlineCallbacks
    def setUp(self):
        self.broker, self.endpoint = listen_native(self)
        self.client = yield connect_client(self, self.endpoint)

    @defer.inlineCallbacks
    def test_rpc_round_trip_between_two_connections(self):
        server = yield (yield connect_client(self, self.endpoint)).channel()
        yield server.queue_declare("rpc")
        seen = []

        def answer(request):
            seen.append(request.properties.reply_to)
            server.basic_publish("", request.properties.reply_to, request.body.upper(),
                                 {"correlation_id": request.properties.correlation_id})
            request.ack()

        yield server.basic_consume("rpc", answer)
        channel = yield self.client.channel()
        replies = DeliveryCollector()
        tag = yield channel.basic_consume(REPLY_TO, replies, no_ack=True)
        channel.basic_publish("", "rpc", b"ping", {"reply_to": REPLY_TO, "correlation_id": "c1"})
        [reply] = yield replies.wait_for(1)
        self.assertEqual((reply.body, reply.properties.correlation_id, reply.consumer_tag, reply.redelivered),
                         (b"PING", "c1", tag, False))
        self.assertTrue(seen[0].startswith(REPLY_TO + "."))
        self.assertEqual((reply.exchange, reply.routing_key), ("", seen[0]))
        declared = yield server.queue_declare(seen[0], passive=True)
        self.assertEqual((declared.message_count, declared.consumer_count), (0, 1))

    @defer.inlineCallbacks
    def test_a_reply_consumer_must_be_no_ack(self):
        channel = yield self.client.channel()
        error = yield self.assertFailure(channel.basic_consume(REPLY_TO, lambda delivery: None), ChannelClosed)
        self.assertEqual((error.reply_code, error.reply_text),
                         (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge"))

    @defer.inlineCallbacks
    def test_reply_to_without_a_reply_consumer_is_refused(self):
        channel = yield self.client.channel()
        yield channel.queue_declare("requests")
        channel.basic_publish("", "requests", b"ping", {"reply_to": REPLY_TO})
        error = yield self.assertFailure(channel.queue_declare("requests", passive=True), ChannelClosed)
        self.assertEqual((error.reply_code, error.reply_text),
                         (406, "PRECONDITION_FAILED - fast reply consumer does not exist"))
