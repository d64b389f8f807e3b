"""The in-memory store: the reference implementation of the store contract.

Nothing survives a restart; it is the store for transient use and tests.
"""

from zope.interface import implementer

from backends.memory.store import MemoryStore
from brokerd.interfaces import IStoreBackend


@implementer(IStoreBackend)
class MemoryBackend:
    name = "memory"
    description = "keeps everything in memory; nothing survives a restart"
    options = {}

    def make_store(self, data_dir, sync_policy=None, *, reactor, **options):
        """A new L{MemoryStore}: it keeps no files and commits nothing, so it needs neither the
        policy nor the reactor."""
        return MemoryStore()


backend = MemoryBackend()

__all__ = ["MemoryStore", "backend"]
