"""The chunked store's delayed messages as the reactor thread keeps them
(L{DelayedHandles}): per kept handle its due time and the message chunk its
record is in, the lease handles come from, the delayed exchanges by number
and what damage makes delayed messages unavailable.

The records themselves go to the message log with the store's batch, and the
writer thread indexes them by due time (L{backends.chunked.delayedindex}); the
meta file it keeps beside that index holds the lease's limit, the bucket width
and the exchanges by number, written again whenever they change
(L{DelayedHandles.meta}).
"""

from backends.chunked.delayedindex import KEPT_TYPECODES
from backends.common.delayed_meta import Meta
from backends.common.delayed_requests import HandleLease
from backends.common.handle_map import HandleMap
from brokerd.interfaces import StoreCorrupted


class DelayedHandles:
    """
    The kept delayed messages' handles, on the reactor thread.

    @ivar damage: the L{StoreCorrupted} that makes delayed messages
        unavailable (found at open, or in a bucket file since), or None.
    """

    def __init__(self, bucket_ms):
        self.damage = None
        self._kept = HandleMap(KEPT_TYPECODES)  # kept delayed handle -> (due, chunk number)
        self._lease = HandleLease()
        self._exchanges = []  # delayed exchange keys by number
        self._exchange_numbers = {}  # delayed exchange key -> number
        self._width = bucket_ms
        self._meta_changed = False

    def recovered(self, delayed):
        """Take what the writer's open found (a
        L{ChunkedDelayedRecovery<backends.chunked.delayedindex.ChunkedDelayedRecovery>})."""
        self._kept = delayed.kept
        self._lease = HandleLease(delayed.next_handle)
        self._exchanges = list(delayed.exchanges)
        self._exchange_numbers = {key: number for number, key in enumerate(self._exchanges)}
        self._width = delayed.width
        self.damage = delayed.damage

    def unavailable(self):
        """The L{StoreCorrupted} to fail delayed calls with, while there is damage."""
        damage = self.damage
        return StoreCorrupted(f"delayed messages are unavailable: {damage}", damage.path,
                              damage.offset)

    def found_damage(self, damage):
        """A window found damage in the index: delayed messages are unavailable from now on."""
        if self.damage is None:
            self.damage = damage

    def exchange_number(self, exchange):
        """The number of a delayed exchange's key in the index, given it now if it has none."""
        number = self._exchange_numbers.get(exchange)
        if number is None:
            number = self._exchange_numbers[exchange] = len(self._exchanges)
            self._exchanges.append(exchange)
            self._meta_changed = True
        return number

    def exchange(self, number):
        """The key of delayed exchange C{number}."""
        return self._exchanges[number]

    def keep(self, due, chunk):
        """A new handle, kept with its message's due time and the number of the chunk its record is
        in."""
        handle = self._lease.take()
        self._kept.add(handle, due, chunk)
        return handle

    def release(self, handle):
        """Stop keeping C{handle}: its C{(due, chunk)}, or None if it was not kept."""
        return self._kept.pop(handle)

    def is_kept(self, handle):
        return handle in self._kept

    def __len__(self):
        return len(self._kept)

    def meta(self):
        """The index's new L{Meta} if the lease's limit or the exchanges changed since the last
        call, else None."""
        if self._lease.persist() is None and not self._meta_changed:
            return None
        self._meta_changed = False
        return Meta(self._lease.limit, self._width, list(self._exchanges))
