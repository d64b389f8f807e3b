"""The SQLite store: durable topology, messages and delayed messages in one
SQLite database in WAL mode, each group commit one transaction on a writer
thread; messages are read back on delivery through a read-only connection,
read ahead within C{cache_size} bytes."""

import os

from zope.interface import implementer

from backends.common.options import byte_size, given_options
from backends.sqlite.database import StoreOpenError
from backends.sqlite.schema import SCHEMA_VERSION
from backends.sqlite.store import SqliteStore
from brokerd.interfaces import IStoreBackend

DEFAULT_PATH = os.path.join("sqlite", "brokerd.sqlite")  # under the data directory


@implementer(IStoreBackend)
class SqliteBackend:
    name = "sqlite"
    description = "one SQLite database (WAL); a message routed to several queues is stored once"
    options = {
        "path": ("<data-dir>/sqlite/brokerd.sqlite", "database file"),
        "cache_size": ("16M", "bytes of messages read ahead (the rows after the one delivered)"
                              " kept in memory"),
    }

    def make_store(self, data_dir, sync_policy=None, *, reactor, **options):
        given = given_options(self, options)
        cache_size = byte_size("cache_size", given["cache_size"], 0)
        path = options.get("path")
        if path is None:
            path = os.path.join(data_dir, DEFAULT_PATH)
        elif not path or path == ":memory:" or path.startswith("file:"):
            raise ValueError(f"option 'path' needs the name of a database file, not {path!r}")
        if os.path.isdir(path):
            raise ValueError(f"option 'path' names a directory, not a database file: {path!r}")
        return SqliteStore(path, sync_policy, reactor=reactor, cache_size=cache_size)


backend = SqliteBackend()

__all__ = ["SCHEMA_VERSION", "SqliteStore", "StoreOpenError", "backend"]
