"""What the sqlite store's open finds in the file, read on the writer thread
in the open's transaction (L{backends.sqlite.database.Database.open}): the
topology, each queue's message ids in order, delivery counts, the
held-message books and the kept delayed handles. No message is read.

A topology row whose record does not parse is quarantined: left as it is,
not served, and listed in L{Loaded.quarantined}.
"""

import sys
from array import array

from twisted.logger import Logger

from backends.common.quarantine import parse_or_none
from backends.sqlite.schema import HELD
from brokerd.interfaces import QuarantinedRecord, StoreCorrupted
from brokerd.proto import messages_pb2

log = Logger()

UNPARSABLE = "its record does not parse (nested deeper than protobuf reads)"
# How many message ids each queue has, and its first and last: without a gap between them they
# are a range.
QUEUE_COUNTS = "SELECT queue_id, count(*) FROM entries GROUP BY queue_id"
LOWEST = "SELECT min(message_id) FROM entries WHERE queue_id = ?"
HIGHEST = "SELECT max(message_id) FROM entries WHERE queue_id = ?"
# Else a queue's message ids in order, as one text of 16 hex digits each: one row instead of one per
# message, turned into an array by bytes.fromhex (two thirds of the time of fetching the rows).
QUEUE_IDS = ("SELECT group_concat(printf('%016x', message_id), '')"
             " FROM (SELECT message_id FROM entries WHERE queue_id = ? ORDER BY message_id)")


class Loaded:
    """What L{backends.sqlite.database.Database.open} found, handed from the writer thread to the
    store."""

    def __init__(self):
        self.exchanges = []  # ExchangeRecord, in creation order
        self.queues = []  # (queue id, vhost, name, QueueRecord or None), in creation order
        self.bindings = []  # (canonical arguments, BindingRecord), in creation order
        # queue id -> its message ids in queue order (an array), for queues holding any
        self.handles = {}
        self.delivery_counts = {}  # queue id -> {message id: delivery count}, for counts above 0
        self.held = (0, 0)  # messages held and their body bytes
        self.next_message_id = 1
        self.next_queue_id = 1
        self.delayed = None  # the kept delayed handles, a HandleMap set
        self.next_delayed = 1
        self.quarantined = []  # QuarantinedRecord of each topology row whose record does not parse


def load(db, path, delayed_table):
    """
    A L{Loaded} of what the file at C{path}, open as C{db}, holds; entries of
    queues the file has no row for are dropped (logged), and the released
    rows of C{delayed_table} (a L{backends.sqlite.delayed.DelayedTable}) are
    purged.
    """
    loaded = Loaded()
    load_topology(db, path, loaded)
    queue_ids = {queue[0] for queue in loaded.queues}
    spans = queue_spans(db)
    stray = [span[0] for span in spans if span[0] not in queue_ids]
    if stray:
        dropped = sum(db.execute("DELETE FROM entries WHERE queue_id = ?", (queue_id,)).rowcount
                      for queue_id in stray)
        log.warn("sqlite store {path}: dropping {count} entries of unknown queues",
                 path=path, count=dropped)
    highest = db.execute("SELECT max(id) FROM messages").fetchone()[0] or 0
    for queue_id, count, lowest, last in spans:
        if queue_id in queue_ids:
            loaded.handles[queue_id] = queue_handles(db, queue_id, count, lowest, last)
            highest = max(highest, last)
    for queue_id, message_id, count in db.execute(
            "SELECT queue_id, message_id, delivery_count FROM entries WHERE delivery_count > 0"):
        loaded.delivery_counts.setdefault(queue_id, {})[message_id] = count
    loaded.held = db.execute(HELD).fetchone() or (0, 0)
    loaded.next_message_id = highest + 1
    loaded.delayed, loaded.next_delayed = delayed_table.load(db)
    return loaded


