"""The store contract for the sqlite backend, plus what is particular to it:
one row per message, WAL and the synchronous setting, the schema version, and
damaged files."""

import os
import sqlite3
import zlib

from twisted.internet import defer, reactor
from twisted.logger import globalLogPublisher
from twisted.trial import unittest

from backends.sqlite import SCHEMA_VERSION, SqliteStore, StoreOpenError, backend
from brokerd.errors import NotFound
from brokerd.interfaces import StoreCorrupted
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy
from tests.support.broker import make_broker, open_channel
from tests.support.sqlite_stores import SqliteStores, crash_copy, query, temporary_directory
from tests.support.store_contract import (
    AUDIT,
    JOBS,
    StoreContract,
    binding_ends,
    binding_record,
    exchange_binding_record,
    exchange_record,
    message,
    queue_record,
)
from tests.support.store_contract_durable import DurableStoreContract


class SqliteStoreContractTests(SqliteStores, StoreContract, unittest.TestCase):
    pass


class SqliteDurableStoreContractTests(SqliteStores, DurableStoreContract, unittest.TestCase):
    pass


def bodies(store, queue):
    return [record.body for _, record, _ in store.recover(queue)]


class SqliteBackendTests(unittest.TestCase):
    def test_is_registered_under_its_name(self):
        self.assertIs(registry.load_backend("sqlite"), backend)
        self.assertEqual(backend.name, "sqlite")
        self.assertEqual(set(backend.options), {"path", "cache_size"})

    def test_keeps_its_file_under_the_data_directory_unless_told_otherwise(self):
        self.assertEqual(registry.make_store("sqlite", "/var/lib/brokerd", reactor=reactor).path,
                         "/var/lib/brokerd/sqlite/brokerd.sqlite")
        self.assertEqual(registry.make_store("sqlite:path=/srv/b.db", "/var/lib/brokerd", reactor=reactor).path,
                         "/srv/b.db")

    def test_a_path_that_is_no_file_name_is_refused(self):
        directory = temporary_directory(self)
        for path in ("", ":memory:", directory):
            with self.assertRaises(registry.BackendError) as raised:
                registry.make_store(f"sqlite:path={path}", directory, reactor=reactor)
            self.assertIn("path", str(raised.exception))


