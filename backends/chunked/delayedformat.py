"""The on-disk formats of the chunked store's delayed-message index
(L{backends.chunked.delayedindex}), as values: bytes in, values out, no file
opened here.

Under ``delayed/``:

  - ``meta``: the handle limit, the bucket width and the exchange keys by
    number (L{backends.common.delayed_meta}), replaced whole when they change;
  - ``journal``: a header ``[16s magic][u32 version][u64 generation][u32 CRC]``
    then fixed 32-byte entries ``[u64 due][u64 handle][u64 log position]
    [u32 exchange number][u32 CRC of the 28 bytes before]`` (little-endian),
    one per delay, and one per release with exchange number ``RELEASED``;
    appended at each commit and emptied (a new generation) once its entries
    are flushed into the buckets;
  - ``bucket-NNNNNNNNNNNNNNNNNNNN``: the entries due in one bucket of due
    time (``due // width == N``): a header ``[16s magic][u32 version]
    [u64 bucket number][u64 width][u32 CRC]`` then blocks ``[u32 payload
    length][u8 kind][u64 generation][u64 covered][u32 count][payload][u32 CRC
    of the block before it]``. A C{RUN} block holds entries ``[u64 due][u64
    handle][u64 log position][u64 exchange number]`` sorted by C{(due,
    handle)}; a C{RELEASES} block holds the u64 handles released since. A
    block was written by a flush of the journal of that generation when it
    held C{covered} entries: it holds what the bucket got from them.

Every file starts with a magic and a format version; every entry and block
carries a CRC; a block's length is checked against its count.
"""

import struct
import zlib
from array import array

from backends.common.fileio import little_endian_bytes, read_little_endian
from backends.common.sorted_runs import SortedRun

VERSION = 1
JOURNAL_MAGIC = b"brokerd djournal"
BUCKET_MAGIC = b"brokerd dbucket\0"
META_MAGIC = b"brokerd chunked delayed meta 1\n"
BUCKET_PREFIX = "bucket-"

JOURNAL_HEADER = struct.Struct(">16sIQI")
JOURNAL_ENTRY = struct.Struct("<QQQII")
JOURNAL_KEY = struct.Struct("<QQQI")  # the part of an entry its CRC covers
RELEASED = 0xFFFFFFFF  # the exchange number of a release entry
BUCKET_HEADER = struct.Struct(">16sIQQI")
BLOCK_HEAD = struct.Struct(">IBQQI")
CRC = struct.Struct(">I")
RUN, RELEASES = 1, 2
ENTRY_WORDS = 4  # u64s per run entry
ENTRY_SIZES = {RUN: 8 * ENTRY_WORDS, RELEASES: 8}


class DelayedFormatError(Exception):
    """Bytes of a delayed journal or bucket file that are not what the format says;
    the text says how, C{offset} where."""

    def __init__(self, text, offset):
        super().__init__(text)
        self.offset = offset


def bucket_file_name(number):
    return f"{BUCKET_PREFIX}{number:020d}"


def bucket_number_of(name):
    """The bucket number a file name names, or None if it names no bucket file."""
    digits = name[len(BUCKET_PREFIX) :]
    if name.startswith(BUCKET_PREFIX) and len(digits) == 20 and digits.isdigit():
        return int(digits)
    return None


# -- the journal


def encode_journal_header(generation):
    body = JOURNAL_HEADER.pack(JOURNAL_MAGIC, VERSION, generation, 0)[:-4]
    return body + CRC.pack(zlib.crc32(body))


def decode_journal_header(data):
    """The generation of a journal header; DelayedFormatError if C{data} does not start with one."""
    if len(data) < JOURNAL_HEADER.size:
        raise DelayedFormatError(f"it is cut short inside its header ({len(data)} bytes)", 0)
    magic, version, generation, crc = JOURNAL_HEADER.unpack_from(data)
    if magic != JOURNAL_MAGIC or zlib.crc32(data[: JOURNAL_HEADER.size - 4]) != crc:
        raise DelayedFormatError("it does not start with a journal header", 0)
    if version != VERSION:
        raise DelayedFormatError(f"it has format version {version}; this brokerd reads version"
                                 f" {VERSION}", 0)
    return generation


def encode_journal_entries(entries):
    """The bytes of journal entries C{(due, handle, position, exchange number)}."""
    pack, crc32 = JOURNAL_KEY.pack, zlib.crc32
    parts = []
    for entry in entries:
        key = pack(*entry)
        parts += (key, crc32(key).to_bytes(4, "little"))
    return b"".join(parts)