def queue_spans(db):
    """
    C{(queue id, entries, lowest message id, highest)} of each queue with
    entries. Counting all entries is cheap (SQLite counts the cells of the
    key's pages); counting a queue's walks its rows, so it is done only
    when several queues hold entries. The lowest and highest are seeks.
    """
    (total,) = db.execute("SELECT count(*) FROM entries").fetchone()
    if not total:
        return []
    (first,) = db.execute("SELECT min(queue_id) FROM entries").fetchone()
    (last,) = db.execute("SELECT max(queue_id) FROM entries").fetchone()
    counts = [(first, total)] if first == last else db.execute(QUEUE_COUNTS).fetchall()
    return [(queue_id, count, db.execute(LOWEST, (queue_id,)).fetchone()[0],
             db.execute(HIGHEST, (queue_id,)).fetchone()[0]) for queue_id, count in counts]


def queue_handles(db, queue_id, count, lowest, highest):
    """The message ids of C{queue_id}'s C{count} entries, in queue order, as an array."""
    if highest - lowest + 1 == count:  # no gap (ids are distinct): a range, read no further
        return array("Q", range(lowest, highest + 1))
    (text,) = db.execute(QUEUE_IDS, (queue_id,)).fetchone()
    handles = array("Q", bytes.fromhex(text or ""))
    if sys.byteorder == "little":
        handles.byteswap()
    return handles


def load_topology(db, path, loaded):
    """Add the exchanges, queues and bindings of the file at C{path} to C{loaded}, in creation
    order, and quarantine each row whose record does not parse."""
    for rowid, vhost, name, blob in db.execute(
            "SELECT rowid, vhost, name, record FROM exchanges ORDER BY rowid"):
        record = parse_record(messages_pb2.ExchangeRecord, blob,
                              f"exchange {name!r} of vhost {vhost!r}", path)
        if record is None:
            loaded.quarantined.append(QuarantinedRecord(
                "exchange", vhost, name, f"sqlite store {path}, exchanges row {rowid}",
                UNPARSABLE))
        else:
            loaded.exchanges.append(record)
    for queue_id, vhost, name, blob in db.execute(
            "SELECT id, vhost, name, record FROM queues ORDER BY id"):
        what = f"queue {name!r} of vhost {vhost!r}"
        record = None if blob is None else parse_record(messages_pb2.QueueRecord, blob, what, path)
        if blob is not None and record is None:
            loaded.quarantined.append(QuarantinedRecord(
                "queue", vhost, name, f"sqlite store {path}, queues row {queue_id}", UNPARSABLE))
        loaded.queues.append((queue_id, vhost, name, record))
        loaded.next_queue_id = queue_id + 1
    for rowid, vhost, exchange, queue, routing_key, arguments, blob in db.execute(
            "SELECT rowid, vhost, exchange, queue, routing_key, arguments, record FROM bindings"
            " ORDER BY rowid"):
        record = parse_record(messages_pb2.BindingRecord, blob, "a binding", path)
        if record is None:
            loaded.quarantined.append(QuarantinedRecord(
                "binding", vhost, (exchange, queue, routing_key),
                f"sqlite store {path}, bindings row {rowid}", UNPARSABLE))
        else:
            loaded.bindings.append((arguments, record))
    for rowid, vhost, source, destination, routing_key, arguments, blob in db.execute(
            "SELECT rowid, vhost, source, destination, routing_key, arguments, record"
            " FROM exchange_bindings ORDER BY rowid"):
        record = parse_record(messages_pb2.BindingRecord, blob, "a binding", path)
        if record is None:
            loaded.quarantined.append(QuarantinedRecord(
                "binding", vhost, (source, "", routing_key, destination),
                f"sqlite store {path}, exchange_bindings row {rowid}", UNPARSABLE))
        else:
            loaded.bindings.append((arguments, record))


def parse_record(kind, blob, what, path):
    """
    The record of C{kind} in C{blob}; None if the blob does not parse
    (its row is then quarantined: left as it is, and not served).

    @raise StoreCorrupted: if C{blob} is not bytes at all.
    """
    if not isinstance(blob, bytes):
        raise StoreCorrupted(
            f"sqlite store {path}: the record of {what} is damaged"
            f" (not a blob but {type(blob).__name__})",
            path=path,
        )
    return parse_or_none(kind, blob)
