"""The on-disk formats of the chunked store (EQueue's design), as values.

Message log: chunk files ``message-chunk-NNNNNNNNN``, each a block of header,
a data area of ``data_size`` bytes (a whole number of blocks) and, once the
chunk is full, a block of footer; until then that block holds the chunk's
progress: the bytes and records of it that an earlier fsync made durable.
A global position ``p`` lives in chunk ``p // data_size`` at data offset
``p % data_size``. A record is::

    [u32 length][u8 kind][u32 head length][head][body][u32 CRC][u32 length]

where ``length`` counts kind, head length, head and body, and the CRC covers
the same bytes; the length after the record lets a reader walk backwards. The
head is a C{StoredMessage} without its body, so reading a body is one slice.
A length of zero marks unwritten (zero-filled) space.

Queue index: chunk files ``index-chunk-NNNNNNNNN`` of fixed 16-byte entries,
``[u64 position + 1][u32 body length][u32 CRC of the 12 bytes before]``
(little-endian); entry N lives at ``HEADER_SIZE + (N % per chunk) * 16``, an
all-zero entry marks unwritten space.

Every file starts with a header carrying a magic, a format version and a CRC.
"""

import os
import struct
import sys
import zlib
from array import array
from operator import itemgetter

from backends.common.checksum import crc32
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2

VERSION = 1
MESSAGE_CHUNK = 1
INDEX_CHUNK = 2
CHUNK_MAGIC = b"brokerd chunk\0\0\0"
FOOTER_MAGIC = b"brokerd chunkend"
PROGRESS_MAGIC = b"brokerd chunkpos"

# magic, version, kind, chunk number, global start, data size, CRC of the bytes before it
HEADER = struct.Struct(">16sIIQQQI")
HEADER_SIZE = 4096  # a whole block, so that the data area is block-aligned for direct writes
# magic, bytes of records, number of records, CRC of the bytes before it
FOOTER = struct.Struct(">16sQQI")
FOOTER_SIZE = 4096
BLOCK_SIZE = 4096  # a message chunk's data size is a multiple of it

RECORD_HEAD = struct.Struct(">IBI")  # length, kind, head length
RECORD_TAIL = struct.Struct(">II")  # CRC, length
RECORD_OVERHEAD = RECORD_HEAD.size + RECORD_TAIL.size
MESSAGE_RECORD = 1
LENGTH = struct.Struct(">I")

INDEX_ENTRY = struct.Struct("<QII")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size
INDEX_KEY = struct.Struct("<QI")
LENGTH_LE = struct.Struct("<I")

HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


class FormatError(Exception):
    """Bytes that are not what the format says should be there; the text says how."""


# -- handles and message ids


def position_of(handle):
    """A message's handle is its record's global position in the log: a position can grow past
    2**64 only after exabytes, so a handle fits the u64 arrays that hold queues of them."""
    return handle


def message_id(handle):
    """The id that names a stored message: its global position in 16 hex digits."""
    return f"{handle:016x}"


def handle_of_message_id(text):
    """The handle a L{message_id} names; ValueError if C{text} is not one."""
    if (not isinstance(text, str) or len(text) != 16
            or not all(digit in HEX_DIGITS for digit in text)):
        raise ValueError(f"{text!r} is not a chunked message id (16 hex digits)")
    return int(text, 16)


# -- chunk headers and footers


def chunk_file_name(prefix, number):
    return f"{prefix}-{number:09d}"


def chunk_numbers(directory, prefix):
    """The numbers of the chunk files named C{prefix-NNNNNNNNN} in C{directory}, in order."""
    start = len(prefix) + 1
    return sorted(
        int(name[start:]) for name in os.listdir(directory)
        if name.startswith(prefix + "-") and name[start:].isdigit()
    )


def encode_header(kind, number, start, data_size):
    body = HEADER.pack(CHUNK_MAGIC, VERSION, kind, number, start, data_size, 0)[:-4]
    return (body + LENGTH.pack(zlib.crc32(body))).ljust(HEADER_SIZE, b"\0")


def decode_header(data, path):
    """C{(kind, number, start, data size)} of a chunk header;
    FormatError naming C{path} if it is none."""
    if len(data) < HEADER.size:
        raise FormatError(f"chunk {path} is cut short inside its header ({len(data)} bytes)")
    magic, version, kind, number, start, data_size, crc = HEADER.unpack_from(data)
    if magic != CHUNK_MAGIC:
        raise FormatError(f"chunk {path} does not start with the chunk magic")
    if zlib.crc32(data[: HEADER.size - 4]) != crc:
        raise FormatError(f"chunk {path} has a damaged header (CRC mismatch)")
    if version != VERSION:
        raise FormatError(f"chunk {path} has format version {version}; this brokerd reads version"
                          f" {VERSION}")
    return kind, number, start, data_size


