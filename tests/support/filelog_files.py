"""Filelog stores for the store contracts (L{FilelogStores}) and the layout of a filelog queue
file, for the tests that read or damage one."""

import os
import struct

from twisted.internet import defer

from backends.filelog import backend
from backends.filelog.queuefile import queue_file_name
from tests.support.store_contract import JOBS, DirectoryStores, message, queue_record

RECORD_LENGTH = struct.Struct(">I")

QUEUE_FILE_MAGIC = b"brokerd filelog queue 1\n"


def header_size(data):
    """The size of a queue file's header: the magic line, the length-prefixed queue key and a CRC."""
    assert data.startswith(QUEUE_FILE_MAGIC), data[:40]
    (key_length,) = RECORD_LENGTH.unpack_from(data, len(QUEUE_FILE_MAGIC))
    return len(QUEUE_FILE_MAGIC) + 4 + key_length + 4


def record_spans(path):
    """The (offset, size) of every record of a queue file, read by its length prefixes alone."""
    with open(path, "rb") as queue_file:
        data = queue_file.read()
    spans, offset = [], header_size(data)
    while offset + 4 <= len(data):
        (length,) = RECORD_LENGTH.unpack_from(data, offset)
        spans.append((offset, length + 8))
        offset += length + 8
    return spans


class FilelogStores(DirectoryStores):
    """Makes filelog stores on fresh or existing data directories, closed at test cleanup."""

    backend = backend
    subdirectory = "filelog"
    options = {}

    def queue_path(self, store, queue):
        return os.path.join(store.directory, queue_file_name(queue))

    @defer.inlineCallbacks
    def filled(self, count):
        """An open store whose queue C{jobs} holds C{count} committed messages, and their handles."""
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(message(b"m%02d" % n), [JOBS]) for n in range(count)]
        yield store.sync()
        return store, handles
