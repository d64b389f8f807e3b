"""The format of a filelog queue file, and the walk that finds its records again.

A queue file starts with a header: ``QUEUE_MAGIC`` (which carries the format
version), the queue key it belongs to (``[u32 length]["vhost\\0name" in
UTF-8]``) and a CRC of all that. Records follow, each
``[u32 length][StoredMessage][u32 CRC]`` (big-endian).

A C{StoredMessage} always serializes its ``valid`` field first, so byte 0 of
it is the field tag 0x08 and byte 1 the flag: 0x01 valid, 0x00 acked. The CRC
covers the StoredMessage from byte 2 on, which lets an ack flip the flag in
place (one byte) without touching the CRC; the tag and the flag are checked on
their own instead.

A record whose flag is 0x02 holds no message but delivery counts: after the
tag and flag, ``[u32 count][count x u64 offset][count x u32 delivery count]``
(little-endian arrays), how often the message records at those offsets of the
same file came back to the queue unacked. Later ones win; compaction writes
one with the counts of the records it keeps, at their new offsets, so the
counts move with the records inside one atomic rename.

Opening a file reads no message body: L{walk} follows the length prefixes
and flags alone, checking the CRCs only of the records near the end of the
file, where a write cut short by a crash leaves its marks. The CRC of any
other record is checked when the record is read back.
"""

import struct
import zlib
from array import array
from typing import NamedTuple

from backends.common.checksum import crc32
from backends.common.message_heads import encode_head
from backends.common.fileio import little_endian_bytes, read_little_endian
from brokerd.proto.wire_format import varint

LENGTH = struct.Struct(">I")
HEADER_SIZE = LENGTH.size
TRAILER_SIZE = LENGTH.size
OVERHEAD = HEADER_SIZE + TRAILER_SIZE
VALID_TAG = 0x08
VALID = 0x01
ACKED = 0x00
RETURNS = 0x02  # the flag of a record of delivery counts
FLAGS = (VALID, ACKED, RETURNS)
FLAG_OFFSET = HEADER_SIZE + 1  # of the valid flag, from the start of a record
ACKED_FLAG = bytes([ACKED])
QUEUE_MAGIC = b"brokerd filelog queue 1\n"
BODY_TAG = bytes([5 << 3 | 2])  # StoredMessage.body: field 5, length-delimited
# At open, the records that start this close to the end have their CRCs checked.
TAIL_CHECK_BYTES = 32 << 10


def file_header(queue):
    """The header of the file of C{queue}, a C{(vhost, name)} key."""
    key = "\0".join(queue).encode("utf-8")
    body = QUEUE_MAGIC + LENGTH.pack(len(key)) + key
    return body + LENGTH.pack(zlib.crc32(body))


def queue_of_header(data):
    """The queue key the header at the start of C{data} names, or None if C{data} starts with no
    whole header."""
    start = len(QUEUE_MAGIC)
    if not data.startswith(QUEUE_MAGIC) or len(data) < start + LENGTH.size:
        return None
    (length,) = LENGTH.unpack_from(data, start)
    end = start + LENGTH.size + length
    if len(data) < end + LENGTH.size or zlib.crc32(data[:end]) != LENGTH.unpack_from(data, end)[0]:
        return None
    try:
        vhost, name = data[start + LENGTH.size : end].decode("utf-8").split("\0")
    except ValueError:
        return None
    return (vhost, name)


def encode(message, heads=None):
    """
    The StoredMessage of a published C{message}, valid, encoded in two parts:
    C{(head, body)}. The head holds every field but the body, then the body's
    tag and length; C{head + body} parses as the whole message (and is what
    C{SerializeToString} would give, unless published_at is set: that field
    comes after the body), without copying the body. C{heads}, a store's
    L{MessageHeads}, encodes the fields once for messages published alike.
    """
    head = heads.encode(message) if heads is not None else encode_head(message, valid=True)
    body = message.body
    if type(body) is not bytes:
        body = bytes(body)
    if body:
        head += BODY_TAG + varint(len(body))
    return head, body


def encode_returns(counts):
    """The payload of a delivery-counts record: C{counts} maps record offsets to counts."""
    offsets = sorted(counts)
    return b"".join((bytes([VALID_TAG, RETURNS]), LENGTH.pack(len(offsets)),
                     little_endian_bytes(array("Q", offsets)),
                     little_endian_bytes(array("I", (counts[offset] for offset in offsets)))))


