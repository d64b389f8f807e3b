"""The delayed-message contract for the memory backend."""

from twisted.trial import unittest

from tests.support.delayed_store_contract import DelayedStoreContract
from tests.support.memory_stores import MemoryStores


class MemoryDelayedStoreTests(MemoryStores, DelayedStoreContract, unittest.TestCase):
    pass
