"""The paging contract over the filelog store, and what is particular to its files: opening reads no message,
the reactor thread keeps a few bytes a message, loads read runs of records ahead within the cache, compactions
and messages kept for several queues read back right."""

import os

from twisted.internet import defer
from twisted.trial import unittest

from backends.filelog import backend
from backends.filelog.queuefile import queue_file_name
from tests.paging_contract import PagingContract
from tests.test_store_filelog import record_spans


class FilelogPaging(PagingContract, unittest.TestCase):
    backend = backend
    no_cache_options = {"cache_size": "0"}
    file_reads_stat = "file_reads"
    damage_text = "CRC does not match"

    def damage_record(self, store, handle, number):
        """Invert the last body byte of message C{number}'s record (the C{number}th of the file of "jobs")."""
        path = os.path.join(store.directory, queue_file_name(("/", "jobs")))
        offset, size = record_spans(path)[number]
        with open(path, "r+b") as opened:
            opened.seek(offset + size - 5)
            byte = opened.read(1)
            opened.seek(offset + size - 5)
            opened.write(bytes([byte[0] ^ 0xFF]))
