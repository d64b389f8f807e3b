"""A queue's messages kept as store handles: restored at start and loaded when they reach a consumer.

Over a store that can load messages at once (L{brokerd.interfaces.IPagingStore}),
the entries recovered at start and those past a deep queue's first ready ones
keep only their store handle; L{QueuePaging} loads each when it is delivered.
A stored message that cannot be read is quarantined (named in the log, never
delivered); a store that fails makes the queue unavailable.
"""

from twisted.logger import Logger

from brokerd.interfaces import StoreCorrupted, UnreadableMessage
from brokerd.model.message import Message

log = Logger()


class QueuePaging:
    """Mixed into L{brokerd.model.queue.Queue}: restoring recovered messages and loading paged-out ones."""

    def restore_delivery_counts(self, counts):
        """
        How often recovered messages had come back before the restart (handle
        to count), given before they are restored: each entry takes its count
        when it is made, a paged one when it is loaded.
        """
        self._counts_before_restart = dict(counts)

    def restore_paged(self, handles):
        """
        Add stored messages recovered at start, flagged redelivered: by handle
        only (each loaded when delivered), unless the queue must see every
        message (priority, TTL, byte limit), which loads them now.
        """
        self._restored_at = self._expiry.now()
        if self.policy.needs_messages:
            for handle in handles:
                try:
                    message = Message.from_record(self._store.load(handle))
                except UnreadableMessage as problem:
                    self._quarantine(handle, problem)
                    continue
                except (KeyError, StoreCorrupted) as problem:
                    self._unreadable(problem)
                    return
                self.restore(message, handle, True)
            return
        sequence = self._next_sequence
        self._ready.append_paged(handles, sequence, True)
        self._next_sequence = sequence + len(handles)
        self._recovered_count += len(handles)
        self.watch_backlog()

    def restore(self, message, handle, redelivered):
        """Add a stored message recovered at start, loaded (not counted as published since start)."""
        self.enqueue(message, handle, redelivered)
        self._recovered_count += 1

    def _page_in(self, entry):
        """
        Load a paged-out entry's message. Returns True if it was loaded; None
        if it cannot be read and was quarantined (the queue goes on with the
        next); False if the store failed, and the queue became unavailable.
        """
        try:
            message = Message.from_record(self._store.load(entry.handle))
        except UnreadableMessage as problem:
            self._quarantine(entry.handle, problem)
            return None
        except (KeyError, StoreCorrupted) as problem:
            self._ready.appendleft(entry)
            self._unreadable(problem)
            return False
        entry.message = message
        if self._counts_before_restart:
            entry.delivery_count = self._counts_before_restart.pop(entry.handle, 0)
        self._watermark.add(len(message.body))
        ttl = self._ttl_of(message) if message.properties.HasField("expiration") else None
        if ttl is not None:
            published = message.published_at
            entry.expires_at = (published if published is not None else self._restored_at or self._expiry.now()) + ttl
        self._ready_bytes += len(message.body)
        return True

    def _quarantine(self, handle, problem):
        """A stored message that cannot be read: never delivered, named in the log, and forgotten here
        (the store has kept its record aside)."""
        log.error("queue {queue!r} in vhost {vhost!r}: quarantined stored message {handle!r}, not delivered: {problem}",
                  queue=self.name, vhost=self.vhost.name, handle=handle, problem=problem)
        self._counts_before_restart.pop(handle, None)
        if not self.deleted:
            self._store.ack(self.key, handle)

    def _unreadable(self, problem):
        log.error("queue {queue!r} in vhost {vhost!r} is unavailable: a stored message cannot be read: {problem}",
                  queue=self.name, vhost=self.vhost.name, problem=problem)
        self.vhost.mark_unavailable(self, f"a stored message cannot be read: {problem}")
        self._cancel_consumers()
