"""The sqlite store's schema: its tables and their version, the upgrades from
older versions, and the statements the reactor thread buffers for the
topology tables, with the key of a binding's row.

The file keeps its own books, so that neither thread holds anything per
message: a message held by several queues has a row in C{shared} counting its
entries, and a trigger on C{entries} deletes a message's row with its last
entry (an ack, a purge, a deleted queue: whatever deletes the entry); another
keeps the count and bytes of held messages in C{held}, which the writer adds
each commit's new messages to.

The writer thread creates or upgrades the tables when the file opens
(L{backends.sqlite.database}); the delayed-message tables are
L{backends.sqlite.delayed}'s.
"""

from twisted.logger import Logger

from backends.sqlite import delayed
from brokerd.proto import messages_pb2

log = Logger()

# PRAGMA user_version of the files this code writes (and reads; 2 to 5 are upgraded).
SCHEMA_VERSION = 6
UPGRADABLE_VERSIONS = (2, 3, 4, 5)
APPLICATION_ID = 0x62726B64  # PRAGMA application_id, b"brkd": marks the file as a brokerd store
SCHEMA = """
CREATE TABLE exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, record BLOB NOT NULL,
    UNIQUE (vhost, name));
CREATE TABLE queues (
    id INTEGER PRIMARY KEY, vhost TEXT NOT NULL, name TEXT NOT NULL,
    record BLOB,  -- NULL for a queue the store holds messages for but no QueueRecord
    UNIQUE (vhost, name));
CREATE TABLE bindings (
    vhost TEXT NOT NULL, exchange TEXT NOT NULL, queue TEXT NOT NULL, routing_key TEXT NOT NULL,
    arguments BLOB NOT NULL,  -- the arguments table with its fields sorted by name
    record BLOB NOT NULL,
    UNIQUE (vhost, exchange, queue, routing_key, arguments));
CREATE TABLE messages (
    id INTEGER PRIMARY KEY, size INTEGER NOT NULL,
    crc INTEGER NOT NULL,  -- zlib.crc32 of record then body
    record BLOB NOT NULL,  -- the StoredMessage without its body
    body BLOB NOT NULL);
CREATE TABLE entries (
    queue_id INTEGER NOT NULL, message_id INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0,  -- how often the message came back to the queue \
unacked
    PRIMARY KEY (queue_id, message_id)) WITHOUT ROWID;
"""
# Exchange-to-exchange bindings (schema version 5) have a table of their own, so that a file of an
# older version gains them by one CREATE TABLE, its bindings table and their unique key unchanged.
EXCHANGE_BINDINGS_SCHEMA = """
CREATE TABLE exchange_bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, destination TEXT NOT NULL, routing_key TEXT NOT NULL,
    arguments BLOB NOT NULL,  -- the arguments table with its fields sorted by name
    record BLOB NOT NULL,
    UNIQUE (vhost, source, destination, routing_key, arguments))
"""
# What the file counts of its messages (schema version 6): created empty and filled from the
# messages and entries there are, by a new file and by the upgrade of an older one alike.
BOOKS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS shared (
        message_id INTEGER PRIMARY KEY,
        holders INTEGER NOT NULL)  -- entries holding the message, while two or more do""",
    """CREATE TABLE IF NOT EXISTS held (
        messages INTEGER NOT NULL, bytes INTEGER NOT NULL)  -- one row: messages held, \
