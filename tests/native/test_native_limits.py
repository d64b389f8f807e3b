"""Vhost and user limits hold on the native protocol as on AMQP, with the same codes and texts: the real native
client against a broker process whose access database holds the limits before it starts (so they are also
loaded from disk at start)."""

import os
import shutil
import tempfile

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.access.database import AccessDatabase
from brokerd.native.client import ChannelClosed, ConnectionClosed, connect
from brokerd.native.clientchannel import BrokerClosed
from brokerd.testing import BrokerProcess


def make_access_database(data_dir):
    """guest, a vhost "capped" holding one connection and one queue, a user "worker" holding two channels."""
    access = AccessDatabase.in_directory(data_dir)
    access.open()
    access.add_vhost("capped")
    access.set_permissions("guest", "capped", ".*", ".*", ".*")
    access.set_parameter("capped", "vhost-limits", "limits", {"max-connections": 1, "max-queues": 1})
    access.add_user("worker", "pw")
    access.set_permissions("worker", "/", ".*", ".*", ".*")
    access.set_user_limits("worker", {"max-channels": 2, "max-connections": 1})


class NativeLimitsTests(unittest.TestCase):
    timeout = 30

    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="native-limits-")
        data_dir = os.path.join(cls.directory, "data")
        make_access_database(data_dir)
        cls.process = BrokerProcess(["--backend=memory", "--data-dir", data_dir,
                                     "--native", "tcp:0:interface=127.0.0.1"], cwd=cls.directory)
        cls.endpoint = cls.process.wait_listening("native protocol")

    @classmethod
    def tearDownClass(cls):
        cls.process.stop()
        shutil.rmtree(cls.directory, ignore_errors=True)
        assert not any("Traceback" in line for line in cls.process.output), cls.process.tail()

    @defer.inlineCallbacks
    def connected(self, **credentials):
        from twisted.internet import reactor

        client = yield connect(reactor, self.endpoint, **credentials)
        self.addCleanup(lambda: client.close() if client.close_reason is None else None)
        return client

    @defer.inlineCallbacks
    def refusal(self, **credentials):
        try:
            yield self.connected(**credentials)
        except ConnectionClosed as closed:
            return closed
        self.fail(f"the login with {credentials} was accepted")

    @defer.inlineCallbacks
    def test_a_vhost_at_max_connections_refuses_the_next(self):
        yield self.connected(vhost="capped")
        closed = yield self.refusal(vhost="capped")
        self.assertEqual((closed.reply_code, closed.reply_text), (
            530, "NOT_ALLOWED - access to vhost 'capped' refused for user 'guest': connection limit (1) is reached"))

    @defer.inlineCallbacks
    def test_a_user_at_max_connections_is_refused(self):
        yield self.connected(username="worker", password="pw")
        closed = yield self.refusal(username="worker", password="pw")
        self.assertEqual((closed.reply_code, closed.reply_text), (
            530, "NOT_ALLOWED - connection refused for user 'worker': user connection limit (1) is reached"))

    @defer.inlineCallbacks
    def test_a_user_at_max_channels_has_its_connection_closed(self):
        client = yield self.connected(username="worker", password="pw")
        yield client.channel()
        yield client.channel()
        with self.assertRaises(BrokerClosed) as raised:  # the channel asked for fails with the connection's close
            yield client.channel()
        refusal = (530, "NOT_ALLOWED - number of channels opened for user 'worker' has reached the maximum allowed"
                        " user limit of (2)")
        self.assertEqual((raised.exception.reply_code, raised.exception.reply_text), refusal)
        yield client.closed
        self.assertEqual((client.close_reason.reply_code, client.close_reason.reply_text), refusal)

    @defer.inlineCallbacks
    def test_a_vhost_at_max_queues_refuses_a_new_queue(self):
        client = yield self.connected(vhost="capped")
        channel = yield client.channel()
        yield channel.queue_declare("only", auto_delete=False)
        yield channel.queue_declare("only", auto_delete=False)
        with self.assertRaises(ChannelClosed) as raised:
            yield channel.queue_declare("second")
        self.assertEqual((raised.exception.reply_code, raised.exception.reply_text), (
            406, "PRECONDITION_FAILED - cannot declare queue 'second': queue limit in vhost 'capped' (1) is reached"))
        channel = yield client.channel()
        yield channel.queue_delete("only")