def encode_footer(used, records):
    return _encode_end_block(FOOTER_MAGIC, used, records)


def decode_footer(data):
    """C{(bytes of records, number of records)} of a whole footer, or None if C{data} holds none."""
    return _decode_end_block(FOOTER_MAGIC, data)


def encode_progress(used, records):
    """
    The block written where an unfinished chunk's footer will go: how many
    bytes of records (and how many records) it held at an fsync made before
    this block is written (the last one, or at a clean stop this one), all
    of them durable. Opening scans the chunk from there.
    """
    return _encode_end_block(PROGRESS_MAGIC, used, records)


def decode_progress(data):
    """C{(bytes of records, number of records)} of a whole progress block, or None if C{data} holds
    none."""
    return _decode_end_block(PROGRESS_MAGIC, data)


def _encode_end_block(magic, used, records):
    body = FOOTER.pack(magic, used, records, 0)[:-4]
    return (body + LENGTH.pack(zlib.crc32(body))).ljust(FOOTER_SIZE, b"\0")


def _decode_end_block(expected_magic, data):
    if len(data) < FOOTER.size:
        return None
    magic, used, records, crc = FOOTER.unpack_from(data)
    if magic != expected_magic or zlib.crc32(data[: FOOTER.size - 4]) != crc:
        return None
    return used, records


# -- message records


def record_size(head, body_length):
    """The bytes a record of this head and body takes in a chunk."""
    return RECORD_OVERHEAD + len(head) + body_length


def frame_parts(head, body):
    """The parts of one record, in order; the body is one of them, never copied."""
    length = 5 + len(head) + len(body)
    start = RECORD_HEAD.pack(length, MESSAGE_RECORD, len(head)) + head
    crc = crc32(body, zlib.crc32(start[4:]))  # the CRC covers kind, head length, head, body
    return (start, body, RECORD_TAIL.pack(crc, length))


def record_problem(buffer, offset, limit):
    """
    Why the bytes of C{buffer} at C{offset} (with C{limit} the end of valid
    data) hold no whole, undamaged record, or None if they hold one.
    """
    if offset + RECORD_HEAD.size > limit:
        return "too few bytes left for a record"
    length, kind, head_length = RECORD_HEAD.unpack_from(buffer, offset)
    if length == 0:
        return "zero-filled"
    end = offset + 4 + length + RECORD_TAIL.size
    if length < 5 or end > limit:
        return f"a length of {length} that does not fit"
    if kind != MESSAGE_RECORD or head_length > length - 5:
        return "not a message record"
    crc, trailing = RECORD_TAIL.unpack_from(buffer, end - RECORD_TAIL.size)
    if trailing != length:
        return "lengths before and after it differ"
    if zlib.crc32(memoryview(buffer)[offset + 4 : offset + 4 + length]) != crc:
        return "CRC mismatch"
    return None


def sound_records(buffer, offset, limit):
    """
    Walk the whole, undamaged message records of C{buffer} from C{offset}
    (C{limit} the end of the bytes to look at): C{(the offset after the last
    of them, how many)}. Where it stops, L{record_problem} says why. The
    last chunk of a log is walked this way at every open, a record at a time,
    so the checks of L{record_problem} are made here in one tight loop.
    """
    unpack_head, unpack_tail, crc32 = RECORD_HEAD.unpack_from, RECORD_TAIL.unpack_from, zlib.crc32
    head_size, tail_size = RECORD_HEAD.size, RECORD_TAIL.size
    count = 0
    with memoryview(buffer) as view:
        while offset + head_size <= limit:
            length, kind, head_length = unpack_head(buffer, offset)
            end = offset + 4 + length
            if (length < 5 or end + tail_size > limit or kind != MESSAGE_RECORD
                    or head_length > length - 5):
                break
            crc, trailing = unpack_tail(buffer, end)
            if trailing != length or crc32(view[offset + 4 : end]) != crc:
                break
            offset = end + tail_size
            count += 1
    return offset, count


def full_record_size(buffer, offset):
    """The size on disk of the record at C{offset}, from its length field."""
    return LENGTH.unpack_from(buffer, offset)[0] + LENGTH.size + RECORD_TAIL.size


# A record up to this length is copied out whole, then split; a larger one through a view.
SMALL_RECORD = 4096


