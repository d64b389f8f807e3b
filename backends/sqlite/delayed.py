"""Delayed messages in the sqlite store: the tables, their index and the writer
thread's side (L{DelayedTable}, which L{backends.sqlite.database} drives in
each group commit); the reactor side is L{backends.sqlite.delayedrows}, which
reads rows back with L{delayed_message}.

A delayed message is one row of ``delayed``: its handle (the row id), due
time, exchange key, and the message as the ``messages`` table keeps one (a
StoredMessage without its body, the body apart, a CRC of both). The index
``delayed_due`` on ``(due, handle)`` makes a window one range scan. The next
handle to give out is kept in ``counters``, so handles keep increasing even
when every delayed message was released. Rows are written in the same
transaction as the rest of a group commit.

A release inserts the handle into ``delayed_released`` rather than deleting
the row at once: rows lie in handle order, which is not due order, so the
releases of one window would each rewrite a page of their own (64 KiB). The
released rows are deleted in bulk (L{DelayedTable.purge}) once there are
C{PURGE_ROWS} of them or they are half the table, and at open; windows leave
them out meanwhile.

Schema version 3 added these tables; a version-2 file is upgraded in place
when opened (the tables are created).
"""

from backends.common.delayed_requests import MAX_DUE
from backends.common.handle_map import HandleMap
from backends.common.message_record import record_of_stored
from backends.common.quarantine import parse_stored_message
from brokerd.interfaces import DelayedMessage, StoreCorrupted

PURGE_ROWS = 1 << 16  # released rows that make a purge
DELAYED_SCHEMA = """
CREATE TABLE IF NOT EXISTS delayed (
    handle INTEGER PRIMARY KEY, due INTEGER NOT NULL,
    vhost TEXT NOT NULL, exchange TEXT NOT NULL,
    crc INTEGER NOT NULL,  -- zlib.crc32 of record then body
    record BLOB NOT NULL,  -- the StoredMessage without its body
    body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS delayed_due ON delayed (due, handle);
CREATE TABLE IF NOT EXISTS delayed_released (handle INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""
NEXT_HANDLE = "next_delayed_handle"
INSERT_DELAYED = (
    "INSERT INTO delayed (due, handle, vhost, exchange, crc, record, body)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
RELEASE_DELAYED = "INSERT OR IGNORE INTO delayed_released (handle) VALUES (?)"
SAVE_NEXT_HANDLE = (
    "INSERT INTO counters (name, value) VALUES (?, ?)"
    " ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
COLUMNS = "due, handle, vhost, exchange, crc, record, body"
KEPT = "handle NOT IN (SELECT handle FROM delayed_released)"
WINDOW_FROM_START = (
    f"SELECT {COLUMNS} FROM delayed WHERE due <= ? AND {KEPT} ORDER BY due, handle LIMIT ?"
)
# After a cursor: the rest of the cursor's due time, then later ones; two seeks in the index
# (a row-value comparison would scan every row of the cursor's due time).
WINDOW_SAME_DUE = (
    f"SELECT {COLUMNS} FROM delayed WHERE due = ? AND handle > ? AND {KEPT} ORDER BY handle LIMIT ?"
)
WINDOW_LATER = (
    f"SELECT {COLUMNS} FROM delayed WHERE due > ? AND due <= ? AND {KEPT}"
    " ORDER BY due, handle LIMIT ?"
)


def create_tables(db):
    for statement in DELAYED_SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)


class DelayedTable:
    """The sqlite writer thread's side of the delayed tables: how many rows there are,
    and how many released."""

    def __init__(self):
        self.rows = 0
        self.released = 0

    def load(self, db):
        """Purge released rows;
        C{(kept handles as a HandleMap set, the next handle to give out)}."""
        self.purge(db)
        kept, highest = HandleMap(), 0
        add = kept.add
        for (handle,) in db.execute("SELECT handle FROM delayed"):
            add(handle)
            if handle > highest:
                highest = handle
        self.rows = len(kept)
        row = db.execute("SELECT value FROM counters WHERE name = ?", (NEXT_HANDLE,)).fetchone()
        return kept, max(highest + 1, row[0] if row else 1)

    def apply(self, db, batch):
        """Write a batch's delayed rows, releases and next handle in the open transaction;
        about how many bytes."""
        size = 0
        if batch.delays:
            db.executemany(INSERT_DELAYED, batch.delays.values())
            size = sum(len(row[5]) + len(row[6]) for row in batch.delays.values())
            self.rows += len(batch.delays)
        if batch.delay_releases:
            db.executemany(RELEASE_DELAYED, [(handle,) for handle in batch.delay_releases])
            self.released += len(batch.delay_releases)
            size += 16 * len(batch.delay_releases)
            if self.released >= PURGE_ROWS or 2 * self.released >= self.rows:
                size += self.purge(db)
        if batch.next_delayed is not None:
            db.execute(SAVE_NEXT_HANDLE, (NEXT_HANDLE, batch.next_delayed))
        return size + 64 * len(batch.delays)

    def purge(self, db):
        """Delete the released rows (in the open transaction); about how many bytes that
        rewrites. With none released it writes nothing: a DELETE of every row rewrites the
        table's root page even when it is empty, which would change the file of a store that was
        only opened (and read by a migration)."""
        if db.execute("SELECT 1 FROM delayed_released LIMIT 1").fetchone() is None:
            self.released = 0
            return 0
        purged = db.execute(
            "DELETE FROM delayed WHERE handle IN (SELECT handle FROM delayed_released)").rowcount
        db.execute("DELETE FROM delayed_released")
        self.rows -= max(purged, 0)
        self.released = 0
        return 256 * max(purged, 0)

    @staticmethod
    def window(db, failed, cursor, until, limit):
        """
        Up to C{limit} rows C{(due, handle, vhost, exchange, crc, record, body)}
        with key above C{cursor} and due by C{until}, in key order, including
        the delays of batches whose commit failed (to be written again).
        """
        until = min(until, MAX_DUE)
        if cursor is None:
            rows = db.execute(WINDOW_FROM_START, (until, limit)).fetchall()
        elif cursor[0] > until:
            rows = []
        else:
            due, handle = cursor
            rows = []
            if due >= 0:
                rows = db.execute(WINDOW_SAME_DUE, (due, min(handle, MAX_DUE), limit)).fetchall()
            if len(rows) < limit:
                rows += db.execute(WINDOW_LATER, (due, until, limit - len(rows))).fetchall()
        extra = [row for batch in failed for row in batch.delays.values()
                 if (cursor is None or (row[0], row[1]) > tuple(cursor)) and row[0] <= until]
        if extra:
            rows = sorted(rows + extra, key=lambda row: (row[0], row[1]))[:limit]
        return rows


def delayed_message(row, path, checksum):
    """The L{DelayedMessage} of a row; L{StoreCorrupted} if its checksum or record is bad
    (L{UnreadableMessage} if the record is intact but does not parse)."""
    due, handle, vhost, exchange, crc, record, body = row
    if checksum(record, body) != crc:
        raise StoreCorrupted(
            f"sqlite store {path}: delayed message {handle} is damaged"
            " (its checksum does not match)", path=path
        )
    stored = parse_stored_message(record, f"sqlite store {path}, delayed row {handle}",
                                  f"sqlite store {path}: delayed message {handle}", path)
    return DelayedMessage(due, handle, (vhost, exchange), record_of_stored(stored, body))
