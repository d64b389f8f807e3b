"""A native-protocol server on a StringTransport and a task.Clock (L{NativeProtocolTestCase}), for
the native adapter's in-process tests."""

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.native.client import ChannelClosed
from tests.support.broker import connect_client, listen_native


class NativeProtocolTestCase(unittest.TestCase):
    """A broker listening on 127.0.0.1 and one connected client with one open channel."""

    timeout = 30

    @defer.inlineCallbacks
    def setUp(self):
        self.broker, self.endpoint = listen_native(self)
        self.client = yield connect_client(self, self.endpoint)
        self.channel = yield self.client.channel()

    @defer.inlineCallbacks
    def queue_counts(self, queue):
        """(ready messages, consumers) of C{queue}; also a barrier for everything sent before."""
        declared = yield self.channel.queue_declare(queue, passive=True)
        return declared.message_count, declared.consumer_count

    @defer.inlineCallbacks
    def assert_queue_missing(self, queue):
        """A passive declare of C{queue} on a fresh channel fails with 404 naming it."""
        probe = yield self.client.channel()
        error = yield self.assertFailure(probe.queue_declare(queue, passive=True), ChannelClosed)
        self.assertEqual(error.reply_code, 404)
        self.assertIn(queue, error.reply_text)
