"""The writer thread's half of the sqlite store: one sqlite3 connection,
opened and checked (the schema and its upgrades are L{backends.sqlite.schema}),
finding at open what the broker needs at once (L{backends.sqlite.loading}:
topology, each queue's message ids in order, delivery counts, the
held-message books; no message is read) and applying each batch of buffered
writes in one transaction.

Only L{brokerd.storage.durability.GroupCommit}'s writer thread calls into a
L{Database}; the reactor thread never touches its connection (it reads
messages back on a read-only connection of its own, L{backends.sqlite.reads}).
Checkpoints (copying the write-ahead log into the database file) are kept off
the commit path: a L{Checkpointer} runs them on a connection and thread of
its own.
"""

import fcntl
import os
import sqlite3
import zlib

from twisted.logger import Logger

from backends.common.checksum import crc32
from backends.sqlite import delayed
from backends.sqlite.checkpointer import LOCK_WAIT_SECONDS, Checkpointer
from backends.sqlite.loading import load
from backends.sqlite.schema import (
    ADD_HELD,
    APPLICATION_ID,
    HELD,
    INSERT_MESSAGE,
    INSERT_SHARED,
    SCHEMA_VERSION,
    SET_DELIVERY_COUNT,
    UPGRADABLE_VERSIONS,
    create,
    upgrade,
)
from brokerd.interfaces import StoreCorrupted, StoreInUse

log = Logger()

PAGE_SIZE = 65536  # set once, when the file is created: one overflow page holds a 64 KiB body
CACHE_KIB = 16384  # page cache of the connection
SYNCHRONOUS = {"always": "FULL", "interval": "FULL", "none": "OFF"}
TOPOLOGY_TABLES = ("exchanges", "queues", "bindings", "exchange_bindings", "shared", "held",
                   "counters")


def checksum(record, body):
    """The C{crc} column of a message: CRC-32 of its record, then of its body."""
    return crc32(body, zlib.crc32(record))


class StoreOpenError(Exception):
    """The database file is not one this brokerd can use (a newer schema, another
    program's database, locked by another process); unlike L{StoreCorrupted},
    nothing in it is damaged."""


class StoreLocked(StoreOpenError, StoreInUse):
    """Another process (most likely another brokerd) holds the database file's lock."""


class Batch:
    """
    The writes buffered on the reactor thread between two group commits.

    Appends not yet taken by a commit can be cancelled in place: a message
    acked by every queue before its batch is written is never written.
    """

    __slots__ = ("topology", "messages", "entries", "returns", "acks", "dropped_queues", "delays",
                 "delay_releases", "next_delayed", "final")

    def __init__(self):
        self.topology = []  # (sql, parameters), in call order
        # message id -> (the message appended, StoredMessage bytes without the body, body, entries
        # holding it), in append order; the writer computes the CRC, and never touches the message
        self.messages = {}
        self.entries = {}  # (queue id, message id) -> None, in append order
        self.returns = {}  # (queue id, message id) -> the entry's latest delivery count
        # (queue id, message id) of entries that may be in the file (a trigger drops the message)
        self.acks = []
        self.dropped_queues = []  # queue ids whose entries all go
        # delayed handle -> row of the delayed table (see backends.sqlite.delayed), in call order
        self.delays = {}
        self.delay_releases = []  # delayed handles written by earlier batches, released since
        self.next_delayed = None  # the next delayed handle to give out, if delays were made
        self.final = False  # the store is closing: close the connection after this batch

    def __bool__(self):
        return bool(
            self.topology or self.messages or self.entries or self.returns or self.acks
            or self.dropped_queues or self.delays or self.delay_releases
            or self.next_delayed is not None
        )