def record_at(buffer, offset, limit, crc_checked=False):
    """
    The C{(head bytes, body bytes)} of the record at C{offset} of C{buffer}
    (C{limit} the end of valid data), checked, each copied out once; None if
    the bytes there hold no whole, undamaged record (L{record_problem} says
    why). The head is a body-less StoredMessage. This is every paged
    delivery's read, so it takes the sound case in one pass. With
    C{crc_checked} (the read-ahead thread has checked this record's CRC in
    the same bytes) only its framing is checked.
    """
    if offset + RECORD_HEAD.size > limit:
        return None
    length, kind, head_length = RECORD_HEAD.unpack_from(buffer, offset)
    end = offset + 4 + length
    if (length < 5 or end + RECORD_TAIL.size > limit or kind != MESSAGE_RECORD
            or head_length > length - 5):
        return None
    crc, trailing = RECORD_TAIL.unpack_from(buffer, end)
    if trailing != length:
        return None
    if length <= SMALL_RECORD:
        record = buffer[offset + 4 : end]
        if not crc_checked and zlib.crc32(record) != crc:
            return None
        head_end = 5 + head_length
        return record[5:head_end], record[head_end:]
    with memoryview(buffer) as view:
        if not crc_checked and crc32(view[offset + 4 : end]) != crc:
            return None
        body_start = offset + RECORD_HEAD.size + head_length
        return bytes(view[offset + RECORD_HEAD.size : body_start]), bytes(view[body_start:end])


def record_damage(buffer, offset, limit, path, file_offset):
    """The L{StoreCorrupted} naming the file and the data offset of the damaged record at
    C{offset}."""
    problem = record_problem(buffer, offset, limit) or "unreadable"
    return StoreCorrupted(f"chunk {path}: the record at data offset {file_offset - HEADER_SIZE}"
                          f" is damaged ({problem})", path, file_offset)


def checked_record_parts(buffer, offset, limit, path, file_offset):
    """
    The C{(head, body)} of the record at C{offset} of C{buffer} (C{limit} the
    end of valid data), read from C{file_offset} of the chunk file at C{path}.

    @raise StoreCorrupted: naming the file and the data offset, if the record is damaged.
    """
    parts = record_at(buffer, offset, limit)
    if parts is None:
        raise record_damage(buffer, offset, limit, path, file_offset)
    return parts


def decode_head(head):
    return messages_pb2.StoredMessage.FromString(head)


# -- index entries


def encode_index_entry(position, body_length):
    """An index entry: the message's position + 1 (so zero means unwritten), its body length and a
    CRC."""
    key = INDEX_KEY.pack(position + 1, body_length)
    return key + LENGTH_LE.pack(zlib.crc32(key))


def decode_index_entries(data):
    """
    The entries of C{data} up to the first unwritten one: C{(positions,
    body lengths, stop, problem)}, the first two arrays, C{stop} the index (in
    entries) where reading stopped and C{problem} why, None for an all-zero
    entry or the end of C{data}.

    A queue's index is read whole at every open (a million entries for a
    million waiting messages), so the fields are taken out as array slices
    and each CRC computed by C{map}, with no Python code per entry.
    """
    count = len(data) // INDEX_ENTRY_SIZE
    with memoryview(data) as whole:
        view = whole[: count * INDEX_ENTRY_SIZE]
        # Four little-endian u32 an entry: position + 1 (low, high), body length, CRC.
        words = array("I")
        words.frombytes(view)
        positions_plus_one = array("Q")
        positions_plus_one.frombytes(view)
        if sys.byteorder != "little":
            words.byteswap()
            positions_plus_one.byteswap()
        positions_plus_one = positions_plus_one[::2]
        try:
            stop = positions_plus_one.index(0)
        except ValueError:
            stop = count
        entry_keys = view[: stop * INDEX_ENTRY_SIZE]
        computed = array("I", map(zlib.crc32, map(_first, _ENTRY_KEY.iter_unpack(entry_keys))))
        stored = words[3 : stop * 4 : 4]
    problem = None
    if computed != stored:
        stop = next(index for index, (mine, theirs) in enumerate(zip(computed, stored))
                    if mine != theirs)
        problem = "CRC mismatch"
    elif stop < count and (words[stop * 4 + 2] or words[stop * 4 + 3]):
        problem = "an entry with no position"
    positions = array("Q", map(_minus_one, positions_plus_one[:stop]))
    return positions, words[2 : stop * 4 : 4], stop, problem


_first = itemgetter(0)
_minus_one = (-1).__add__
_ENTRY_KEY = struct.Struct("<12s4x")
