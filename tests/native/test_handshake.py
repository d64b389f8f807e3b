"""The native protocol's connection start, driven by a task.Clock over a StringTransport:
a client has HANDSHAKE_TIMEOUT seconds to say hello, frames are capped at 4096
bytes until it has, and the larger limit applies from hello on."""

import struct

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from zope.interface.verify import verifyObject

from brokerd.interfaces import IChannelPeer
from brokerd.native.handshake import IEnvelopeReader
from brokerd.native.server import PRE_HELLO_MAX_FRAME_SIZE, NativeServerFactory
from brokerd.proto.native_pb2 import Envelope
from brokerd.session.connection import HANDSHAKE_TIMEOUT
from brokerd.wire.refusal_log import REFUSAL_LOG_INTERVAL
from tests.support.broker import decode_frames, encode_frame, make_broker, native_hello


def connected(max_frame_size=1 << 20):
    broker, clock = make_broker()
    protocol = NativeServerFactory(broker, max_frame_size).buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))  # guest logs in from loopback
    protocol.makeConnection(transport)
    return protocol, transport, clock


def hello():
    return native_hello()


def test_the_protocol_provides_what_its_handshake_and_the_model_rely_on():
    protocol, transport, clock = connected()
    channel_open = Envelope(channel=1)
    channel_open.channel_open.SetInParent()
    protocol.dataReceived(hello() + encode_frame(channel_open))
    assert verifyObject(IEnvelopeReader, protocol)
    assert verifyObject(IChannelPeer, protocol.connection.channels[1].peer)


def test_a_connection_without_hello_is_dropped_after_the_handshake_timeout():
    protocol, transport, clock = connected()
    protocol.dataReceived(struct.pack(">I", 100) + b"partial hello")
    clock.advance(HANDSHAKE_TIMEOUT - 0.1)
    assert not transport.disconnecting
    clock.advance(0.1)
    assert transport.disconnecting
    protocol.connectionLost(None)
    assert protocol.watermark.queued_bytes == 0  # the partial frame it held is released


def test_hello_in_time_cancels_the_timeout():
    protocol, transport, clock = connected()
    protocol.dataReceived(hello())
    clock.advance(0)
    assert [envelope.WhichOneof("payload") for envelope in decode_frames(transport.value())] == ["hello_ok"]
    clock.advance(HANDSHAKE_TIMEOUT * 2)
    assert not transport.disconnecting


def test_a_large_frame_before_hello_is_refused_before_memory_is_taken():
    protocol, transport, clock = connected()
    protocol.dataReceived(struct.pack(">I", PRE_HELLO_MAX_FRAME_SIZE + 1) + b"x" * 100)
    clock.advance(0)
    (close,) = decode_frames(transport.value())
    assert close.connection_close.reply_code == 501
    assert close.connection_close.reply_text == (
        f"FRAME_ERROR - frame of {PRE_HELLO_MAX_FRAME_SIZE + 1} bytes is larger than the limit of"
        f" {PRE_HELLO_MAX_FRAME_SIZE} bytes before hello"
    )
    assert protocol.watermark.queued_bytes == 0


def test_after_hello_the_configured_frame_limit_applies_even_within_the_same_read():
    protocol, transport, clock = connected(max_frame_size=1 << 20)
    channel_open = Envelope(channel=1)
    channel_open.channel_open.SetInParent()
    protocol.dataReceived(hello() + encode_frame(channel_open) + struct.pack(">I", 8192) + b"\x0a" * 96)
    clock.advance(0)
    kinds = [envelope.WhichOneof("payload") for envelope in decode_frames(transport.value())]
    assert kinds == ["hello_ok", "ok"]  # the 8192-byte frame that follows is awaited, not refused
    assert not transport.disconnecting
    assert protocol.watermark.queued_bytes == 100  # what has come of it counts against the watermark


def test_clients_refused_before_hello_share_one_bounded_log():
    """A flood of native clients that never say hello (or send too large a first frame) writes
    one line, then one summary per interval, as AMQP's refusals before login do."""
    broker, clock = make_broker()
    factory = NativeServerFactory(broker)
    lines = []

    def observe(event):
        if event.get("log_namespace", "").startswith("brokerd.") and "native" in formatEvent(event):
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        for number in range(20):
            protocol = factory.buildProtocol(None)
            transport = StringTransport(peerAddress=IPv4Address("TCP", "192.0.2.9", 41000 + number))
            protocol.makeConnection(transport)
            protocol.dataReceived(struct.pack(">I", PRE_HELLO_MAX_FRAME_SIZE + 1))
            assert transport.disconnecting
            protocol.connectionLost(None)
        for number in range(20):
            protocol = factory.buildProtocol(None)
            protocol.makeConnection(StringTransport(peerAddress=IPv4Address("TCP", "192.0.2.10", 42000 + number)))
        clock.advance(HANDSHAKE_TIMEOUT)
        clock.advance(REFUSAL_LOG_INTERVAL)
        clock.advance(REFUSAL_LOG_INTERVAL)
    finally:
        globalLogPublisher.removeObserver(observe)
    assert len(lines) == 3, "\n".join(lines)
    assert "refused native client 192.0.2.9:41000 before hello: 501 FRAME_ERROR" in lines[0]
    assert "refused 19 more native clients before hello in the last 10 s, from 192.0.2.9 (19)" in lines[1]
    assert "refused 20 more native clients before hello in the last 10 s, from 192.0.2.10 (20)" in lines[2]
    assert "no hello within 10 s" in lines[2]
