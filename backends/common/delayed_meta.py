"""The small file a file-based store keeps beside its delayed messages: the
filelog store's ``delayed.meta`` (L{backends.filelog.delayedlog}) and the
chunked store's ``delayed/meta`` (L{backends.chunked.delayedindex}), each
with a magic of its own.

It holds the handle limit of L{backends.common.delayed_requests.HandleLease}
(every handle given out lies below it), the width of a due-time bucket in
milliseconds and, for a store whose index names exchanges by number
(chunked), the exchange keys in number order. It changes rarely and is
replaced whole (L{replace_file}): ``[magic line with the format version]
[u64 handle limit][u64 bucket width][u32 exchange count]`` then per exchange
``[u32 length]["vhost\\0name" in UTF-8]``, then a CRC-32 of everything
before it (big-endian).
"""

import struct
import zlib
from typing import NamedTuple

from brokerd.interfaces import StoreCorrupted

FIELDS = struct.Struct(">QQI")
LENGTH = struct.Struct(">I")


class Meta(NamedTuple):
    """What a delayed-message meta file holds."""

    handle_limit: int
    bucket_width: int
    exchanges: list  # (vhost, name) keys, by number


def encode_meta(magic, meta):
    parts = [magic, FIELDS.pack(meta.handle_limit, meta.bucket_width, len(meta.exchanges))]
    for vhost, name in meta.exchanges:
        key = f"{vhost}\0{name}".encode("utf-8")
        parts += (LENGTH.pack(len(key)), key)
    body = b"".join(parts)
    return body + LENGTH.pack(zlib.crc32(body))


def decode_meta(data, path, magic):
    """The L{Meta} a file's contents hold; L{StoreCorrupted} naming C{path} if they are not a whole
    one."""

    def damaged(reason, offset=None):
        return StoreCorrupted(f"delayed-message file {path} is damaged: {reason}", path, offset)

    if not data.startswith(magic):
        raise damaged(f"it does not start with {magic!r}", 0)
    if len(data) < len(magic) + FIELDS.size + LENGTH.size:
        raise damaged(f"it is cut short at {len(data)} bytes", len(data))
    if zlib.crc32(data[:-LENGTH.size]) != LENGTH.unpack_from(data, len(data) - LENGTH.size)[0]:
        raise damaged("its CRC does not match")
    limit, width, count = FIELDS.unpack_from(data, len(magic))
    offset, end, exchanges = len(magic) + FIELDS.size, len(data) - LENGTH.size, []
    for _ in range(count):
        if offset + LENGTH.size > end:
            raise damaged("an exchange key is cut short", offset)
        (length,) = LENGTH.unpack_from(data, offset)
        start, offset = offset + LENGTH.size, offset + LENGTH.size + length
        try:
            vhost, name = data[start:offset].decode("utf-8").split("\0")
        except ValueError:
            raise damaged(f"the exchange key at offset {start - LENGTH.size} is not one",
                          start) from None
        exchanges.append((vhost, name))
    if offset != end or not width:
        raise damaged("its fields do not add up", offset)
    return Meta(limit, width, exchanges)


def read_meta(path, magic):
    """The L{Meta} of the file at C{path}, or None if there is none (nothing was ever delayed)."""
    try:
        with open(path, "rb") as meta_file:
            data = meta_file.read()
    except FileNotFoundError:
        return None
    return decode_meta(data, path, magic)
