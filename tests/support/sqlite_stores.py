"""Sqlite stores for the store contracts (L{SqliteStores}) and what the sqlite tests share:
a crash's copy of a database, temporary directories and queries through a connection of their own."""

import os
import shutil
import sqlite3
import tempfile

from twisted.internet import defer, reactor

from backends.sqlite import SqliteStore, backend
from brokerd.storage.durability import SyncPolicy


class SqliteStores:
    """How the contract suites make, reopen and crash a sqlite store (mixed into their test cases)."""

    def make_store(self):
        return backend.make_store(temporary_directory(self), SyncPolicy("always"), reactor=reactor)

    @defer.inlineCallbacks
    def reopen(self, store):
        yield store.close()
        reopened = SqliteStore(store.path, store.policy, reactor=reactor)
        yield reopened.open()
        return reopened

    @defer.inlineCallbacks
    def reopen_after_crash(self, store):
        # The file is locked while its store is open, so the second store opens a
        # copy of the database and its write-ahead log as they are at this moment.
        copy = yield crash_copy(store, temporary_directory(self))
        reopened = SqliteStore(copy, store.policy, reactor=reactor)
        yield reopened.open()
        return reopened


def crash_copy(store, directory):
    """
    Copy C{store}'s database and write-ahead log into C{directory} as a crash
    would leave them (no checkpoint, no close), between two of its commits;
    returns a Deferred firing with the copy's path.
    """

    def copy():
        target = os.path.join(directory, os.path.basename(store.path))
        for suffix in ("", "-wal"):
            if os.path.exists(store.path + suffix):
                shutil.copyfile(store.path + suffix, target + suffix)
        return target

    return store._writer_thread.call(copy)  # on the writer thread: no commit runs meanwhile


def temporary_directory(testcase):
    """A new directory, removed when C{testcase} ends."""
    directory = tempfile.mkdtemp(prefix="brokerd-sqlite-test-")
    testcase.addCleanup(shutil.rmtree, directory, True)
    return directory


def query(path, sql, *parameters):
    """Rows of C{sql} run on the file through a connection of its own (the store must be closed)."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        return connection.execute(sql, parameters).fetchall()
    finally:
        connection.close()
