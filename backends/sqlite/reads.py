"""Reading messages back on the reactor thread: L{MessageReader}, a read-only
connection of the reactor's own to the database and a bounded cache of rows
read ahead.

WAL lets this connection read while the writer thread writes; it sees only
committed rows (the store serves the batches not yet committed itself). A
message is read with the ones that follow it in its queue: one query fetches
the next run of the queue's entries joined to their message rows, about
C{RUN_BYTES} of them, into the cache; loading the last row of a run reads the
next run, so a queue delivered in order costs one query per run. The CRC of a
row is checked, and its record parsed, when it is loaded, not when it is read.
"""

import os
import sqlite3
import urllib.parse
from collections import OrderedDict

from backends.common.quarantine import parse_stored_message
from backends.sqlite.checkpointer import LOCK_WAIT_SECONDS
from backends.sqlite.database import checksum
from brokerd.interfaces import MessageRecord, StoreCorrupted
from brokerd.proto import messages_pb2

# Bytes a cached row costs beyond its record and body (tuple, ints, bytes headers, dict slot).
ROW_OVERHEAD = 160
# A run of a queue's rows: (message id, crc, record, body, bytes the row takes in the cache);
# an entry whose message row is missing comes with NULLs.
RUN = ("SELECT e.message_id, m.crc, m.record, m.body,"
       f" coalesce(length(m.record) + length(m.body), 0) + {ROW_OVERHEAD}"
       " FROM entries e LEFT JOIN messages m ON m.id = e.message_id"
       " WHERE e.queue_id = ? AND e.message_id >= ? ORDER BY e.message_id LIMIT ?")
# The queue of a message: one seek per queue in the entries' key (queue id, message id).
QUEUE_OF = ("SELECT queue_id FROM entries WHERE queue_id IN (SELECT id FROM queues)"
            " AND message_id = ? LIMIT 1")
RUN_BYTES = 1 << 20  # about how many bytes of rows one query reads ahead
MOST_RUN_ROWS = 512  # ... and at most this many rows
RECORD_BYTES = 64  # about what a row's record (exchange, routing key, properties) takes
# SQLite's page cache of the reader (emptied by every commit of the writer anyway).
READER_CACHE_KIB = 2048
HEAD_KINDS = 256  # distinct records (exchange, routing key, properties) remembered
_new_tuple = tuple.__new__


