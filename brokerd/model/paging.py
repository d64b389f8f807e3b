"""Paging: a persisted queue keeps some messages as store handles only and loads
each when it reaches a consumer.

Over a store that can load messages at once (L{brokerd.interfaces.IPagingStore}),
a deep queue keeps only the handle of each persistent message past its first
L{PAGE_OUT_DEPTH} ready ones, and so do the entries recovered at start (runs of
handles, see L{brokerd.model.ready}). A backlog then costs 8 bytes a message,
not its body and an object. A stored message that cannot be read is
quarantined (named in the log, never delivered); a store that fails raises one
of L{STORE_FAILURES}, and the queue becomes unavailable.
"""

from twisted.logger import Logger

from brokerd.interfaces import IPagingStore, StoreCorrupted, UnreadableMessage
from brokerd.model.message import Message

log = Logger()

PAGE_OUT_DEPTH = 2000  # ready messages a queue keeps in memory before it keeps handles only
# What a load raises when the store cannot serve the queue:
STORE_FAILURES = (KeyError, StoreCorrupted)


class MessagePager:
    """
    Loads the messages of one persisted queue back from its store, and says
    whether the queue keeps only the handles of its deep backlog.

    @ivar pages: True while the queue keeps only the handle of a persistent
        message past its first L{PAGE_OUT_DEPTH} ready ones: its store can
        load messages at once and its effective settings need no message in
        memory (priorities, TTLs, byte limits do).
    @ivar restored_counts: handle -> how often a recovered message had come
        back before the restart (x-delivery-count), until its entry takes it
        (see L{delivery_count}); empty once they all have.
    """

    def __init__(self, queue, store, watermark, expiry, settings):
        self._queue = queue
        self._store = store
        self._watermark = watermark
        self._expiry = expiry
        self._store_pages = queue.persisted and IPagingStore.providedBy(store)
        self.pages = self._store_pages and not settings.needs_messages
        self.restored_counts = {}

    def follow(self, settings):
        """
        The queue's effective settings changed: it pages from now on only if
        they need no message in memory.
        """
        self.pages = self._store_pages and not settings.needs_messages

    def restore_delivery_counts(self, counts):
        """
        How often recovered messages had come back before the restart (handle
        to count), given before they are.
        """
        self.restored_counts = dict(counts)

    def delivery_count(self, handle):
        """
        How often the recovered message of C{handle} had come back before the
        restart (asked once).
        """
        return self.restored_counts.pop(handle, 0)

    def load(self, handle):
        """
        The stored message of C{handle}, or None if its record cannot be read:
        it is then quarantined (see L{_quarantine}).

        @raise KeyError: if the store holds no message under C{handle}.
        @raise StoreCorrupted: if the store cannot read it back.
        """
        try:
            return Message.from_record(self._store.load(handle))
        except UnreadableMessage as problem:
            self._quarantine(handle, problem)
            return None

    def page_in(self, entry):
        """
        Load the message of an entry kept as a handle: counted in the memory
        watermark from now on, with its count of returns before a restart and
        its time to live (L{brokerd.model.expiry.MessageExpiry.start_loaded});
        False if it cannot be read and was quarantined.

        @raise KeyError: if the store holds no message under the entry's handle.
        @raise StoreCorrupted: if the store cannot read it back.
        """
        message = self.load(entry.handle)
        if message is None:
            return False
        entry.message = message
        if self.restored_counts:
            entry.delivery_count = self.restored_counts.pop(entry.handle, 0)
        self._watermark.add(len(message.body))
        self._expiry.start_loaded(entry)
        return True

    def load_backlog(self, ready):
        """
        Load every message C{ready} (the queue's L{brokerd.model.ready.ReadyList})
        keeps as a handle only, leaving the entries in order, so that a byte
        limit counts them; unreadable ones are quarantined and leave it.

        @raise KeyError: if the store holds no message under a handle.
        @raise StoreCorrupted: if the store cannot read one back; the entries
            are in order then, the one that failed at the head of those not loaded.
        """
        loaded = []
        try:
            while ready:
                entry = ready.popleft()
                if entry.message is None:
                    try:
                        if not self.page_in(entry):
                            continue  # unreadable: quarantined, and gone from the queue
                    except STORE_FAILURES:
                        ready.appendleft(entry)
                        raise
                loaded.append(entry)
        finally:
            ready.extendleft(reversed(loaded))

    def _quarantine(self, handle, problem):
        """A stored message that cannot be read: never delivered, named in the
        log, and acked so the queue forgets it (the store has kept its record
        aside)."""
        queue = self._queue
        log.error(
            "queue {queue!r} in vhost {vhost!r}: quarantined stored message {handle!r},"
            " not delivered: {problem}",
            queue=queue.name, vhost=queue.vhost.name, handle=handle, problem=problem,
        )
        self.restored_counts.pop(handle, None)
        if not queue.deleted:
            self._store.ack(queue.key, handle)
