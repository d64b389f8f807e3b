"""The store contract for the chunked backend (EQueue's design)."""

import os
import shutil
import tempfile

from twisted.internet import defer
from twisted.trial import unittest

from backends.chunked import backend
from brokerd.durability import SyncPolicy
from tests.store_contract import StoreContract


class ChunkedStores:
    """Makes chunked stores on fresh or existing data directories, closed at test cleanup.

    Chunks are small (4 KiB of records, 64 index entries) so that the tests
    cross chunk boundaries with a few messages."""

    options = {"chunk_size": "4096", "index_chunk_entries": "64"}
    sync_policy = SyncPolicy()

    def fresh_data_dir(self):
        data_dir = tempfile.mkdtemp(prefix="brokerd-chunked-test-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        return data_dir

    def make_store(self, data_dir=None, **options):
        return backend.make_store(data_dir or self.fresh_data_dir(), self.sync_policy, **{**self.options, **options})

    @staticmethod
    def data_dir_of(store):
        return os.path.dirname(store.directory)

    @defer.inlineCallbacks
    def open_store(self, data_dir=None, **options):
        store = self.make_store(data_dir, **options)
        self.addCleanup(store.close)
        yield store.open()
        return store

    @defer.inlineCallbacks
    def reopen(self, store, **options):
        yield store.close()
        reopened = yield self.open_store(self.data_dir_of(store), **options)
        return reopened

    def reopen_after_crash(self, store):
        # The files as they are now, copied while the store stays open (it holds
        # their lock), are what a broker restarted after a crash would find.
        crashed = self.fresh_data_dir()
        shutil.copytree(store.directory, os.path.join(crashed, "chunked"))
        return self.open_store(crashed)


class ChunkedStoreContractTests(ChunkedStores, StoreContract, unittest.TestCase):
    pass
