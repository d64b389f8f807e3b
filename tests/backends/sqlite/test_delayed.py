"""The delayed-message contract for the sqlite backend, plus what is particular
to it: the table and its index, releases purged in bulk, damaged rows, and
files of schema version 2, from before delayed messages."""

import os

from twisted.internet import defer, reactor
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from backends.sqlite import SCHEMA_VERSION, SqliteStore
from backends.sqlite import delayed as sqlite_delayed
from brokerd.interfaces import StoreCorrupted
from brokerd.storage.durability import SyncPolicy
from tests.support.delayed_store_contract import DELAYS, FOREVER, NOW, DelayedStoreContract, bodies, delayed
from tests.support.sqlite_stores import SqliteStores, query, temporary_directory
from tests.support.store_contract import JOBS, message, queue_record


class SqliteDelayedStoreTests(SqliteStores, DelayedStoreContract, unittest.TestCase):
    pass


class SqliteDelayedTableTests(unittest.TestCase):
    """The file itself, read through connections of the test's own."""

    timeout = 60

    def setUp(self):
        self.path = os.path.join(temporary_directory(self), "store", "brokerd.sqlite")

    @defer.inlineCallbacks
    def opened(self):
        store = SqliteStore(self.path, SyncPolicy("always"), reactor=reactor)
        yield store.open()
        self.addCleanup(store.close)
        return store

    @defer.inlineCallbacks
    def test_the_delayed_table_is_indexed_by_due_time_then_handle(self):
        store = yield self.opened()
        yield store.close()
        columns = [row[2] for row in query(self.path, "PRAGMA index_info(delayed_due)")]
        self.assertEqual(columns, ["due", "handle"])
        for statement, parameters in ((sqlite_delayed.WINDOW_FROM_START, (NOW, 10)),
                                      (sqlite_delayed.WINDOW_SAME_DUE, (NOW, 5, 10)),
                                      (sqlite_delayed.WINDOW_LATER, (NOW, NOW + 10, 10))):
            plan = " ".join(row[-1] for row in query(self.path, "EXPLAIN QUERY PLAN " + statement, *parameters))
            self.assertIn("USING INDEX delayed_due", plan)
            self.assertNotIn("TEMP B-TREE", plan, "rows come in index order, no sort")

    @defer.inlineCallbacks
    def test_released_rows_are_purged_in_bulk(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(10)]
        yield store.sync()
        for handle in handles[:3]:
            store.release(handle)
        yield store.close()
        self.assertEqual(query(self.path, "SELECT count(*) FROM delayed"), [(10,)])
        self.assertEqual(query(self.path, "SELECT handle FROM delayed_released ORDER BY handle"),
                         [(handle,) for handle in handles[:3]])
        store = yield self.opened()  # opening purges
        yield store.close()
        self.assertEqual(query(self.path, "SELECT handle FROM delayed ORDER BY handle"),
                         [(handle,) for handle in handles[3:]])
        self.assertEqual(query(self.path, "SELECT count(*) FROM delayed_released"), [(0,)])
        store = yield self.opened()
        for handle in handles[3:9]:
            store.release(handle)  # more than half the table: purged in the same commit
        yield store.close()
        self.assertEqual(query(self.path, "SELECT handle FROM delayed"), [(handles[9],)])

    @defer.inlineCallbacks
    def test_a_damaged_row_fails_its_window_naming_the_file(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(3)]
        yield store.close()
        query(self.path, "UPDATE delayed SET body = ? WHERE handle = ?", b"rot", handles[1])
        store = yield self.opened()
        self.assertEqual(bodies((yield store.delayed_after(None, NOW, 10))), [b"m0"])
        failure = yield self.assertFailure(store.delayed_after(None, FOREVER, 10), StoreCorrupted)
        self.assertEqual(failure.path, self.path)
        self.assertIn("delayed message %d" % handles[1], str(failure))

    @defer.inlineCallbacks
    def test_a_file_of_schema_version_2_is_upgraded_in_place(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"from version 2"), [JOBS])
        yield store.close()
        for statement in ("DROP TABLE delayed", "DROP TABLE delayed_released", "DROP TABLE counters",
                          "ALTER TABLE entries DROP COLUMN delivery_count", "DROP TABLE exchange_bindings",
                          "PRAGMA user_version = 2"):
            query(self.path, statement)
        logged = []
        observer = lambda event: logged.append(formatEvent(event))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        store = yield self.opened()
        self.assertEqual([record.body for _, record, _ in store.recover(JOBS)], [b"from version 2"])
        self.assertTrue([text for text in logged if "schema version 2 upgraded to 6 (delayed messages, delivery counts,"
                                                   " exchange-to-exchange bindings, held-message books)"
                         in text], logged)
        handle = store.delay(delayed(b"later"), DELAYS, NOW)
        yield store.close()
        self.assertEqual(query(self.path, "PRAGMA user_version"), [(SCHEMA_VERSION,)])
        self.assertEqual(SCHEMA_VERSION, 6)
        store = yield self.opened()
        found = yield store.delayed_after(None, FOREVER, 10)
        self.assertEqual([(item.handle, item.record.body) for item in found], [(handle, b"later")])
        self.assertEqual([record.body for _, record, _ in store.recover(JOBS)], [b"from version 2"])