def decode_returns(payload):
    """C{{record offset: delivery count}} of a delivery-counts record's payload."""
    (count,) = LENGTH.unpack_from(payload, 2)
    start = 2 + LENGTH.size
    if len(payload) != start + 12 * count:
        raise ValueError(f"a delivery-counts record of {count} entries is {len(payload)} bytes"
                         " long")
    offsets = read_little_endian("Q", payload, start, count)
    return dict(zip(offsets, read_little_endian("I", payload, start + 8 * count, count)))


def frame(head, body):
    """The header and trailer that make the encoded StoredMessage C{head + body} a record."""
    crc = crc32(body, zlib.crc32(memoryview(head)[2:]))
    return LENGTH.pack(len(head) + len(body)), LENGTH.pack(crc)


def record_problem(data, offset=0):
    """
    Why no sound record starts at C{offset} of C{data}, or None if one does.

    @param data: the bytes (or mmap) of a queue file, or of one record.
    @return: None, or a short text saying what is wrong.
    """
    available = len(data) - offset
    if available < OVERHEAD:
        return f"only {available} bytes are left, too few for a record"
    (length,) = LENGTH.unpack_from(data, offset)
    if OVERHEAD + length > available:
        return f"its length ({length} bytes) runs past the end of the file"
    if (length < 2 or data[offset + HEADER_SIZE] != VALID_TAG
            or data[offset + FLAG_OFFSET] not in FLAGS):
        return "it does not start with a valid flag"
    payload_end = offset + HEADER_SIZE + length
    (stored_crc,) = LENGTH.unpack_from(data, payload_end)
    if zlib.crc32(data[offset + FLAG_OFFSET + 1 : payload_end]) != stored_crc:
        return "its CRC does not match"
    return None


def record_size(data, offset):
    """The size of the (sound) record at C{offset}, framing included."""
    return OVERHEAD + LENGTH.unpack_from(data, offset)[0]


class Framing(NamedTuple):
    """What L{walk} found in a queue file, read by its framing alone."""

    offsets: array  # of the valid message records, in file order ("Q")
    sizes: array  # of the same records, framing included ("I")
    counts: list  # (offset, payload) of the records of delivery counts
    records: int  # how many whole records precede C{end}: valid, acked or of counts
    end: int  # where the walk stopped: the end of the file, or the first bad record
    problem: str | None  # why the record at C{end} is bad, if one is


def walk(data, start, check_from):
    """
    Walk the records of a queue file's contents by their length prefixes and
    flags, reading no message: only the records that start at or after
    C{check_from} (and the last one) have their CRCs checked.

    @param data: the whole file, as bytes or an mmap.
    @param start: where the first record starts (after the header).
    @return: a L{Framing}.
    """
    offsets, sizes, counts = array("Q"), array("I"), []
    add_offset, add_size, unpack = offsets.append, sizes.append, LENGTH.unpack_from
    size, offset, records, problem, last = len(data), start, 0, None, None
    while offset < size:
        if size - offset < OVERHEAD:
            problem = record_problem(data, offset)
            break
        length = unpack(data, offset)[0]
        following = offset + OVERHEAD + length
        flag = data[offset + FLAG_OFFSET]
        if (following > size or length < 2 or data[offset + HEADER_SIZE] != VALID_TAG
                or offset >= check_from):
            problem = record_problem(data, offset)
            if problem is not None:
                break
        if flag == VALID:
            add_offset(offset)
            add_size(following - offset)
        elif flag == RETURNS:
            counts.append((offset, bytes(data[offset + HEADER_SIZE : following - TRAILER_SIZE])))
        elif flag != ACKED:
            problem = record_problem(data, offset)
            break
        records += 1
        last = offset
        offset = following
    if problem is None and last is not None and last < check_from:
        problem = record_problem(data, last)
        if problem is not None:  # the last record, checked whatever its size: drop it again
            offset = last
            records -= 1
            if offsets and offsets[-1] == last:
                offsets.pop()
                sizes.pop()
            elif counts and counts[-1][0] == last:
                counts.pop()
    return Framing(offsets, sizes, counts, records, offset, problem)


def find_record(data, start):
    """The offset of the first sound record starting at or after C{start}, or None.

    Used only after damage, to tell a torn tail (nothing sound follows) from
    damage in the middle of a file; it jumps between candidate tag bytes."""
    tag = bytes([VALID_TAG])
    candidate = start + HEADER_SIZE
    while True:
        candidate = data.find(tag, candidate)
        if candidate < 0:
            return None
        if record_problem(data, candidate - HEADER_SIZE) is None:
            return candidate - HEADER_SIZE
        candidate += 1
