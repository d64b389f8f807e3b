"""The store contract for the memory backend, plus what is particular to it."""

import tempfile

from twisted.internet import defer, reactor
from twisted.trial import unittest

from backends.memory import MemoryStore, backend
from tests.support.memory_stores import MemoryStores
from tests.support.store_contract import JOBS, StoreContract, message, queue_record
from tests.support.store_contract_durable import DurableStoreContract


class MemoryStoreContractTests(MemoryStores, StoreContract, unittest.TestCase):
    pass


class MemoryDurableStoreContractTests(MemoryStores, DurableStoreContract, unittest.TestCase):
    """Every test skips: nothing of a memory store outlives a restart."""


class MemoryStoreTests(unittest.TestCase):
    def test_is_not_durable(self):
        self.assertFalse(MemoryStore.durable)
        self.assertEqual(backend.name, "memory")

    @defer.inlineCallbacks
    def test_a_new_store_holds_nothing_of_an_earlier_one(self):
        first = MemoryStore()
        yield first.open()
        first.save_queue(queue_record("jobs"))
        first.append(message(b"lost on restart"), [JOBS])
        second = backend.make_store(tempfile.gettempdir(), reactor=reactor)
        yield second.open()
        self.assertEqual(list(second.topology()), [])
        self.assertEqual(list(second.recover(JOBS)), [])