class MessageReader:
    """
    Reads message rows back for the store on the reactor thread.

    @param path: the database file (the writer's open created it).
    @param cache_size: bytes of rows read ahead kept at most; 0 reads one row at a time and
        keeps none.
    """

    def __init__(self, path, cache_size):
        self.path = path
        self.capacity = cache_size
        self.size = 0  # bytes of the cached rows
        self.hits = self.misses = self.queries = self.rows_read = 0
        self._db = None
        self._cache = OrderedDict()  # message id -> its row (see RUN), oldest read first
        self._run_ends = {}  # message id of a cached run's last row -> its queue id
        self._row_bytes = 1024  # bytes a row took in the last run read, to size the next
        self._kinds = {}  # record bytes -> (exchange, routing key, properties, published_at)

    def open(self, held_messages=0, held_bytes=0):
        """Open the connection; what is held tells how many rows the first run may read."""
        if held_messages:
            self._row_bytes = held_bytes // held_messages + ROW_OVERHEAD + RECORD_BYTES
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path)) + "?mode=ro"
        self._db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=LOCK_WAIT_SECONDS)
        self._db.execute(f"PRAGMA cache_size = -{READER_CACHE_KIB}")

    def close(self):
        self._cache.clear()
        self._run_ends.clear()
        self.size = 0
        if self._db is not None:
            db, self._db = self._db, None
            db.close()

    def load(self, handle):
        """
        The L{MessageRecord} of message C{handle}, from the cache or the file.

        @raise KeyError: if no committed entry holds it.
        @raise StoreCorrupted: if its row is damaged or missing, or the file cannot be read.
        @raise UnreadableMessage: if its row is whole but its record does not parse.
        """
        row = self._cache.pop(handle, None)
        if row is None:
            row = self._read(handle)
        else:
            self.hits += 1
            self.size -= row[4]
            if self._run_ends:
                queue_id = self._run_ends.pop(handle, None)
                if queue_id is not None:
                    self._read_run(queue_id, handle + 1)
        _, crc, record, body, _ = row
        if crc is None:
            raise StoreCorrupted(f"sqlite store {self.path}: message {handle} is missing from the"
                                 " messages table", path=self.path)
        if checksum(record, body) != crc:
            raise StoreCorrupted(f"sqlite store {self.path}: message {handle} is damaged"
                                 " (its checksum does not match)", path=self.path)
        kind = self._kinds.get(record)
        if kind is None:
            kind = self._kind(handle, record)
        exchange, routing_key, properties, published_at = kind
        return _new_tuple(MessageRecord, (exchange, routing_key, properties, body, published_at))

    def _kind(self, handle, record):
        """Parse a record not seen lately; its messages share the properties (read-only)."""
        stored = parse_stored_message(record, f"sqlite store {self.path}, messages row {handle}",
                                      f"sqlite store {self.path}: message {handle}", self.path)
        properties = messages_pb2.BasicProperties()
        properties.CopyFrom(stored.properties)
        published_at = stored.published_at if stored.HasField("published_at") else None
        if len(self._kinds) >= HEAD_KINDS:
            self._kinds.clear()
        kind = self._kinds[record] = (stored.exchange, stored.routing_key, properties, published_at)
        return kind

    def _read(self, handle):
        """A message not cached: find its queue, and read the run of that queue from it on."""
        self.misses += 1
        if self._db is None:
            raise KeyError(f"sqlite store {self.path} is not open; cannot read {handle!r}")
        if type(handle) is not int:
            raise KeyError(f"{handle!r} is not a sqlite store handle")
        found = self._query(QUEUE_OF, (handle,))
        if not found:
            raise KeyError(f"sqlite store {self.path} holds no message with handle {handle!r}")
        rows = self._read_run(found[0][0], handle)
        if not rows or rows[0][0] != handle:  # its entry went in a commit between the two queries
            raise KeyError(f"sqlite store {self.path} holds no message with handle {handle!r}")
        if self._cache.pop(handle, None) is not None:
            self.size -= rows[0][4]
            queue_id = self._run_ends.pop(handle, None)
            if queue_id is not None:  # a run of one row
                self._read_run(queue_id, handle + 1)
        return rows[0]

    def _read_run(self, queue_id, start):
        """Read the entries of C{queue_id} from message id C{start} on with their rows;
        cache all but what does not fit. Returns the rows (the first is C{start}'s)."""
        capacity = self.capacity
        # At most half the cache, so that a run a little larger than guessed does not push its own
        # first rows out.
        half_the_cache = capacity // (2 * self._row_bytes)
        count = max(1, min(MOST_RUN_ROWS, RUN_BYTES // self._row_bytes, half_the_cache))
        rows = self._query(RUN, (queue_id, start, count))
        self.rows_read += len(rows)
        if not rows or capacity <= 0:
            return rows
        cache, size = self._cache, 0
        for row in rows:
            old = cache.pop(row[0], None)  # read before: goes to the end, counted once
            if old is not None:
                size -= old[4]
            cache[row[0]] = row
            size += row[4]
        self._row_bytes = max(1, sum([row[4] for row in rows]) // len(rows))
        if len(rows) == count:
            self._run_ends[rows[-1][0]] = queue_id
        self.size += size
        while self.size > capacity and cache:
            handle, old = cache.popitem(last=False)
            self.size -= old[4]
            self._run_ends.pop(handle, None)
        return rows

    def _query(self, sql, parameters):
        self.queries += 1
        try:
            return self._db.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise StoreCorrupted(f"sqlite store {self.path} cannot be read: {error}",
                                 path=self.path) from None
