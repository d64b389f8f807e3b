"""Logins, vhosts and permissions on the native protocol, as AMQP has them: the
real native client and command line against one broker process, RabbitMQ's
403 and 530 refusals and texts, a user limited to its prefix, UTF-8
passwords, user_id; and, in-process on a clock, a refused login answered
after the refusal delay and counted."""

import os
import shutil
import tempfile
import time

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.trial import unittest

from brokerd.access.database import AccessDatabase
from brokerd.access.login import LOGIN_REFUSAL_DELAY, AccessControl
from brokerd.native.client import ChannelClosed, ConnectionClosed, connect
from brokerd.native.server import NativeServerFactory
from brokerd.testing import BrokerProcess, native_cli
from tests.support.broker import decode_frames, make_broker, native_hello

UTF8_USER, UTF8_PASSWORD = "zoë", "pässwörd€"
ALICE_REFUSED = "ACCESS_REFUSED - access to queue 'bob.q' in vhost '/' refused for user 'alice'"


def make_access_database(data_dir):
    """guest (the first start's defaults), alice limited to ^alice\\. on /, a UTF-8 user, and a
    vhost only guest may use."""
    access = AccessDatabase.in_directory(data_dir)
    access.open()
    access.add_user("alice", "alice-pass")
    access.set_permissions("alice", "/", r"^alice\.", r"^alice\.", r"^alice\.")
    access.add_user(UTF8_USER, UTF8_PASSWORD)
    access.set_permissions(UTF8_USER, "/", ".*", ".*", ".*")
    access.add_vhost("other")
    access.set_permissions("guest", "other", ".*", ".*", ".*")
    return access


class NativeAccessTests(unittest.TestCase):
    """One broker process for the class, its access database made before it starts."""

    timeout = 30

    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="native-access-")
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
        """A client logged in with C{credentials}, closed at cleanup."""
        from twisted.internet import reactor

        client = yield connect(reactor, self.endpoint, **credentials)
        self.addCleanup(lambda: client.close() if client.close_reason is None else None)
        return client

    @defer.inlineCallbacks
    def refusal(self, **credentials):
        """The L{ConnectionClosed} a login with C{credentials} is refused with."""
        try:
            yield self.connected(**credentials)
        except ConnectionClosed as closed:
            return closed
        self.fail(f"the login with {credentials} was accepted")

    @defer.inlineCallbacks
    def test_guest_from_loopback_logs_in_with_the_defaults(self):
        client = yield self.connected()
        channel = yield client.channel()
        declared = yield channel.queue_declare("native.access.guest", auto_delete=True)
        self.assertEqual(declared.queue, "native.access.guest")

    @defer.inlineCallbacks
    def test_a_wrong_password_is_refused_with_rabbitmqs_403_after_the_refusal_delay(self):
        started = time.monotonic()
        closed = yield self.refusal(username="alice", password="wrong")
        self.assertEqual((closed.reply_code, closed.reply_text),
                         (403, "ACCESS_REFUSED - PLAIN login refused: user 'alice' - invalid credentials"))
        self.assertGreaterEqual(time.monotonic() - started, LOGIN_REFUSAL_DELAY * 0.9)
        unknown = yield self.refusal(username="mallory", password="")
        self.assertEqual(unknown.reply_text,
                         "ACCESS_REFUSED - PLAIN login refused: user 'mallory' - invalid credentials")

    @defer.inlineCallbacks
    def test_an_unknown_vhost_or_one_without_permissions_is_rabbitmqs_530(self):
        closed = yield self.refusal(vhost="nowhere")
        self.assertEqual((closed.reply_code, closed.reply_text), (530, "NOT_ALLOWED - vhost nowhere not found"))
        closed = yield self.refusal(username="alice", password="alice-pass", vhost="other")
        self.assertEqual((closed.reply_code, closed.reply_text),
                         (530, "NOT_ALLOWED - access to vhost 'other' refused for user 'alice'"))
        guest = yield self.connected(vhost="other")
        yield guest.channel()

    @defer.inlineCallbacks
    def test_a_user_limited_to_its_prefix_gets_403_for_other_queues_and_uses_its_own(self):
        alice = yield self.connected(username="alice", password="alice-pass")
        channel = yield alice.channel()
        with self.assertRaises(ChannelClosed) as refused:
            yield channel.queue_declare("bob.q")
        self.assertEqual((refused.exception.reply_code, refused.exception.reply_text), (403, ALICE_REFUSED))
        channel = yield alice.channel()
        yield channel.queue_declare("alice.q", auto_delete=True)
        yield channel.exchange_declare("alice.x", "direct", auto_delete=True)
        yield channel.queue_bind("alice.q", "alice.x", "k")
        yield channel.confirm_select()
        yield channel.basic_publish("alice.x", "k", b"mine", {"user_id": "alice"})
        got = yield channel.basic_get("alice.q", no_ack=True)
        self.assertEqual(got.body, b"mine")
        with self.assertRaises(ChannelClosed) as refused:
            yield channel.basic_publish("alice.x", "k", b"forged", {"user_id": "bob"})
        self.assertEqual((refused.exception.reply_code, refused.exception.reply_text),
                         (406, "PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user"
                               " was 'alice'"))

    @defer.inlineCallbacks
    def test_a_utf8_password_logs_in(self):
        client = yield self.connected(username=UTF8_USER, password=UTF8_PASSWORD)
        channel = yield client.channel()
        yield channel.queue_declare("native.access.zoë", auto_delete=True)

    def test_the_command_line_logs_in_from_flags_or_environment_and_a_refusal_is_one_line(self):
        refused = native_cli(self.endpoint, "--user", "alice", "--password", "nope", "declare", "queue", "alice.cli")
        self.assertEqual(refused.returncode, 1)
        self.assertEqual(refused.stderr, b"error: 403 ACCESS_REFUSED - PLAIN login refused: user 'alice'"
                                         b" - invalid credentials\n")
        os.environ.update(BROKERD_USER="alice", BROKERD_PASSWORD="alice-pass")
        try:
            declared = native_cli(self.endpoint, "declare", "queue", "alice.cli", "--auto-delete")
            forbidden = native_cli(self.endpoint, "declare", "queue", "bob.cli")
        finally:
            del os.environ["BROKERD_USER"], os.environ["BROKERD_PASSWORD"]
        self.assertEqual((declared.returncode, declared.stderr), (0, b""))
        self.assertEqual(forbidden.returncode, 1)
        self.assertIn(b"403 ACCESS_REFUSED - access to queue 'bob.cli' in vhost '/' refused for user 'alice'",
                      forbidden.stderr)


