"""The PROXY protocol v2 header's framing: what brokerd writes is what HAProxy's protocol says (Twisted's own reader
of it agrees, on a real socket), and every malformed header is refused naming what is wrong, its declared length
from its fixed bytes alone."""

import struct

import pytest
from twisted.internet import defer, protocol, reactor
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.protocols.haproxy import proxyEndpoint
from twisted.trial import unittest

from brokerd.wire import proxy_header
from brokerd.wire.proxy_header import FIXED_SIZE, SIGNATURE, HeaderRefused, body_length, decode, encode, field

CLIENT = IPv4Address("TCP", "203.0.113.7", 40123)
LISTENER = IPv4Address("TCP", "192.0.2.2", 5672)


def test_a_header_decodes_to_the_addresses_and_fields_it_was_made_of():
    fields = field(0xE0, b"proof") + field(0x01, b"")
    header = encode(CLIENT, LISTENER, fields)
    decoded = decode(header)
    assert (decoded.source, decoded.destination) == (CLIENT, LISTENER)
    assert decoded.fields == ((0xE0, b"proof"), (0x01, b""))
    assert header[:FIXED_SIZE] == SIGNATURE + bytes([0x21, 0x11]) + struct.pack(">H", 12 + len(fields))


def test_ipv6_addresses_are_framed_as_tcp_over_ipv6_and_a_scope_is_left_out():
    header = encode(IPv6Address("TCP", "2001:db8::7", 40123), IPv6Address("TCP", "fe80::1%eth0", 5672))
    assert header[13] == 0x21 and len(header) == FIXED_SIZE + 36
    decoded = decode(header)
    assert (decoded.source.host, decoded.source.port) == ("2001:db8::7", 40123)
    assert (decoded.destination.host, decoded.destination.port) == ("fe80::1", 5672)


@pytest.mark.parametrize("source, destination", [
    (CLIENT, IPv6Address("TCP", "::1", 5672)),
    (UNIXAddress("/tmp/socket"), UNIXAddress("/tmp/socket")),
    (IPv4Address("UDP", "127.0.0.1", 1), IPv4Address("UDP", "127.0.0.1", 2)),
])
def test_only_tcp_addresses_of_one_ip_family_are_framed(source, destination):
    with pytest.raises(ValueError):
        encode(source, destination)


@pytest.mark.parametrize("fixed, reason", [
    (b"\r\n\r\n\x00\r\nQUIX\n" + bytes([0x21, 0x11, 0, 12]), "signature"),
    (SIGNATURE + bytes([0x20, 0x11, 0, 12]), "0x20 is not 0x21"),  # LOCAL: names no client
    (SIGNATURE + bytes([0x11, 0x11, 0, 12]), "0x11 is not 0x21"),
    (SIGNATURE + bytes([0x21, 0x31, 0, 216]), "family byte 0x31"),  # UNIX
    (SIGNATURE + bytes([0x21, 0x12, 0, 12]), "family byte 0x12"),  # UDP
    (SIGNATURE + bytes([0x21, 0x11, 0xFF, 0xFF]), "declares 65535 bytes after its fixed part, more than 512"),
])
def test_a_fixed_part_is_refused_before_what_follows_is_read(fixed, reason):
    with pytest.raises(HeaderRefused, match=reason):
        body_length(fixed)


def test_a_cap_may_be_given_for_the_declared_length():
    fixed = encode(CLIENT, LISTENER, field(0xE0, bytes(600)))[:FIXED_SIZE]
    assert body_length(fixed, max_body=700) == 12 + 3 + 600
    with pytest.raises(HeaderRefused, match="more than 512"):
        body_length(fixed)


@pytest.mark.parametrize("header, reason", [
    (SIGNATURE + bytes([0x21, 0x11]), "fewer than its 16 fixed ones"),
    (encode(CLIENT, LISTENER)[:-1], "not the 28 it declares"),
    (encode(CLIENT, LISTENER) + b"x", "not the 28 it declares"),
    (SIGNATURE + bytes([0x21, 0x11, 0, 8]) + bytes(8), "cannot hold two 4-byte addresses"),
    (SIGNATURE + bytes([0x21, 0x11, 0, 14]) + bytes(12) + b"\xe0\x00", "type and length overrun"),
    (SIGNATURE + bytes([0x21, 0x11, 0, 17]) + bytes(12) + b"\xe0\x00\x09ab", "field 0xe0 of 9 bytes overruns"),
])
def test_a_malformed_header_is_refused_naming_what_is_wrong(header, reason):
    with pytest.raises(HeaderRefused, match=reason):
        decode(header)


def test_a_header_starts_with_the_signature_however_little_of_it_came():
    assert all(proxy_header.may_start(SIGNATURE[:size]) for size in range(len(SIGNATURE) + 1))
    assert proxy_header.may_start(SIGNATURE + b"anything after")
    assert not proxy_header.may_start(b"AMQP\x00\x00\x09\x01")
    assert not proxy_header.may_start(b"GET / HTTP/1.1")
    assert not proxy_header.may_start(SIGNATURE[:5] + b"x")


class Peers(protocol.Protocol):
    """Says what its transport tells of both ends once it has the first bytes."""

    def __init__(self, answered):
        self.answered = answered

    def dataReceived(self, data):
        if not self.answered.called:
            self.answered.callback((self.transport.getPeer(), self.transport.getHost(), data))


class HAProxyReaderTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_twisteds_reader_of_haproxys_protocol_reads_the_header_as_brokerd_made_it(self):
        answered = defer.Deferred()
        endpoint = proxyEndpoint(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"))
        port = yield endpoint.listen(protocol.Factory.forProtocol(lambda: Peers(answered)))
        self.addCleanup(port.stopListening)
        client = yield TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port).connect(
            protocol.Factory.forProtocol(protocol.Protocol))
        self.addCleanup(client.transport.abortConnection)
        client.transport.write(encode(CLIENT, LISTENER, field(0xE0, b"proof")) + b"first bytes")
        peer, host, data = yield answered.addTimeout(10, reactor)
        self.assertEqual((peer.host, peer.port, host.host, host.port, data),
                         (CLIENT.host, CLIENT.port, LISTENER.host, LISTENER.port, b"first bytes"))
