"""Crash-test message bodies, each carrying its own id and a CRC-32, and their ids as text.

Shared by the client that publishes and consumes them and by the checks after
a restart, with the properties every such message is published with.
"""

import struct
import zlib

from brokerd.loadgen.amqp_codec import short_string

MAGIC = b"CRSH"
BODY_HEAD = struct.Struct(">4sIHQI")  # magic, run, publisher, sequence, payload length
CHECKSUM = struct.Struct(">I")
CONTENT_TYPE = "application/x-brokerd-crash"
# Property flags: content-type (bit 15) and delivery-mode (bit 12) present; mode 2 = persistent.
PERSISTENT_PROPERTIES = struct.pack(">H", 0x9000) + short_string(CONTENT_TYPE) + b"\x02"
MARKER_PUBLISHER = 0xFFFF  # the publisher number in the id of consumer markers


class CorruptBody(ValueError):
    """A body that is not one L{make_body} built, or whose checksum does not match."""


def make_body(run, publisher, sequence, payload):
    """A body naming message C{(run, publisher, sequence)}, carrying C{payload}, ending in a CRC-32."""
    head = BODY_HEAD.pack(MAGIC, run, publisher, sequence, len(payload))
    return head + payload + CHECKSUM.pack(zlib.crc32(payload, zlib.crc32(head)))


def parse_body(body):
    """The C{(run, publisher, sequence)} id of a L{make_body} body; raises L{CorruptBody} if damaged."""
    if len(body) < BODY_HEAD.size + CHECKSUM.size:
        raise CorruptBody(f"body of {len(body)} bytes is shorter than the id and checksum")
    magic, run, publisher, sequence, length = BODY_HEAD.unpack_from(body)
    if magic != MAGIC:
        raise CorruptBody(f"body starts with {bytes(body[:4])!r}, not {MAGIC!r}")
    if len(body) != BODY_HEAD.size + length + CHECKSUM.size:
        raise CorruptBody(
            f"message {run}:{publisher}:{sequence}: body of {len(body)} bytes, its header says"
            f" {BODY_HEAD.size + length + CHECKSUM.size}"
        )
    (expected,) = CHECKSUM.unpack_from(body, len(body) - CHECKSUM.size)
    actual = zlib.crc32(memoryview(body)[: len(body) - CHECKSUM.size])
    if actual != expected:
        raise CorruptBody(f"message {run}:{publisher}:{sequence}: CRC-32 {actual:#010x}, body says {expected:#010x}")
    return run, publisher, sequence


def payload_size(rng):
    """Mostly small bodies, some of a few KiB, and a few spanning several 128 KiB frames."""
    draw = rng.random()
    if draw < 0.05:
        return rng.randint(64 * 1024, 320 * 1024)
    if draw < 0.20:
        return rng.randint(1024, 16 * 1024)
    return rng.randint(0, 400)


def check_properties(properties):
    """None if C{properties} are the ones every crash-test message is published with, else what differs."""
    if properties == PERSISTENT_PROPERTIES:
        return None
    return f"content properties {properties!r}, published as {PERSISTENT_PROPERTIES!r}"


def format_id(message_id):
    return "%d:%d:%d" % message_id


def parse_id(text):
    run, publisher, sequence = text.split(":")
    return int(run), int(publisher), int(sequence)
