"""
The framing of HAProxy's PROXY protocol version 2 header: what a proxy sends before its
client's first byte to say who the client is (its address and port, and the address it
connected to), with optional type-length-value fields after.

Framing only: nothing here decides whether a header is to be believed (any peer can send
one); a listener that reads headers is given that decision (L{brokerd.wire.proxied_peer}).
Every length is checked before memory is taken: the declared length of what follows the
16 fixed bytes is refused past a cap, and every address block and field is checked against
the bytes the header holds.
"""

import socket
import struct
from dataclasses import dataclass

from twisted.internet.address import IPv4Address, IPv6Address

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
FIXED = struct.Struct(">12sBBH")  # signature, version and command, family and transport, length
FIXED_SIZE = FIXED.size
TLV_HEADER = struct.Struct(">BH")
VERSION_2_PROXY = 0x21  # version 2, command PROXY (0x20, LOCAL, names no client)
TCP_OVER_IPV4 = 0x11
TCP_OVER_IPV6 = 0x21
# Family byte -> (socket family, bytes of one address, Twisted's address type).
FAMILIES = {
    TCP_OVER_IPV4: (socket.AF_INET, 4, IPv4Address),
    TCP_OVER_IPV6: (socket.AF_INET6, 16, IPv6Address),
}
PORTS = struct.Struct(">HH")
DEFAULT_MAX_BODY = 512  # bytes after the fixed part a reader takes at most


class HeaderRefused(ValueError):
    """A header that is not framed as it should be, or not to be believed; says why."""


@dataclass(frozen=True)
class ProxyHeader:
    """
    A decoded header.

    @ivar source: the client's address (an C{IPv4Address} or C{IPv6Address}).
    @ivar destination: the address the client connected to, of the same type.
    @ivar fields: C{(type, value)} of every type-length-value field, in order.
    """

    source: object
    destination: object
    fields: tuple = ()


def may_start(data):
    """Whether C{data} is a header's beginning so far (it starts as L{SIGNATURE} does)."""
    head = data[:len(SIGNATURE)]
    return head == SIGNATURE[:len(head)]


def body_length(fixed, max_body=DEFAULT_MAX_BODY):
    """
    The length of what follows the C{FIXED_SIZE} bytes C{fixed} (a header's start), checked
    before it is read; raises L{HeaderRefused} naming what is wrong.
    """
    signature, command, family, length = FIXED.unpack(fixed[:FIXED_SIZE])
    if signature != SIGNATURE:
        raise HeaderRefused("it does not start with the PROXY protocol v2 signature")
    if command != VERSION_2_PROXY:
        raise HeaderRefused(f"version and command byte 0x{command:02x} is not 0x21"
                            " (version 2, PROXY)")
    if family not in FAMILIES:
        raise HeaderRefused(f"address family byte 0x{family:02x} is not TCP over IPv4 (0x11)"
                            " or IPv6 (0x21)")
    if length > max_body:
        raise HeaderRefused(f"it declares {length} bytes after its fixed part, more than"
                            f" {max_body}")
    return length


def decode(header, max_body=DEFAULT_MAX_BODY):
    """The L{ProxyHeader} of the whole header C{header}; raises L{HeaderRefused}."""
    if len(header) < FIXED_SIZE:
        raise HeaderRefused(f"it is {len(header)} bytes, fewer than its {FIXED_SIZE} fixed ones")
    length = body_length(header[:FIXED_SIZE], max_body)
    if len(header) != FIXED_SIZE + length:
        raise HeaderRefused(f"it is {len(header)} bytes, not the {FIXED_SIZE + length} it"
                            " declares")
    family, size, address_type = FAMILIES[header[13]]
    at = FIXED_SIZE + 2 * size + PORTS.size
    if at > len(header):
        raise HeaderRefused(f"its {length} bytes after the fixed part cannot hold two"
                            f" {size}-byte addresses and their ports")
    source = socket.inet_ntop(family, header[FIXED_SIZE:FIXED_SIZE + size])
    destination = socket.inet_ntop(family, header[FIXED_SIZE + size:FIXED_SIZE + 2 * size])
    source_port, destination_port = PORTS.unpack_from(header, FIXED_SIZE + 2 * size)
    fields = []
    while at < len(header):
        if at + TLV_HEADER.size > len(header):
            raise HeaderRefused("a field's type and length overrun the header")
        kind, size_of_value = TLV_HEADER.unpack_from(header, at)
        at += TLV_HEADER.size
        if at + size_of_value > len(header):
            raise HeaderRefused(f"field 0x{kind:02x} of {size_of_value} bytes overruns the"
                                " header")
        fields.append((kind, bytes(header[at:at + size_of_value])))
        at += size_of_value
    return ProxyHeader(address_type("TCP", source, source_port),
                       address_type("TCP", destination, destination_port), tuple(fields))


def field(kind, value):
    """One type-length-value field: C{kind} (0 to 255) and C{value} (bytes)."""
    return TLV_HEADER.pack(kind, len(value)) + value


def encode(source, destination, fields=b""):
    """
    A header naming C{source}, which connected to C{destination} (Twisted addresses of one IP
    family), followed by C{fields} (L{field}s, joined); ValueError for anything else.
    """
    family = _family(source)
    if family != _family(destination):
        raise ValueError(f"{source} and {destination} are not of one address family")
    socket_family = FAMILIES[family][0]
    addresses = (_packed(socket_family, source.host) + _packed(socket_family, destination.host)
                 + PORTS.pack(source.port, destination.port))
    body = addresses + fields
    return FIXED.pack(SIGNATURE, VERSION_2_PROXY, family, len(body)) + body


def _family(address):
    if isinstance(address, IPv4Address) and address.type == "TCP":
        return TCP_OVER_IPV4
    if isinstance(address, IPv6Address) and address.type == "TCP":
        return TCP_OVER_IPV6
    raise ValueError(f"{address} is not a TCP address over IPv4 or IPv6")


def _packed(family, host):
    # A link-local IPv6 address's scope (%eth0) means nothing to the header's reader.
    return socket.inet_pton(family, host.partition("%")[0])