def test_a_refused_native_login_is_answered_after_the_refusal_delay_and_counted():
    """In-process on a clock: nothing is sent or read until the delay is over, then 403 and the socket closes."""
    broker, clock = make_broker()
    authenticator = AccessControl(AccessDatabase.in_memory())
    protocol = NativeServerFactory(broker, authenticator=authenticator).buildProtocol(None)
    wire = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
    protocol.makeConnection(wire)
    protocol.dataReceived(native_hello(username="guest", password="guessed") + native_hello())
    clock.advance(LOGIN_REFUSAL_DELAY * 0.99)
    assert wire.value() == b"" and broker.connections == set()
    clock.advance(LOGIN_REFUSAL_DELAY * 0.02)
    (close,) = decode_frames(wire.value())
    assert (close.connection_close.reply_code, close.connection_close.reply_text) == (
        403, "ACCESS_REFUSED - PLAIN login refused: user 'guest' - invalid credentials")
    assert wire.disconnecting
    assert authenticator.access.failed_logins == {"guest": 1}
    assert broker.connections == set()


def test_guest_from_afar_and_an_unknown_mechanism_are_refused_in_rabbitmqs_words():
    broker, clock = make_broker()
    factory = NativeServerFactory(broker, refusal_delay=0)
    replies = []
    for peer, hello in (("192.0.2.7", native_hello()), ("127.0.0.1", _hello_with_mechanism("KERBEROS"))):
        protocol = factory.buildProtocol(None)
        wire = StringTransport(peerAddress=IPv4Address("TCP", peer, 40000))
        protocol.makeConnection(wire)
        protocol.dataReceived(hello)
        clock.advance(0)
        (close,) = decode_frames(wire.value())
        replies.append((close.connection_close.reply_code, close.connection_close.reply_text))
    assert replies == [
        (403, "ACCESS_REFUSED - PLAIN login refused: user 'guest' can only connect via localhost"),
        (403, "ACCESS_REFUSED - unsupported authentication mechanism 'KERBEROS'; use one of PLAIN"),
    ]


def test_the_native_login_is_the_one_access_control_that_amqp_uses():
    from zope.interface.verify import verifyObject

    from brokerd.access.interfaces import IAccessControl
    from brokerd.amqp.auth import Authenticator

    for control in (AccessControl(), Authenticator()):
        assert verifyObject(IAccessControl, control)


def _hello_with_mechanism(mechanism):
    from brokerd.proto.native_pb2 import Envelope
    from tests.support.broker import encode_frame

    envelope = Envelope.FromString(native_hello()[4:])
    envelope.hello.mechanism = mechanism
    return encode_frame(envelope)