class Database:
    """
    The SQLite file of one store, used only from the writer thread.

    While the store is open an exclusive C{flock} on C{<path>.lock} keeps
    any other brokerd off the file: two brokers giving out ids in one file
    would collide. (SQLite's own exclusive locking mode cannot do this, as it
    shuts out the L{Checkpointer}'s connection as well.)

    @param path: the database file; it and its directory are created if missing.
    @param mode: the sync policy's mode, which picks C{PRAGMA synchronous}.
    """

    def __init__(self, path, mode):
        self.path = path
        self.synchronous = SYNCHRONOUS[mode]
        self._db = None
        self._lock = None  # the open lock file, flocked
        self._checkpointer = None
        self._failed = []  # batches of commits that failed, written again before the next one
        self._held = (0, 0)  # messages held and their body bytes, as the last commit left them
        self._delayed = delayed.DelayedTable()
        self.final_error = None  # why the commit of the final batch failed, if it did

    def open(self):
        """Open (creating if need be), check and load the database; returns a
        L{backends.sqlite.loading.Loaded}."""
        try:
            return self._open()
        except sqlite3.DatabaseError as error:
            self.close()
            raise self._explain(error) from None
        except BaseException:
            self.close()
            raise

    def _explain(self, error):
        code = getattr(error, "sqlite_errorname", "")
        if code in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or type(error) is sqlite3.DatabaseError:
            return StoreCorrupted(
                f"sqlite store {self.path} is damaged or not a database ({error}); restore it"
                f" from a backup, or salvage what it holds with `sqlite3 {self.path} .recover`",
                path=self.path,
            )
        hint = " (is another brokerd using it?)" if code in ("SQLITE_BUSY", "SQLITE_LOCKED") else ""
        return StoreOpenError(f"sqlite store {self.path} cannot be opened: {error}{hint}")

    def _open(self):
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        wal = self.path + "-wal"
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            log.info(
                "sqlite store {path} was not closed cleanly: SQLite recovers the commits of its"
                " {size}-byte write-ahead log and drops a torn tail",
                path=self.path,
                size=os.path.getsize(wal),
            )
        self._take_lock()
        db = self._db = sqlite3.connect(
            self.path, timeout=LOCK_WAIT_SECONDS, check_same_thread=False, isolation_level=None
        )
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreOpenError(
                f"sqlite store {self.path} has schema version {version}, newer than version"
                f" {SCHEMA_VERSION} that this brokerd reads;"
                " run a newer brokerd or choose another file"
            )
        fresh = version == 0 and tables == 0
        if fresh:
            db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        elif version != SCHEMA_VERSION and version not in UPGRADABLE_VERSIONS:
            raise StoreOpenError(
                f"sqlite store {self.path} has schema version {version}, not version"
                f" {SCHEMA_VERSION} that this brokerd reads; is it a brokerd store?"
            )
        elif db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            raise StoreOpenError(f"{self.path} is an SQLite database but not a brokerd store")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreOpenError(f"sqlite store {self.path} cannot use write-ahead logging"
                                 f" (journal mode {mode})")
        db.execute(f"PRAGMA synchronous = {self.synchronous}")
        db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        db.execute("PRAGMA wal_autocheckpoint = 0")  # the Checkpointer's thread does them
        db.execute("BEGIN IMMEDIATE")
        try:
            if fresh:
                create(db)
            else:
                self._check()
                if version != SCHEMA_VERSION:
                    upgrade(db, version, self.path)
            loaded = load(db, self.path, self._delayed)
            self._held = loaded.held
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._checkpointer = Checkpointer(self.path, self.synchronous)
        return loaded

    def _take_lock(self):
        """Hold an exclusive C{flock} on C{<path>.lock} until L{close};
        fail at once if another holds it."""
        lock = open(self.path + ".lock", "a+b")  # noqa: SIM115 - held until close
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StoreLocked(
                f"sqlite store {self.path} is locked by another process"
                " (is another brokerd using it?)"
            ) from None
        except BaseException:
            lock.close()
            raise
        self._lock = lock

    def _check(self):
        """
        Fail on damage SQLite can see in the topology tables, and note bytes
        past the file's end. The message tables are not walked here (that
        would read every message): damage in C{entries} fails open as it is
        read, damage in C{messages} is found when a message is read back.
        """
        tables = {row[0] for row in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        problems = []
        for table in TOPOLOGY_TABLES:
            if table in tables:
                problems += [row[0] for row in self._db.execute(f"PRAGMA quick_check({table})")
                             if row[0] != "ok"]
        if problems:
            raise StoreCorrupted(
                f"sqlite store {self.path} is damaged: {'; '.join(problems[:5])}; restore it"
                f" from a backup, or salvage what it holds with `sqlite3 {self.path} .recover`",
                path=self.path,
            )
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
        extra = os.path.getsize(self.path) - pages * page_size
        if extra > 0:
            log.warn(
                "sqlite store {path} has {extra} bytes after the end of its database;"
                " SQLite ignores them",
                path=self.path,
                extra=extra,
            )

    def write(self, batch, fsync):
        """
        Apply C{batch} (and any batch whose commit failed before) in one
        transaction; with C{synchronous} FULL the commit is the fsync, so
        C{fsync} needs no work of its own. A final batch closes the connection.
        Returns the messages held and their body bytes, as the file counts them.
        """
        batches = [*self._failed, batch] if batch else list(self._failed)
        try:
            if batches:
                self._commit(batches)
            self._failed = []
            return self._held
        except BaseException as error:
            self._failed = batches
            if batch is not None and batch.final:
                self.final_error = error
            raise
        finally:
            if batch is not None and batch.final:
                self.close()

    def _commit(self, batches):
        db = self._db
        if db is None:
            raise StoreOpenError(f"sqlite store {self.path} is closed")
        checkpointer = self._checkpointer
        if checkpointer is not None and checkpointer.behind:
            # The log is long and the Checkpointer has copied all but what was committed
            # while it ran: copy the rest here, so this transaction writes the log from its
            # start again rather than making it longer.
            busy = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]
            # The Checkpointer was running again: try at the next commit.
            checkpointer.behind = bool(busy)
        db.execute("BEGIN IMMEDIATE")
        try:
            size = sum(self._apply(db, batch) for batch in batches)
            held = db.execute(HELD).fetchone()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._held = held
        if checkpointer is not None:
            checkpointer.committed(size)

    def _apply(self, db, batch):
        """Write C{batch} in the open transaction; returns about how many bytes of rows it wrote."""
        # Topology first, then rows in, then rows out. This order gives what the calls
        # in their own order would: ids are never reused while the store is open, so
        # entries dropped with a queue never belong to a queue created in the batch.
        for statement, parameters in batch.topology:
            db.execute(statement, parameters)
        size = 0
        if batch.messages:
            rows = [(message_id, len(body), checksum(record, body), record, body)
                    for message_id, (_, record, body, _) in batch.messages.items()]
            db.executemany(INSERT_MESSAGE, rows)
            shared = [(message_id, holders)
                      for message_id, (_, _, _, holders) in batch.messages.items() if holders > 1]
            if shared:
                db.executemany(INSERT_SHARED, shared)
            size = sum([row[1] for row in rows])
            db.execute(ADD_HELD, (len(rows), size))
            size += sum([len(row[3]) for row in rows])
        if batch.entries:
            db.executemany("INSERT INTO entries (queue_id, message_id) VALUES (?, ?)",
                           batch.entries)
        if batch.returns:
            db.executemany(SET_DELIVERY_COUNT,
                           [(count, *entry) for entry, count in batch.returns.items()])
        if batch.acks:  # the entry_removed trigger deletes a message with its last entry
            db.executemany("DELETE FROM entries WHERE queue_id = ? AND message_id = ?", batch.acks)
        if batch.dropped_queues:
            db.executemany("DELETE FROM entries WHERE queue_id = ?",
                           [(queue_id,) for queue_id in batch.dropped_queues])
        size += self._delayed.apply(db, batch)
        return size + 64 * (len(batch.topology) + len(batch.entries) + len(batch.acks))

    def delayed_after(self, cursor, until, limit):
        """
        Up to C{limit} rows of the delayed table after C{cursor} and due by
        C{until} (see L{backends.sqlite.delayed.DelayedTable.window}).
        """
        if self._db is None:
            raise StoreOpenError(f"sqlite store {self.path} is closed")
        return self._delayed.window(self._db, self._failed, cursor, until, limit)

    def pragmas(self):
        """The connection's settings that matter for durability, by PRAGMA name."""
        names = ("journal_mode", "synchronous", "locking_mode", "page_size", "user_version",
                 "application_id")
        return {name: self._db.execute(f"PRAGMA {name}").fetchone()[0] for name in names}

    def close(self):
        """Stop the Checkpointer, copy the whole log into the database file, close,
        and let go of the lock."""
        try:
            if self._checkpointer is not None:
                checkpointer, self._checkpointer = self._checkpointer, None
                checkpointer.stop()
            if self._db is not None:
                db, self._db = self._db, None
                try:
                    if not db.in_transaction:
                        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error as error:
                    log.warn("sqlite store {path}: checkpoint at close failed ({error})",
                             path=self.path, error=error)
                finally:
                    db.close()
        finally:
            if self._lock is not None:
                lock, self._lock = self._lock, None
                lock.close()