their body bytes""",
    """CREATE TRIGGER IF NOT EXISTS entry_removed AFTER DELETE ON entries BEGIN
        DELETE FROM messages WHERE id = OLD.message_id
            AND NOT EXISTS (SELECT 1 FROM shared WHERE message_id = OLD.message_id);
        DELETE FROM shared WHERE message_id = OLD.message_id AND holders <= 2;
        UPDATE shared SET holders = holders - 1 WHERE message_id = OLD.message_id;
    END""",
    """CREATE TRIGGER IF NOT EXISTS message_removed AFTER DELETE ON messages BEGIN
        UPDATE held SET messages = messages - 1, bytes = bytes - OLD.size;
    END""",
)
COUNT_BOOKS = (
    # An older version's strays.
    "DELETE FROM messages WHERE id NOT IN (SELECT message_id FROM entries)",
    "DELETE FROM shared",
    "INSERT INTO shared (message_id, holders)"
    " SELECT message_id, count(*) FROM entries GROUP BY message_id HAVING count(*) > 1",
    "DELETE FROM held",
    "INSERT INTO held (messages, bytes) SELECT count(*), coalesce(sum(size), 0) FROM messages",
)
INSERT_MESSAGE = "INSERT INTO messages (id, size, crc, record, body) VALUES (?, ?, ?, ?, ?)"
INSERT_SHARED = "INSERT INTO shared (message_id, holders) VALUES (?, ?)"
ADD_HELD = "UPDATE held SET messages = messages + ?, bytes = bytes + ?"
HELD = "SELECT messages, bytes FROM held"

UPSERT_EXCHANGE = (
    "INSERT INTO exchanges (vhost, name, record) VALUES (?, ?, ?)"
    " ON CONFLICT (vhost, name) DO UPDATE SET record = excluded.record"
)
DELETE_EXCHANGE = "DELETE FROM exchanges WHERE vhost = ? AND name = ?"
DELETE_EXCHANGE_BINDINGS = "DELETE FROM bindings WHERE vhost = ? AND exchange = ?"
UPSERT_QUEUE = (
    "INSERT INTO queues (id, vhost, name, record) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET record = excluded.record"
)
ADD_QUEUE = ("INSERT OR IGNORE INTO queues (id, vhost, name, record)"
             " VALUES (?, ?, ?, NULL)")  # no QueueRecord
DELETE_QUEUE = "DELETE FROM queues WHERE id = ?"
DELETE_QUEUE_BINDINGS = "DELETE FROM bindings WHERE vhost = ? AND queue = ?"
UPSERT_BINDING = (
    "INSERT INTO bindings (vhost, exchange, queue, routing_key, arguments, record)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (vhost, exchange, queue, routing_key, arguments)"
    " DO UPDATE SET record = excluded.record"
)
UPSERT_EXCHANGE_BINDING = (
    "INSERT INTO exchange_bindings (vhost, source, destination, routing_key, arguments, record)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (vhost, source, destination, routing_key, arguments)"
    " DO UPDATE SET record = excluded.record"
)
DELETE_EXCHANGE_BINDING = (
    "DELETE FROM exchange_bindings WHERE vhost = ? AND source = ? AND destination = ?"
    " AND routing_key = ? AND arguments = ?"
)
DELETE_BINDINGS_OF_EXCHANGE = (
    "DELETE FROM exchange_bindings WHERE vhost = ? AND (source = ? OR destination = ?)"
)
ADD_DELIVERY_COUNT = "ALTER TABLE entries ADD COLUMN delivery_count INTEGER NOT NULL DEFAULT 0"
SET_DELIVERY_COUNT = "UPDATE entries SET delivery_count = ? WHERE queue_id = ? AND message_id = ?"
DELETE_BINDING = (
    "DELETE FROM bindings WHERE vhost = ? AND exchange = ? AND queue = ? AND routing_key = ?"
    " AND arguments = ?"
)


def create(db):
    """Create every table of this schema version in a new file, in the open transaction, and mark
    the file."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute(EXCHANGE_BINDINGS_SCHEMA)
    delayed.create_tables(db)
    create_books(db)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def upgrade(db, version, path):
    """Bring the file at C{path} of an older schema version up to this one, in the open
    transaction."""
    added = []
    if version < 3:
        delayed.create_tables(db)
        added.append("delayed messages")
    if version < 4:
        db.execute(ADD_DELIVERY_COUNT)
        added.append("delivery counts")
    if version < 5:
        db.execute(EXCHANGE_BINDINGS_SCHEMA)
        added.append("exchange-to-exchange bindings")
    if version < 6:
        create_books(db)
        added.append("held-message books")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    log.info("sqlite store {path}: schema version {old} upgraded to {new} ({added})",
             path=path, old=version, new=SCHEMA_VERSION, added=", ".join(added))


def create_books(db):
    """Create the tables and triggers that count held messages (if missing), and count what the file
    holds."""
    for statement in (*BOOKS_SCHEMA, *COUNT_BOOKS):
        db.execute(statement)


def canonical_arguments(table):
    """A binding's arguments as bytes that do not depend on the order of its fields."""
    ordered = messages_pb2.FieldTable()
    ordered.fields.extend(sorted(table.fields, key=lambda field: field.name))
    return ordered.SerializeToString(deterministic=True)


def binding_key(record, arguments):
    """What makes two bindings the same: (vhost, source, queue, routing key, canonical arguments,
    destination exchange), the queue empty for a binding to an exchange and the exchange for one
    to a queue."""
    return (record.vhost, record.exchange, record.queue, record.routing_key, arguments,
            record.destination_exchange)


def binding_row(key):
    """The key columns of a binding's row: in the bindings table, or in exchange_bindings
    for one to an exchange."""
    vhost, source, queue, routing_key, arguments, destination_exchange = key
    return (vhost, source, destination_exchange or queue, routing_key, arguments)


def binding_statement(record, to_queue, to_exchange):
    """The statement of the two for C{record}'s table: C{to_exchange} for a binding to an
    exchange."""
    return to_exchange if record.destination_exchange else to_queue
