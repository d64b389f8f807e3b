"""The formats of a chunked queue's ack log and checkpoint, as values.

``acks``: a magic line, then per commit up to two records: one of acks,
``[u32 count][count x u64 entry number][u32 CRC]``, and one of returns, the
delivery counts of entries that came back unacked, ``[u32 RETURNS | count]
[count x u64 entry number][count x u32 delivery count][u32 CRC]``. The CRC
covers the record before it; the first record that does not check out ends the
log (a torn tail).

``checkpoint``: ``[magic][u32 key length][queue key][u64 mark][u32 acked]
[acked x u64 entry][u32 counted][counted x u64 entry][counted x u32 count]
[u32 CRC]``: the low-water mark (the first entry not acked), the acked entries
above it and the delivery counts of entries not acked.

Numbers in arrays are little-endian, the others big-endian. Version 1 of both
files had no delivery counts; it is still read (its records read the same).
"""

import struct
import zlib
from array import array

from backends.common.fileio import little_endian_bytes, read_little_endian
from brokerd.interfaces import StoreCorrupted

ACK_LOG_MAGIC = b"brokerd chunked acks 2\n"
ACK_LOG_MAGICS = (b"brokerd chunked acks 1\n", ACK_LOG_MAGIC)  # all of one length
CHECKPOINT_MAGIC = b"brokerd chunked checkpoint 2\n"
CHECKPOINT_V1_MAGIC = b"brokerd chunked checkpoint 1\n"
COUNT = struct.Struct(">I")
RETURNS = 0x80000000  # in an ack log record's count: a record of delivery counts
MARK = struct.Struct(">QI")  # low-water mark, number of acked entries above it


def encode_checkpoint(queue, mark, acked, delivery_counts=None):
    key = "\0".join(queue).encode("utf-8")
    counted = sorted(delivery_counts.items()) if delivery_counts else ()
    body = b"".join((CHECKPOINT_MAGIC, COUNT.pack(len(key)), key, MARK.pack(mark, len(acked)),
                     little_endian_bytes(array("Q", sorted(acked))), COUNT.pack(len(counted)),
                     little_endian_bytes(array("Q", (entry for entry, _ in counted))),
                     little_endian_bytes(array("I", (count for _, count in counted)))))
    return body + COUNT.pack(zlib.crc32(body))


def decode_checkpoint(data, path):
    """C{(queue key, low-water mark, acked entries, delivery counts)} of a checkpoint file's
    contents."""
    magic = CHECKPOINT_MAGIC if data.startswith(CHECKPOINT_MAGIC) else CHECKPOINT_V1_MAGIC
    start = len(magic) + COUNT.size
    if not data.startswith(magic) or len(data) < start + COUNT.size:
        raise StoreCorrupted(f"checkpoint {path} does not start with the checkpoint header",
                             path, 0)
    if zlib.crc32(data[:-4]) != COUNT.unpack_from(data, len(data) - 4)[0]:
        raise StoreCorrupted(f"checkpoint {path} is damaged (CRC mismatch)", path, 0)
    (key_length,) = COUNT.unpack_from(data, len(magic))
    vhost, _, name = data[start : start + key_length].decode("utf-8").partition("\0")
    mark, count = MARK.unpack_from(data, start + key_length)
    offset = start + key_length + MARK.size
    acked = read_little_endian("Q", data, offset, count)
    offset += 8 * count
    delivery_counts = {}
    if magic == CHECKPOINT_MAGIC:
        (counted,) = COUNT.unpack_from(data, offset)
        entries = read_little_endian("Q", data, offset + COUNT.size, counted)
        counts = read_little_endian("I", data, offset + COUNT.size + 8 * counted, counted)
        delivery_counts = dict(zip(entries, counts))
    return (vhost, name), mark, set(acked), delivery_counts


def encode_ack_records(acks, returns):
    """One commit's records: C{returns} (entry -> delivery count) first, then C{acks}
    (an array of entries)."""
    records = []
    if returns:
        counted = sorted(returns.items())
        records.append(COUNT.pack(RETURNS | len(counted))
                       + little_endian_bytes(array("Q", (entry for entry, _ in counted)))
                       + little_endian_bytes(array("I", (count for _, count in counted))))
    if acks:
        records.append(COUNT.pack(len(acks)) + little_endian_bytes(acks))
    return b"".join(body + COUNT.pack(zlib.crc32(body)) for body in records)


def decode_ack_log(data, path):
    """
    Read an ack log's contents: C{(acked entries, delivery counts, end)}
    where C{end} is the offset after the last sound record (less than
    C{len(data)} if the tail is torn).
    """
    if not data.startswith(ACK_LOG_MAGICS):
        raise StoreCorrupted(f"ack log {path} does not start with the ack log header", path, 0)
    offset, acked, delivery_counts = len(ACK_LOG_MAGIC), array("Q"), {}
    while offset + COUNT.size <= len(data):
        (count,) = COUNT.unpack_from(data, offset)
        returns, count = bool(count & RETURNS), count & ~RETURNS
        end = offset + COUNT.size + (12 if returns else 8) * count + COUNT.size
        if (count == 0 or end > len(data)
                or zlib.crc32(data[offset : end - 4]) != COUNT.unpack_from(data, end - 4)[0]):
            break
        entries = read_little_endian("Q", data, offset + COUNT.size, count)
        if returns:
            counts = read_little_endian("I", data, offset + COUNT.size + 8 * count, count)
            delivery_counts.update(zip(entries, counts))
        else:
            acked.extend(entries)
        offset = end
    return acked, delivery_counts, offset
