"""The delayed-message contract for the memory backend."""

from twisted.trial import unittest

import tests.backends.memory.test_store as memory_tests
from tests.support.delayed_store_contract import DelayedStoreContract


class MemoryDelayedStoreTests(DelayedStoreContract, unittest.TestCase):
    make_store = memory_tests.MemoryStoreContractTests.make_store
    reopen = memory_tests.MemoryStoreContractTests.reopen
