"""Memory stores for the store contracts (L{MemoryStores})."""

import tempfile

from twisted.internet import defer, reactor

from backends.memory import backend


class MemoryStores:
    """How the contract suites make and reopen a memory store (mixed into their test cases)."""

    def make_store(self):
        return backend.make_store(tempfile.gettempdir(), reactor=reactor)

    def reopen(self, store):
        # Nothing outlives the process: the store itself is what a reopen sees.
        return defer.succeed(store)
