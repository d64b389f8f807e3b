"""chunked: the chunk bytes ahead of a queue's deliveries are read into the page cache on a thread of the store's own,
so the reactor's reads through the maps find them there instead of waiting for the disk with the interpreter lock held.

Whether a range of a file is in the page cache is asked the way a reader that must not wait asks:
C{preadv(..., RWF_NOWAIT)}, which reads only what is cached (and starts the kernel's read-ahead from where it
missed, so each test asks about a range once). The files are written through the store,
closed, reopened, and dropped from the page cache (C{POSIX_FADV_DONTNEED}) before they are read again.

Of records with large bodies the thread also checks the CRCs, and the reactor's reads then check only the framing.
"""

import os
import shutil
import tempfile
import threading

from twisted.internet import defer, reactor
from twisted.trial import unittest

from backends.chunked import backend
from brokerd.interfaces import StoreCorrupted
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.storage.durability import SyncPolicy
from tests.support.broker import wait_until
from tests.support.store_contract import JOBS, queue_record

MIB = 1 << 20
BODY = 4096
MESSAGES = 15_000  # about 60 MiB of records in one 64 MiB chunk
FAR = (40 * MIB, MIB)  # beyond the kernel's own read-ahead of the first 50 reads (16-21 MiB here)
# Where eviction is checked: a read that finds nothing cached starts the kernel's read-ahead from there on,
# so it is asked past FAR and past the read-ahead windows of the tests.
EVICTION_PROBE = (56 * MIB, MIB)


def persistent(number, size=BODY):
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id=str(number))
    return Message("", "jobs", properties, (b"%06d" % number).ljust(size, b"."))


def cached(path, start, length):
    """True if the whole range is in the page cache (read without waiting for the disk)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        return os.preadv(descriptor, [bytearray(length)], start, os.RWF_NOWAIT) == length
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)


def evict(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


class ReadAheadTests(unittest.TestCase):
    def setUp(self):
        self.data_dir = tempfile.mkdtemp(prefix="brokerd-readahead-test-")
        self.addCleanup(shutil.rmtree, self.data_dir, True)

    @defer.inlineCallbacks
    def open_store(self, **options):
        store = backend.make_store(self.data_dir, SyncPolicy(), reactor=reactor,
                                   **{"chunk_size": "64M", "cache_size": "0", **options})
        self.addCleanup(store.close)
        yield store.open()
        return store

    @defer.inlineCallbacks
    def filled(self, messages=MESSAGES, size=BODY):
        """Write the messages and close the store; the path of its chunk."""
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        for number in range(messages):
            store.append(persistent(number, size), [JOBS])
        yield store.sync()
        yield store.close()
        return os.path.join(store.directory, "message-chunk-000000000")

    @defer.inlineCallbacks
    def read_first(self, path, count, **options):
        """Reopen the store, drop its chunk from the page cache (opening reads the last chunk), and load the
        first C{count} messages in queue order, checking each: the store."""
        store = yield self.open_store(**options)
        evict(path)
        if cached(path, *EVICTION_PROBE):
            raise unittest.SkipTest("the page cache of this file system cannot be emptied here")
        handles = list(store.recovered_handles(JOBS))
        self.assertEqual(len(handles), MESSAGES)
        for number, handle in enumerate(handles[:count]):
            self.assertEqual(store.load(handle).body, persistent(number).body)
        return store

    @defer.inlineCallbacks
    def test_deliveries_read_in_order_bring_the_window_ahead_into_the_page_cache(self):
        path = yield self.filled()
        plain = yield self.read_first(path, 50, read_ahead="0")  # about 200 KiB read
        self.assertEqual(plain.stats()["read_ahead_bytes"], 0)
        if cached(path, *FAR):
            raise unittest.SkipTest("the kernel's own read-ahead reaches 40 MiB ahead here")
        yield plain.close()
        store = yield self.read_first(path, 50, read_ahead="48M")
        yield wait_until(lambda: store.stats()["read_ahead_bytes"] >= 45 * MIB, timeout=30)
        self.assertTrue(cached(path, *FAR), "40 MiB ahead of the reads is cached")
        self.assertEqual(store.stats()["chunk_reads"], 50)

    @defer.inlineCallbacks
    def test_the_window_moves_on_with_the_reads_and_the_thread_stops_with_the_store(self):
        path = yield self.filled()
        self.threads_before = {thread.ident for thread in threading.enumerate()}
        store = yield self.read_first(path, 1, read_ahead="1M")
        yield wait_until(lambda: store.stats()["read_ahead_bytes"] >= MIB - 8192, timeout=30)
        first = store.stats()["read_ahead_bytes"]
        self.assertLessEqual(first, MIB, "one window, not the chunk")
        for handle in list(store.recovered_handles(JOBS))[1:400]:  # about 1.6 MiB on
            store.load(handle)
        yield wait_until(lambda: store.stats()["read_ahead_bytes"] >= 2 * MIB, timeout=30)
        [thread] = [thread for thread in threading.enumerate() if thread.name == "chunked read-ahead"
                    and thread.ident not in self.threads_before]
        yield store.close()
        self.assertFalse(thread.is_alive())

    @defer.inlineCallbacks
    def test_the_thread_checks_the_crcs_of_large_records_it_reads_ahead(self):
        path = yield self.filled(messages=2000)
        store = yield self.open_store(read_ahead="1M")
        handles = list(store.recovered_handles(JOBS))
        store.load(handles[0])
        yield wait_until(lambda: store.stats()["read_ahead_checked_bytes"] >= MIB - 2 * BODY, timeout=30)
        self.assertLessEqual(store.stats()["read_ahead_checked_bytes"], MIB)
        for number, handle in enumerate(handles[:200]):
            self.assertEqual(store.load(handle).body, persistent(number).body)
        self.assertTrue(os.path.exists(path))

    @defer.inlineCallbacks
    def test_a_damaged_record_ahead_ends_what_the_thread_checked_and_its_read_still_fails(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        for number in range(2000):
            store.append(persistent(number), [JOBS])
        yield store.sync()
        store.append(persistent(2000), [JOBS])  # a second fsync: opening walks only what came after the first
        yield store.sync()
        yield store.close()
        path = os.path.join(store.directory, "message-chunk-000000000")
        with open(path, "r+b") as chunk:
            data = chunk.read()
            damaged = data.index(b"%06d." % 100) + 10  # a byte of message 100's body
            chunk.seek(damaged)
            chunk.write(b"!")
        store = yield self.open_store(read_ahead="1M")
        handles = list(store.recovered_handles(JOBS))
        self.assertEqual(len(handles), 2001)
        store.load(handles[0])
        yield wait_until(lambda: store.stats()["read_ahead_bytes"] >= MIB - 2 * BODY, timeout=30)
        self.assertGreater(store.stats()["read_ahead_checked_bytes"], 0)
        self.assertLess(store.stats()["read_ahead_checked_bytes"], 100 * (BODY + 100))
        for number, handle in enumerate(handles[1:100], start=1):
            self.assertEqual(store.load(handle).body, persistent(number).body)
        with self.assertRaises(StoreCorrupted):
            store.load(handles[100])

    @defer.inlineCallbacks
    def test_small_records_are_left_to_the_reactor_to_check(self):
        yield self.filled(messages=20_000, size=100)
        store = yield self.open_store(read_ahead="1M")
        handles = list(store.recovered_handles(JOBS))
        for handle in handles[:100]:
            store.load(handle)
        yield wait_until(lambda: store.stats()["read_ahead_bytes"] >= MIB - 8192, timeout=30)
        self.assertEqual(store.stats()["read_ahead_checked_bytes"], 0)
