"""The sqlite store's delayed messages as the reactor thread keeps them
(L{DelayedRows}): which handles are kept, as a
L{HandleMap<backends.common.handle_map.HandleMap>}, and the next handle to
give out. A delay or a release is buffered in the batch the store gives it;
windows are read from the writer thread's table (L{backends.sqlite.delayed}),
with the delays not yet handed to it.
"""

from twisted.internet import defer
from twisted.logger import Logger

from backends.common.delayed_requests import (
    check_due,
    check_exchange,
    delayed_window,
    readable_messages,
)
from backends.common.handle_map import HandleMap
from backends.sqlite.database import checksum
from backends.sqlite.delayed import delayed_message
from brokerd.proto import messages_pb2

log = Logger()


class DelayedRows:
    """
    The kept delayed messages' handles, on the reactor thread.

    @param path: the database file, for errors and log lines.
    @param writer_thread: the store's L{backends.common.writer_thread.WriterThread},
        which windows are read on.
    @param database: the store's L{backends.sqlite.database.Database}.
    """

    def __init__(self, path, writer_thread, database):
        self.path = path
        self._writer_thread = writer_thread
        self._database = database
        self._kept = HandleMap()  # the kept delayed handles
        self._next_handle = 1

    def loaded(self, kept, next_handle):
        """Take what the writer thread's open found: the kept handles (a HandleMap set) and the
        next handle to give out."""
        self._kept = kept
        self._next_handle = next_handle

    def __len__(self):
        return len(self._kept)

    def delay(self, batch, message, exchange, due):
        """Keep C{message} for C{exchange} until C{due}, a row buffered in C{batch}; its
        handle."""
        check_due(due)
        vhost, name = check_exchange(exchange)
        handle = self._next_handle
        self._next_handle = handle + 1
        body = bytes(message.body)
        record = messages_pb2.StoredMessage(
            exchange=message.exchange, routing_key=message.routing_key,
            properties=message.properties,
        ).SerializeToString()
        batch.delays[handle] = (due, handle, vhost, name, checksum(record, body), record, body)
        batch.next_delayed = self._next_handle
        self._kept.add(handle)
        return handle

    def release(self, batch, handle):
        """Stop keeping C{handle}, if it is kept: its row leaves C{batch} if it is buffered there,
        else C{batch}'s commit releases it."""
        if type(handle) is not int or handle < 0 or self._kept.pop(handle) is None:
            return
        if handle in batch.delays:
            del batch.delays[handle]  # never written
        else:
            batch.delay_releases.append(handle)

    def window(self, pending, cursor, until, limit):
        """
        A Deferred firing with the DelayedMessages of a window (see
        L{brokerd.interfaces.IDelayedMessageStore.delayed_after}), C{pending}
        the rows of delays not yet handed to the writer thread; or with None
        if a row of it was quarantined, so that the window is asked for again.
        """
        if self._writer_thread.state != "open":
            return defer.fail(RuntimeError(f"sqlite store {self.path} is not open"))

        def fetch(position, bound, count):
            return self._writer_thread.call(self._database.delayed_after, position, bound, count)

        kept = self._kept.__contains__
        rows = delayed_window(fetch, pending, kept, cursor, until, limit)
        return rows.addCallback(self._delayed_messages)

    def _delayed_messages(self, rows):
        """
        The window's DelayedMessages. One whose record does not parse is
        quarantined: logged, no longer counted as kept (so the window asked
        for again leaves it out), and its row kept as it is; then None.
        """
        found, quarantined = readable_messages(
            rows, lambda row: delayed_message(row, self.path, checksum), self._quarantine_delayed)
        if quarantined:
            return None
        return found

    def _quarantine_delayed(self, row, problem):
        due, handle, vhost, exchange = row[:4]
        log.error("delayed message {handle} for exchange {exchange!r} in vhost {vhost!r}"
                  " (due {due}) is quarantined, not routed, and its row kept as it is: {problem}",
                  handle=handle, exchange=exchange, vhost=vhost, due=due, problem=problem)
        self._kept.pop(handle)