def decode_journal_entries(data, start):
    """
    C{(entries, stop, problem)}: the entries from C{start} on up to the first
    bad one, the offset where reading stopped and why (None at the end).
    """
    entries, crc32, size = [], zlib.crc32, JOURNAL_ENTRY.size
    view, offset = memoryview(data), start
    while offset < len(data):
        if len(data) - offset < size:
            return entries, offset, "an entry is cut short"
        due, handle, position, exchange, crc = JOURNAL_ENTRY.unpack_from(data, offset)
        if crc32(view[offset : offset + size - 4]) != crc:
            return entries, offset, "CRC mismatch"
        entries.append((due, handle, position, exchange))
        offset += size
    return entries, offset, None


def sound_entry_after(data, start):
    """True if a sound journal entry starts at an entry boundary after C{start}
    (damage in the middle)."""
    size, offset = JOURNAL_ENTRY.size, start + JOURNAL_ENTRY.size
    while offset + size <= len(data):
        if any(data[offset : offset + size]) and zlib.crc32(data[offset : offset + size - 4]) == \
                JOURNAL_ENTRY.unpack_from(data, offset)[4]:
            return True
        offset += size
    return False


# -- buckets


def encode_bucket_header(number, width):
    body = BUCKET_HEADER.pack(BUCKET_MAGIC, VERSION, number, width, 0)[:-4]
    return body + CRC.pack(zlib.crc32(body))


def decode_bucket_header(data):
    """C{(bucket number, width)} of a bucket file's header; DelayedFormatError if there is none."""
    if len(data) < BUCKET_HEADER.size:
        raise DelayedFormatError(f"it is cut short inside its header ({len(data)} bytes)", 0)
    magic, version, number, width, crc = BUCKET_HEADER.unpack_from(data)
    if magic != BUCKET_MAGIC or zlib.crc32(data[: BUCKET_HEADER.size - 4]) != crc:
        raise DelayedFormatError("it does not start with a bucket header", 0)
    if version != VERSION:
        raise DelayedFormatError(f"it has format version {version}; this brokerd reads version"
                                 f" {VERSION}", 0)
    return number, width


def encode_run_block(flushed, run):
    """A C{RUN} block of a sorted L{SortedRun} whose extra columns are positions and exchange
    numbers; C{flushed} is C{(journal generation, entries covered)}."""
    words = array("Q", bytes(8 * ENTRY_WORDS * len(run)))
    words[0::4], words[1::4] = run.dues, run.handles
    words[2::4], words[3::4] = array("Q", run.extra[0]), array("Q", run.extra[1])
    return _block(RUN, flushed, len(run), little_endian_bytes(words))


def encode_releases_block(flushed, handles):
    return _block(RELEASES, flushed, len(handles), little_endian_bytes(array("Q", sorted(handles))))


def _block(kind, flushed, count, payload):
    head = BLOCK_HEAD.pack(len(payload), kind, *flushed, count)
    return head + payload + CRC.pack(zlib.crc32(payload, zlib.crc32(head)))


def decode_blocks(data, start):
    """
    Walk the blocks of a bucket file from C{start}: C{(blocks, stop,
    problem)}, the sound blocks as C{(kind, (generation, covered), payload view)} up to
    the first bad one, where reading stopped and why (None at the end).
    """
    blocks, offset, view = [], start, memoryview(data)
    while offset < len(data):
        if len(data) - offset < BLOCK_HEAD.size + CRC.size:
            return blocks, offset, "a block is cut short"
        length, kind, generation, covered, count = BLOCK_HEAD.unpack_from(data, offset)
        end = offset + BLOCK_HEAD.size + length
        if kind not in ENTRY_SIZES or length != count * ENTRY_SIZES[kind]:
            return blocks, offset, "it is no block"
        if end + CRC.size > len(data):
            return blocks, offset, f"a block of {length} bytes runs past the end of the file"
        if zlib.crc32(view[offset:end]) != CRC.unpack_from(data, end)[0]:
            return blocks, offset, "CRC mismatch"
        blocks.append((kind, (generation, covered), view[offset + BLOCK_HEAD.size : end]))
        offset = end + CRC.size
    return blocks, offset, None


def run_of(payload):
    """The L{SortedRun} of a C{RUN} block's payload: its columns taken out at C speed."""
    words = read_little_endian("Q", payload)
    return SortedRun(words[0::4], words[1::4], (words[2::4], words[3::4]))


def handles_of(payload):
    return read_little_endian("Q", payload)


def sound_block_after(data, start):
    """True if a sound block starts anywhere after C{start}: the damage at C{start} is in the
    middle."""
    last = len(data) - BLOCK_HEAD.size - CRC.size
    for offset in range(start + 1, last + 1):
        if data[offset + 4] not in ENTRY_SIZES:
            continue
        length, kind, _, _, count = BLOCK_HEAD.unpack_from(data, offset)
        end = offset + BLOCK_HEAD.size + length
        if length == count * ENTRY_SIZES[kind] and end + CRC.size <= len(data) and \
                zlib.crc32(data[offset:end]) == CRC.unpack_from(data, end)[0]:
            return True
    return False
