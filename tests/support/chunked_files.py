"""Chunked stores for the store contracts (L{ChunkedStores}) and what the chunked tests share: the
sizes the tests' options give, and reading, finding and damaging chunk, index and delayed-bucket
files."""

import os

from twisted.internet import defer

from backends.chunked import backend
from backends.chunked.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    RECORD_OVERHEAD,
    record_size,
)
from backends.common.message_heads import encode_head
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from tests.support.store_contract import JOBS, DirectoryStores, queue_record

DATA = 4096  # bytes of records per message chunk, as the tests' chunk_size option says

FILE_SIZE = HEADER_SIZE + DATA + FOOTER_SIZE  # of every message chunk file

ENTRIES = 64  # per index chunk, as the tests' index_chunk_entries option says


def sized(name, size):
    """A persistent message named C{name} with a body of C{size} bytes and a small head of known size."""
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id=name)
    return Message("amq.direct", "jobs", properties, name.encode().ljust(size, b"."))


def big(number):
    """A message of which three fit in a chunk and a fourth does not."""
    return sized("m%02d" % number, 1000)


def filling(name, room):
    """A message named C{name} whose record takes exactly C{room} bytes."""
    return sized(name, room - RECORD_OVERHEAD - len(encode_head(sized(name, 0))))


def record_bytes(published):
    """The bytes a message's record takes in a chunk."""
    return record_size(encode_head(published), len(published.body))


def chunk_path(store, number):
    return os.path.join(store.directory, "message-chunk-%09d" % number)


def chunk_numbers(store):
    """The numbers of the message chunk files there are, from the directory listing."""
    return sorted(int(name[len("message-chunk-") :]) for name in os.listdir(store.directory)
                  if name.startswith("message-chunk-"))


def index_dir(store, queue):
    return os.path.join(store.directory, "queues", "\0".join(queue).encode("utf-8").hex())


def index_chunk_path(store, queue, number):
    return os.path.join(index_dir(store, queue), "index-chunk-%09d" % number)


def index_chunk_numbers(store, queue):
    return sorted(int(name[len("index-chunk-") :]) for name in os.listdir(index_dir(store, queue))
                  if name.startswith("index-chunk-"))


def contents(path):
    with open(path, "rb") as opened:
        return opened.read()


def overwrite(path, offset, data):
    with open(path, "r+b") as opened:
        opened.seek(offset)
        opened.write(data)


def flip(path, offset):
    """Damage one byte of a file (invert its bits)."""
    overwrite(path, offset, bytes([contents(path)[offset] ^ 0xFF]))


class ChunkedStores(DirectoryStores):
    """Makes chunked stores on fresh or existing data directories, closed at test cleanup.

    Chunks are small (4 KiB of records, 64 index entries) so that the tests
    cross chunk boundaries with a few messages."""

    backend = backend
    subdirectory = "chunked"
    options = {"chunk_size": "4096", "index_chunk_entries": "64"}

    @defer.inlineCallbacks
    def store_with(self, messages, queues=(JOBS,), **options):
        """An open store whose C{queues} each hold C{messages}, synced; and their handles."""
        store = yield self.open_store(**options)
        for vhost, name in queues:
            store.save_queue(queue_record(name, vhost=vhost))
        handles = [store.append(published, list(queues)) for published in messages]
        yield store.sync()
        return store, handles

    @staticmethod
    def bodies(store, queue=JOBS):
        return [record.body for _, record, _ in store.recover(queue)]

SECOND = 1000  # ms: the bucket width of the tests below


def delayed_dir(store):
    return os.path.join(store.directory, "delayed")


def bucket_path(store, number):
    return os.path.join(delayed_dir(store), "bucket-%020d" % number)


def bucket_numbers(store):
    return sorted(int(name[len("bucket-"):]) for name in os.listdir(delayed_dir(store)) if name.startswith("bucket-"))
