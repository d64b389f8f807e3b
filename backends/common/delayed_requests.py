"""What the stores share on the reactor side of delayed messages
(L{brokerd.interfaces.IDelayedMessageStore}): checking arguments, giving out
handles that keep increasing across restarts, and answering C{delayed_after}
from a writer-thread query plus the delays not yet handed to the writer.

Every backend's C{store.py} checks its arguments here. The file-based stores
(filelog, chunked) give out handles with a L{HandleLease}, whose limit their
writer thread persists in the meta file (L{backends.common.delayed_meta});
the durable stores (sqlite, filelog, chunked) answer windows with
L{delayed_window} and L{readable_messages}.
"""

from twisted.internet import defer

from brokerd.interfaces import UnreadableMessage

MAX_DUE = (1 << 63) - 1
LEASE = 1 << 16  # handles reserved on disk at a time by the file-based stores


def check_due(due):
    """C{due} if it is an int of milliseconds a store can keep (0 <= due < 2**63);
    else ValueError."""
    if type(due) is not int or not 0 <= due <= MAX_DUE:
        raise ValueError("a delayed message's due time is an int of milliseconds since the epoch,"
                         f" not {due!r}")
    return due


def check_exchange(exchange):
    """C{exchange} as a C{(vhost, name)} tuple of strings; else ValueError."""
    try:
        vhost, name = exchange
    except (TypeError, ValueError):
        vhost = name = None
    if not isinstance(vhost, str) or not isinstance(name, str):
        raise ValueError(f"a delayed exchange is a (vhost, name) key of strings, not {exchange!r}")
    return (vhost, name)


def key_of(row):
    return (row[0], row[1])


def check_cursor(cursor):
    """C{cursor} as a C{(due, handle)} tuple, or None; else ValueError."""
    if cursor is None:
        return None
    try:
        due, handle = cursor
    except (TypeError, ValueError):
        due = handle = None
    if not isinstance(due, int) or not isinstance(handle, int):
        raise ValueError(f"a cursor is a (due, handle) pair of ints, or None, not {cursor!r}")
    return (due, handle)


class HandleLease:
    """
    Gives out delayed-message handles for a store that keeps, on disk, a
    limit below which every handle given out lies: the limit is moved ahead
    by L{LEASE} handles at a time, half a lease before it is reached, and the
    store persists it (C{changed}) in the commit that follows. After a restart
    handles start at the persisted limit, above everything given out before.
    """

    def __init__(self, limit=1):
        self.next = max(limit, 1)
        self.limit = self.next
        self.changed = False

    def take(self):
        handle = self.next
        self.next = handle + 1
        if self.next + LEASE // 2 > self.limit:
            self.limit = self.next + LEASE
            self.changed = True
        return handle

    def persist(self):
        """The limit to write if it changed since the last call, else None."""
        if not self.changed:
            return None
        self.changed = False
        return self.limit


@defer.inlineCallbacks
def delayed_window(fetch, pending, kept, cursor, until, limit):
    """
    The rows C{delayed_after(cursor, until, limit)} answers, before they are
    made into L{DelayedMessage}s.

    @param fetch: C{fetch(cursor, until, count)} returns a Deferred firing
        with up to C{count} rows of what the writer thread holds, sorted, each
        a tuple starting C{(due, handle)}; it may hold handles released since
        (C{kept} filters them) and, in a second call, rows of C{pending}.
    @param pending: rows of delays not yet handed to the writer thread, in any order.
    @param kept: C{kept(handle)} is True while the handle is not released.
    @return: a Deferred firing with the list of rows.
    """
    cursor = check_cursor(cursor)
    if limit <= 0:
        return []
    waiting = sorted(
        (row for row in pending if (cursor is None or key_of(row) > cursor) and row[0] <= until),
        key=key_of)
    rows, position, exhausted = [], cursor, False
    while len(rows) < limit:
        fetched = yield fetch(position, until, limit)
        rows += [row for row in fetched if kept(row[1])]
        if len(fetched) < limit:
            exhausted = True
            break
        position = key_of(fetched[-1])
    seen = {row[1] for row in rows}
    rows += [row for row in waiting if row[1] not in seen and kept(row[1])]
    rows.sort(key=key_of)
    if not exhausted:
        # The writer's rows are complete only up to the last one fetched.
        rows = [row for row in rows if key_of(row) <= position]
    return rows[:limit]


def readable_messages(rows, convert, quarantine):
    """
    The L{DelayedMessage}s C{convert(row)} makes of C{rows}, and how many rows
    it could not: each of those (C{convert} raised L{UnreadableMessage}) goes
    to C{quarantine(row, problem)}, which must stop the store from counting
    its handle as kept, so that the window asked for again leaves it out and
    still holds as many messages as a window may.
    """
    found, quarantined = [], 0
    for row in rows:
        try:
            found.append(convert(row))
        except UnreadableMessage as problem:
            quarantine(row, problem)
            quarantined += 1
    return found, quarantined