class SqliteStoreTests(unittest.TestCase):
    """The file itself, read through connections of the test's own."""

    timeout = 60

    def setUp(self):
        self.path = os.path.join(temporary_directory(self), "store", "brokerd.sqlite")

    @defer.inlineCallbacks
    def opened(self, policy=None, path=None):
        store = SqliteStore(path or self.path, policy or SyncPolicy("always"), reactor=reactor)
        yield store.open()
        self.addCleanup(store.close)
        return store

    @defer.inlineCallbacks
    def filled(self, count=100, size=1000):
        """A closed store with C{count} messages on each of two queues; returns their bodies."""
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        held = {JOBS: [], AUDIT: []}
        for number in range(count):
            for queue, held_bodies in held.items():
                body = b"%s-%04d-" % (queue[1].encode(), number) + b"." * size
                store.append(message(body), [queue])
                held_bodies.append(body)
        yield store.close()
        return held

    def damage(self, change):
        with open(self.path, "rb") as damaged:
            data = bytearray(damaged.read())
        with open(self.path, "wb") as damaged:
            damaged.write(change(data))

    @defer.inlineCallbacks
    def assertOpenFails(self, kind, *words):
        store = SqliteStore(self.path, SyncPolicy("always"), reactor=reactor)
        error = yield self.assertFailure(store.open(), kind)
        for word in (self.path, *words):
            self.assertIn(str(word), str(error))
        return error

    # -- the file's layout and settings

    @defer.inlineCallbacks
    def test_a_message_for_two_queues_is_one_row(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        handle = store.append(message(b"shared"), [JOBS, AUDIT])
        yield store.close()
        self.assertEqual(query(self.path, "SELECT count(*) FROM messages"), [(1,)])
        self.assertEqual(query(self.path, "SELECT count(*) FROM entries WHERE message_id = ?", handle), [(2,)])

    @defer.inlineCallbacks
    def test_a_message_row_goes_with_its_last_entry(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        kept = store.append(message(b"kept"), [JOBS, AUDIT])
        dropped = store.append(message(b"dropped"), [JOBS, AUDIT])
        yield store.sync()
        store.ack(JOBS, kept)
        store.ack(JOBS, dropped)
        store.ack(AUDIT, dropped)
        yield store.close()
        self.assertEqual(query(self.path, "SELECT id FROM messages"), [(kept,)])
        self.assertEqual(query(self.path, "SELECT message_id FROM entries"), [(kept,)])

    @defer.inlineCallbacks
    def test_changes_undone_within_one_commit_leave_the_right_rows(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        store.append(message(b"gone with its queue"), [JOBS])
        shared = store.append(message(b"shared"), [JOBS, AUDIT])
        store.delete_queue(JOBS)
        store.save_queue(queue_record("jobs"))
        store.append(message(b"new"), [JOBS])
        store.ack(AUDIT, shared)
        store.ack(AUDIT, shared)  # a second ack of the same entry changes nothing
        kept = store.append(message(b"kept"), [JOBS, AUDIT])
        store.ack(JOBS, kept)
        store.ack(JOBS, kept)
        yield store.close()
        self.assertEqual(query(self.path, "SELECT count(*) FROM messages"), [(2,)])
        store = yield self.opened()
        self.assertEqual((bodies(store, JOBS), bodies(store, AUDIT)), ([b"new"], [b"kept"]))

    @defer.inlineCallbacks
    def test_wal_and_the_synchronous_setting_follow_the_sync_policy(self):
        for policy, synchronous in (("always", 2), ("interval:50", 2), ("none", 0)):
            path = os.path.join(temporary_directory(self), "brokerd.sqlite")
            store = yield self.opened(SyncPolicy.parse(policy), path)
            pragmas = yield store.pragmas()
            self.assertEqual((pragmas["journal_mode"], pragmas["synchronous"]), ("wal", synchronous), policy)
            yield store.close()
            # The journal mode is kept in the file; synchronous belongs to a connection.
            self.assertEqual(query(path, "PRAGMA journal_mode"), [("wal",)])

    @defer.inlineCallbacks
    def test_a_second_store_on_the_same_file_is_refused(self):
        yield self.opened()
        yield self.assertOpenFails(StoreOpenError, "locked")

    @defer.inlineCallbacks
    def test_close_while_opening_waits_for_the_open(self):
        store = SqliteStore(self.path, SyncPolicy("always"), reactor=reactor)
        opening = store.open()
        yield store.close()
        yield opening
        self.assertRaises(RuntimeError, store.save_queue, queue_record("jobs"))
        yield self.opened()  # the file is free again

    @defer.inlineCallbacks
    def test_a_failed_commit_fails_its_syncs_and_is_written_by_the_next(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"first"), [JOBS])
        yield store.sync()
        # A full disk, as SQLite sees it: the file may not grow past its size now.
        ((pages,),) = yield on_connection(store, "PRAGMA page_count")
        yield on_connection(store, f"PRAGMA max_page_count = {pages}")
        lost = []
        store.watch_commit_failures(lambda failure, appends: lost.extend(appends))
        big = store.append(message(b"big" * 100_000), [JOBS])
        yield self.assertFailure(store.sync(), sqlite3.OperationalError)
        self.assertEqual(lost, [(JOBS, big)])  # said to its watchers (the broker acks it), in one log line
        yield on_connection(store, "PRAGMA max_page_count = 1000000")
        store.append(message(b"after"), [JOBS])
        yield store.sync()
        yield store.close()
        store = yield self.opened()
        self.assertEqual(bodies(store, JOBS), [b"first", b"big" * 100_000, b"after"])

    @defer.inlineCallbacks
    def test_recovered_messages_are_marked_redelivered(self):
        yield self.filled(count=3)
        store = yield self.opened()
        self.assertEqual([redelivered for _, _, redelivered in store.recover(JOBS)], [True] * 3)

    # -- the schema version

    @defer.inlineCallbacks
    def test_a_file_of_a_newer_schema_version_is_refused(self):
        yield self.filled(count=1)
        query(self.path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        yield self.assertOpenFails(StoreOpenError, f"version {SCHEMA_VERSION + 1}", f"version {SCHEMA_VERSION}")

    @defer.inlineCallbacks
    def test_a_file_of_schema_version_3_gains_delivery_counts(self):
        held = yield self.filled(count=2)
        query(self.path, "ALTER TABLE entries DROP COLUMN delivery_count")
        query(self.path, "DROP TABLE exchange_bindings")
        query(self.path, "PRAGMA user_version = 3")
        store = yield self.opened()
        recovered = list(store.recover(JOBS))
        self.assertEqual([record.body for _, record, _ in recovered], held[JOBS])
        self.assertEqual(store.delivery_counts(JOBS), {})
        store.returned(JOBS, recovered[1][0], 2)
        yield store.close()
        self.assertEqual(query(self.path, "PRAGMA user_version"), [(SCHEMA_VERSION,)])
        store = yield self.opened()
        self.assertEqual(store.delivery_counts(JOBS), {recovered[1][0]: 2})

    @defer.inlineCallbacks
    def test_a_file_of_schema_version_4_gains_exchange_to_exchange_bindings_in_place(self):
        store = yield self.opened()
        store.save_exchange(exchange_record("events"))
        store.save_exchange(exchange_record("audit"))
        store.save_queue(queue_record("jobs"))
        store.save_binding(binding_record("events", "jobs", "job.#"))
        yield store.close()
        query(self.path, "DROP TABLE exchange_bindings")
        query(self.path, "PRAGMA user_version = 4")
        store = yield self.opened()
        self.assertEqual(binding_ends(store), [("events", "jobs", "", "job.#")])
        store.save_binding(exchange_binding_record("events", "audit", "job.#"))
        yield store.close()
        self.assertEqual(query(self.path, "PRAGMA user_version"), [(SCHEMA_VERSION,)])
        store = yield self.opened()
        self.assertEqual(binding_ends(store), [("events", "", "audit", "job.#"), ("events", "jobs", "", "job.#")])

    @defer.inlineCallbacks
    def test_a_database_of_another_program_is_refused(self):
        os.makedirs(os.path.dirname(self.path))
        query(self.path, "CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
        yield self.assertOpenFails(StoreOpenError, "schema version 0")
        self.assertEqual(query(self.path, "SELECT count(*) FROM accounts"), [(0,)])

    # -- missing, empty and damaged files

    @defer.inlineCallbacks
    def test_a_missing_file_and_directory_are_created(self):
        self.assertFalse(os.path.exists(os.path.dirname(self.path)))
        store = yield self.opened()
        self.assertEqual(list(store.topology()), [])
        yield store.close()
        self.assertEqual(query(self.path, "PRAGMA user_version"), [(SCHEMA_VERSION,)])

    @defer.inlineCallbacks
    def test_an_empty_file_is_a_new_store(self):
        os.makedirs(os.path.dirname(self.path))
        open(self.path, "wb").close()
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"first"), [JOBS])
        yield store.close()
        store = yield self.opened()
        self.assertEqual(bodies(store, JOBS), [b"first"])

    @defer.inlineCallbacks
    def test_a_file_that_is_not_a_database_fails_open_naming_it(self):
        os.makedirs(os.path.dirname(self.path))
        with open(self.path, "wb") as text:
            text.write(b"not a database\n" * 1000)
        yield self.assertOpenFails(StoreCorrupted, "not a database")

    @defer.inlineCallbacks
    def test_a_truncated_file_fails_open_naming_it(self):
        yield self.filled()
        self.damage(lambda data: data[: len(data) // 2 + 100])
        error = yield self.assertOpenFails(StoreCorrupted, "malformed")
        self.assertEqual(error.path, self.path)

    @defer.inlineCallbacks
    def test_garbage_appended_to_the_file_is_ignored_and_logged(self):
        held = yield self.filled()
        self.damage(lambda data: data + os.urandom(5000))
        warnings = []
        globalLogPublisher.addObserver(warnings.append)
        self.addCleanup(globalLogPublisher.removeObserver, warnings.append)
        store = yield self.opened()
        self.assertEqual((bodies(store, JOBS), bodies(store, AUDIT)), (held[JOBS], held[AUDIT]))
        self.assertTrue([event for event in warnings if event.get("extra") == 5000], warnings)
        store.append(message(b"after"), [JOBS])
        yield store.close()
        store = yield self.opened()
        self.assertEqual(bodies(store, JOBS), [*held[JOBS], b"after"])

    @defer.inlineCallbacks
    def test_flipped_bytes_in_a_message_make_only_its_queue_unavailable(self):
        held = yield self.filled()
        damaged_body = held[AUDIT][50]
        self.damage(lambda data: flip(data, data.index(damaged_body) + 20, 8))
        store = yield self.opened()
        self.assertEqual(bodies(store, JOBS), held[JOBS])
        error = self.assertRaises(StoreCorrupted, store.recover, AUDIT)
        self.assertEqual(error.path, self.path)
        self.assertIn("checksum", str(error))

    @defer.inlineCallbacks
    def test_flipped_bytes_in_a_table_page_fail_open(self):
        yield self.filled()
        ((root,),) = query(self.path, "SELECT rootpage FROM sqlite_master WHERE name = 'entries'")
        ((page_size,),) = query(self.path, "PRAGMA page_size")
        self.damage(lambda data: flip(data, (root - 1) * page_size, 8))
        yield self.assertOpenFails(StoreCorrupted, "sqlite3")

    @defer.inlineCallbacks
    def test_flipped_bytes_in_the_middle_of_the_file_are_reported_or_harmless(self):
        held = yield self.filled(count=400)
        self.damage(lambda data: flip(data, len(data) // 2, 16))
        store = SqliteStore(self.path, SyncPolicy("always"), reactor=reactor)
        try:
            yield store.open()
        except StoreCorrupted as error:
            self.assertEqual(error.path, self.path)
            return
        self.addCleanup(store.close)
        for queue in (JOBS, AUDIT):
            try:
                self.assertEqual(bodies(store, queue), held[queue])
            except StoreCorrupted as error:
                self.assertEqual(error.path, self.path)

    @defer.inlineCallbacks
    def test_an_unparseable_message_makes_its_queue_unavailable_in_a_broker(self):
        held = yield self.filled(count=10)
        ((damaged,),) = query(self.path, "SELECT min(message_id) FROM entries WHERE queue_id = 1")
        garbage = b"\xff" * 12
        query(self.path, "UPDATE messages SET record = ?, crc = ? WHERE id = ?", garbage, zlib.crc32(garbage), damaged)
        store = yield self.opened()
        error = self.assertRaises(StoreCorrupted, store.recover, JOBS)
        self.assertIn(self.path, str(error))
        self.assertIn(f"message {damaged} ", str(error))
        broker, _ = make_broker(store)
        self.assertEqual(broker.recover()["unavailable"], 0, "the store pages: damage is found when it is reached")
        channel, _ = open_channel(broker)
        with self.assertRaises(NotFound) as raised:
            channel.basic_get("jobs")
        self.assertIn("unavailable", str(raised.exception))
        self.assertEqual([channel.basic_get("audit")[2].body for _ in range(10)], held[AUDIT])

    @defer.inlineCallbacks
    def test_a_message_missing_from_the_messages_table_is_reported(self):
        yield self.filled(count=5)
        query(self.path, "DELETE FROM messages WHERE id = (SELECT max(message_id) FROM entries WHERE queue_id = 2)")
        store = yield self.opened()
        self.assertEqual(len(bodies(store, JOBS)), 5)
        error = self.assertRaises(StoreCorrupted, store.recover, AUDIT)
        self.assertIn("missing", str(error))

    @defer.inlineCallbacks
    def test_a_torn_write_ahead_log_tail_loses_only_the_torn_commit(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"whole"), [JOBS])
        yield store.sync()
        store.append(message(b"torn"), [JOBS])
        yield store.sync()
        copy = yield crash_copy(store, temporary_directory(self))
        with open(copy + "-wal", "r+b") as wal:
            wal.truncate(os.path.getsize(copy + "-wal") - 100)
        crashed = yield self.opened(path=copy)
        self.assertEqual(bodies(crashed, JOBS), [b"whole"])
        crashed.append(message(b"after"), [JOBS])
        yield crashed.close()
        crashed = yield self.opened(path=copy)
        self.assertEqual(bodies(crashed, JOBS), [b"whole", b"after"])

    # -- every sync policy

    @defer.inlineCallbacks
    def test_many_messages_come_back_under_each_sync_policy(self):
        for policy in (SyncPolicy("always"), SyncPolicy("interval", 0.01), SyncPolicy("none")):
            path = os.path.join(temporary_directory(self), "brokerd.sqlite")
            store = yield self.opened(policy, path)
            store.save_queue(queue_record("jobs"))
            store.save_queue(queue_record("audit"))
            expected = {JOBS: [], AUDIT: []}
            for number in range(3000):
                body = b"m%05d" % number
                queues = [JOBS, AUDIT] if number % 3 == 0 else [JOBS]
                handle = store.append(message(body), queues)
                for queue in queues:
                    expected[queue].append((handle, body))
                if number % 500 == 499:
                    yield store.sync()
            for handle, _ in expected[JOBS][::4]:
                store.ack(JOBS, handle)
            del expected[JOBS][::4]
            yield store.sync()
            stats = store.stats()
            self.assertEqual(stats["appends"], 3000, policy)
            self.assertGreater(stats["commits"], 1, policy)
            self.assertEqual(stats["fsyncs"] > 0, policy.fsyncs, policy)
            yield store.close()
            store = yield self.opened(policy, path)
            for queue in (JOBS, AUDIT):
                self.assertEqual(bodies(store, queue), [body for _, body in expected[queue]], (policy, queue))
            self.assertEqual(store.stats()["messages"], len({h for q in expected.values() for h, _ in q}), policy)
            yield store.close()


def on_connection(store, sql):
    """Rows of C{sql} run on the store's own connection, on its writer thread."""
    return store._writer_thread.call(lambda: store._db._db.execute(sql).fetchall())


def flip(data, offset, count):
    """C{data} with C{count} bytes from C{offset} on inverted."""
    for index in range(offset, offset + count):
        data[index] ^= 0xFF
    return data
