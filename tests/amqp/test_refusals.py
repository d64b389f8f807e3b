"""Refusals before login on a driven clock: the delay before a refused client
hears of it, nothing read meanwhile, and the log kept to one line per interval
however many clients are refused."""


from pamqp import commands
from pamqp import frame as pamqp_frame
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from brokerd.access.login import LOGIN_REFUSAL_DELAY
from brokerd.amqp.server import AmqpServerProtocol
from brokerd.amqp.settings import AmqpSettings
from brokerd.session.connection import HANDSHAKE_TIMEOUT
from brokerd.wire.refusal_log import REFUSAL_LOG_INTERVAL
from tests.support.broker import amqp_frames_in, make_broker

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def start_ok(password):
    return pamqp_frame.marshal(
        commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response=f"\0guest\0{password}"), 0
    )


class RefusalTests(unittest.SynchronousTestCase):
    def setUp(self):
        self.broker, self.clock = make_broker()
        self.settings = AmqpSettings()
        self.lines = []

        def observe(event):
            if event.get("log_namespace") in ("brokerd.amqp.handshake", "brokerd.wire.refusal_log"):
                self.lines.append(formatEvent(event))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)

    def connect(self, host="127.0.0.1", port=40000):
        protocol = AmqpServerProtocol(self.broker, self.settings)
        transport = StringTransport(peerAddress=IPv4Address("TCP", host, port))
        protocol.makeConnection(transport)
        protocol.dataReceived(PROTOCOL_HEADER)
        self.clock.advance(0)
        transport.clear()  # connection.start
        return protocol, transport

    def test_a_wrong_password_is_answered_only_after_the_delay_and_nothing_is_read_meanwhile(self):
        protocol, transport = self.connect()

        protocol.dataReceived(start_ok("wrong"))
        self.clock.advance(LOGIN_REFUSAL_DELAY * 0.99)
        self.assertEqual(transport.value(), b"")
        protocol.dataReceived(b"\x01\x00\x00\xff\xff\xff\xff" + b"junk that is never parsed")
        self.clock.advance(LOGIN_REFUSAL_DELAY * 0.02)

        (close,) = amqp_frames_in(transport.value())
        self.assertIsInstance(close, commands.Connection.Close)
        self.assertEqual(close.reply_code, 403)
        self.assertFalse(transport.disconnecting)
        protocol.dataReceived(pamqp_frame.marshal(commands.Connection.CloseOk(), 0))
        self.clock.advance(0)
        self.assertTrue(transport.disconnecting)

    def test_a_malformed_frame_before_login_is_answered_after_the_delay(self):
        protocol, transport = self.connect()

        protocol.dataReceived(b"\x01\x00\x00\x00\x00\x20\x00")  # a method frame of 8 KB, over 4096 before tune-ok
        self.clock.advance(LOGIN_REFUSAL_DELAY * 0.99)
        self.assertEqual(transport.value(), b"")
        self.clock.advance(LOGIN_REFUSAL_DELAY * 0.02)

        (close,) = amqp_frames_in(transport.value())
        self.assertEqual(close.reply_code, 501)
        self.assertIn("4096", close.reply_text)

    def test_a_client_gone_during_the_delay_leaves_no_call_behind(self):
        protocol, transport = self.connect()
        protocol.dataReceived(start_ok("wrong"))

        protocol.connectionLost(None)

        summarise = self.settings.refusal_log._summarise
        self.assertEqual([call for call in self.clock.getDelayedCalls() if call.func != summarise], [])

    def test_refusals_are_logged_once_then_summarised_once_per_interval(self):
        for number in range(30):
            protocol, _ = self.connect("192.0.2.7" if number % 3 else "198.51.100.1", 40000 + number)
            protocol.dataReceived(start_ok(f"guess{number}"))
        self.clock.advance(LOGIN_REFUSAL_DELAY)
        self.assertEqual(len(self.lines), 1, self.lines)
        self.assertIn("198.51.100.1:40000", self.lines[0])
        self.assertIn("403 ACCESS_REFUSED", self.lines[0])

        self.clock.advance(REFUSAL_LOG_INTERVAL)
        self.assertEqual(len(self.lines), 2, self.lines)
        self.assertIn("refused 29 more", self.lines[1])
        self.assertIn("192.0.2.7 (20)", self.lines[1])
        self.assertIn("198.51.100.1 (9)", self.lines[1])

        self.clock.advance(REFUSAL_LOG_INTERVAL * 3)
        self.assertEqual(len(self.lines), 2, "summaries without refusals")
        protocol, _ = self.connect("203.0.113.5")
        protocol.dataReceived(start_ok("again"))
        self.assertEqual(len(self.lines), 3)
        self.assertIn("203.0.113.5", self.lines[2])

    def test_wrong_protocol_headers_and_silent_strangers_share_the_bounded_log(self):
        for number in range(20):
            protocol = AmqpServerProtocol(self.broker, self.settings)
            protocol.makeConnection(StringTransport(peerAddress=IPv4Address("TCP", "192.0.2.9", 41000 + number)))
            protocol.dataReceived(b"GET / HTTP/1.1\r\n\r\n")
        for number in range(20):
            self.connect("192.0.2.10", 42000 + number)  # then says nothing
        self.clock.advance(HANDSHAKE_TIMEOUT)
        self.clock.advance(REFUSAL_LOG_INTERVAL)

        self.assertEqual(len(self.lines), 3, self.lines)
        self.assertIn("protocol header b'GET / HT' is not AMQP 0-9-1", self.lines[0])
        self.assertIn("refused 19 more", self.lines[1])
        self.assertIn("refused 20 more", self.lines[2])
        self.assertIn("192.0.2.10 (20)", self.lines[2])
        self.assertIn("no login within 10 s", self.lines[2])
