"""The moves file of a chunked store: where compaction put the records it moved.

A message's handle is the position its record was first written at, and
stays so for as long as it is stored: queue indexes, ack logs, message ids
and the broker's handles all name it. When compaction copies a held record
out of a sparse chunk to the head of the log, it appends the pair (handle,
new position) here instead of rewriting the indexes; reads of the handle go
to the new position from then on. A handle moved twice has two pairs, the
later one wins.

``moves``: a magic line, then one record per commit that moved records,
``[u32 count][count x u64 handle][count x u64 position][u32 CRC]`` (arrays
little-endian, the rest big-endian; the CRC covers the record before it). The
first record that does not check out ends the file (a torn tail, cut off).
Records are appended without an fsync; the file is fsynced before any
message chunk is deleted, so the pairs that emptied a chunk are durable
before it goes. The file is rewritten whole (atomically, by rename) with only
the pairs of messages still held once it has grown well past them.

The writer thread's L{MovesFile} keeps the pairs that still count in memory
too (C{pairs}): those of records that are there and of messages some queue
holds, so that an ack finds the chunk a moved message's record is in.
"""

import os
import struct
import zlib
from array import array

from twisted.logger import Logger

from backends.common.fileio import little_endian_bytes, read_little_endian, replace_file, write_all
from brokerd.interfaces import StoreCorrupted

log = Logger()

MOVES_FILE = "moves"
MOVES_MAGIC = b"brokerd chunked moves 1\n"
COUNT = struct.Struct(">I")
REWRITE_AT_LEAST = 4096  # pairs written since the last rewrite before one is considered


def encode_moves(pairs):
    """One record of C{(handle, position)} pairs."""
    handles = array("Q", (handle for handle, _ in pairs))
    positions = array("Q", (position for _, position in pairs))
    body = b"".join((COUNT.pack(len(pairs)), little_endian_bytes(handles),
                     little_endian_bytes(positions)))
    return body + COUNT.pack(zlib.crc32(body))


def decode_moves(data, path):
    """
    C{(moves, end)}: the handle -> position dict of a moves file's contents
    (later pairs replacing earlier ones) and the offset after its last sound record.
    """
    if not data.startswith(MOVES_MAGIC):
        raise StoreCorrupted(f"moves file {path} does not start with the moves header", path, 0)
    offset, moves = len(MOVES_MAGIC), {}
    while offset + COUNT.size <= len(data):
        (count,) = COUNT.unpack_from(data, offset)
        end = offset + COUNT.size + 16 * count + COUNT.size
        if (count == 0 or end > len(data)
                or zlib.crc32(data[offset : end - 4]) != COUNT.unpack_from(data, end - 4)[0]):
            break
        handles = read_little_endian("Q", data, offset + COUNT.size, count)
        positions = read_little_endian("Q", data, offset + COUNT.size + 8 * count, count)
        moves.update(zip(handles, positions))
        offset = end
    return moves, offset


class MovesFile:
    """
    The moves file of one store's directory and the pairs of it that still
    count, on the writer thread.

    @ivar pairs: handle -> position of the record compaction moved it to,
        for the messages held (read them, never change them from outside).
    """

    def __init__(self, directory, rewrite_at_least=REWRITE_AT_LEAST):
        self.path = os.path.join(directory, MOVES_FILE)
        self.rewrite_at_least = rewrite_at_least
        self.pairs = {}
        self.written_pairs = 0  # pairs in the file, stale ones included
        self.unsynced = False  # records were appended since the last fsync
        self._unmoved = []  # moved handles forgotten since the last take_unmoved()
        self._descriptor = None
        self._size = 0

    def open(self, log):
        """
        Read the file, keeping the pairs whose records are in C{log} (a
        L{backends.chunked.messagelog.MessageLog} just opened): the others'
        messages are read where they were. A torn tail is cut off.
        """
        end, data_size, chunks = log.write_position, log.data_size, log.chunks
        self.pairs.update((handle, position) for handle, position in self._read().items()
                          if position < end and position // data_size in chunks)

    def forget_unheld(self, indexes):
        """Forget the pairs of the messages none of C{indexes} (every queue index there is)
        holds."""
        if self.pairs:
            for handle in [handle for handle in self.pairs if all(index.held_size(handle) is None
                                                                  for index in indexes)]:
                del self.pairs[handle]  # acked before the restart: its pair is forgotten

    def forget(self, handle):
        """No queue holds C{handle} any more: its pair, if it has one, no longer counts."""
        if self.pairs.pop(handle, None) is not None:
            self._unmoved.append(handle)

    def take_unmoved(self):
        """The handles whose pairs were forgotten since the last call, for the reactor thread."""
        unmoved, self._unmoved = tuple(self._unmoved), []
        return unmoved

    def _read(self):
        """The handle -> position pairs the file holds (an empty dict if there is none);
        a torn tail is cut off."""
        try:
            with open(self.path, "rb") as moves_file:
                data = moves_file.read()
        except FileNotFoundError:
            return {}
        moves, end = decode_moves(data, self.path)
        self._descriptor = os.open(self.path, os.O_RDWR)
        self._size = end
        if end < len(data):
            log.warn("moves file {path}: a torn record at offset {offset} ({size} bytes) is cut"
                     " off; the records it names are still read where they were",
                     path=self.path, offset=end, size=len(data) - end)
            os.ftruncate(self._descriptor, end)
            os.fsync(self._descriptor)
        self.written_pairs = len(moves)
        return moves

    def append(self, pairs):
        """Add one record of C{(handle, position)} pairs, not fsynced yet (see L{sync});
        they count from now on."""
        if self._descriptor is None:
            self._rewrite({})
        data = encode_moves(pairs)
        write_all(self._descriptor, data, self._size)
        self.unsynced = True
        self._size += len(data)
        self.written_pairs += len(pairs)
        self.pairs.update(pairs)

    def sync(self):
        """Make the records appended durable, whatever the sync policy:
        called before a chunk is deleted."""
        if self.unsynced:
            os.fsync(self._descriptor)
            self.unsynced = False

    def rewrite_if_due(self):
        """Replace the file by one holding only the pairs that count once most of its pairs are
        stale."""
        if self.written_pairs >= self.rewrite_at_least and self.written_pairs > 2 * len(self.pairs):
            self._rewrite(self.pairs)

    def _rewrite(self, moves):
        data = MOVES_MAGIC + (encode_moves(sorted(moves.items())) if moves else b"")
        self.close()
        replace_file(self.path, data, True)
        self.unsynced = False
        self._descriptor = os.open(self.path, os.O_RDWR)
        self._size = len(data)
        self.written_pairs = len(moves)

    def close(self):
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
