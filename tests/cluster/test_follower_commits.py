"""A cluster node's stores: while it follows, its store commits on the reactor's thread (which
only applies the leader's operations), so a follower needs no writer thread; as leader it
commits as --sync says, on a writer thread."""

import shutil
import tempfile
import threading

import pytest
from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from brokerd.model.message import Message
from brokerd.process.cluster_node import node_of_options
from brokerd.process.tap import Options
from brokerd.proto import messages_pb2
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy

QUEUE = ("/", "jobs")


def node(tmp_path, backend, reactor):
    options = Options()
    options.parseOptions(["--data-dir", str(tmp_path), "--backend", backend, "--native", "none",
                          "--cluster-etcd", "http://127.0.0.1:2379", "--node-name", "n1"])
    return node_of_options(options, reactor, lambda *args: None)


@pytest.mark.parametrize("backend", ["chunked", "filelog", "sqlite"])
def test_a_followers_store_commits_on_the_reactor_alone(tmp_path, backend):
    # A clock that is no reactor at all: no thread pool, no callFromThread. A store that
    # handed a commit to a writer thread could not open, commit or close on it.
    clock = task.Clock()
    store = node(tmp_path, backend, clock).make_store(follower=True)
    steps = [store.open()]
    clock.advance(0)
    store.save_queue(messages_pb2.QueueRecord(vhost="/", name="jobs", durable=True))
    store.append(Message("", "jobs", messages_pb2.BasicProperties(delivery_mode=2), b"kept"), [QUEUE])
    steps.append(store.sync())
    clock.advance(0)
    steps.append(store.close())
    clock.advance(1)
    assert [(step.called, getattr(step, "result", None)) for step in steps] == [(True, None)] * 3


def writer_threads():
    return [thread.name for thread in threading.enumerate() if "writer" in thread.name]


class LeaderStore(unittest.TestCase):

    @defer.inlineCallbacks
    def test_a_leaders_store_commits_on_a_writer_thread_as_sync_says(self):
        directory = tempfile.mkdtemp(prefix="brokerd-follower-commits-")
        self.addCleanup(shutil.rmtree, directory, True)
        made = node(directory, "filelog", reactor)
        follower = made.make_store(follower=True)
        yield follower.open()
        self.assertEqual(writer_threads(), [])
        yield follower.close()
        leader = made.make_store()
        yield leader.open()
        self.addCleanup(leader.close)
        self.assertEqual(len(writer_threads()), 1, writer_threads())



def cached_bytes_after_an_append(store, clock):
    store.open()
    clock.advance(0)
    store.save_queue(messages_pb2.QueueRecord(vhost="/", name="jobs", durable=True))
    store.append(Message("", "jobs", messages_pb2.BasicProperties(delivery_mode=2), b"kept"), [QUEUE])
    cached = store.stats()["cache_bytes"]
    store.close()
    clock.advance(1)
    return cached


def test_a_chunked_followers_store_keeps_no_cache_of_recent_messages(tmp_path):
    """Nothing reads a follower's messages back while it follows: no memory goes to a cache."""
    clock = task.Clock()
    follower = node(tmp_path / "follower", "chunked", clock).make_store(follower=True)
    assert cached_bytes_after_an_append(follower, clock) == 0
    other = registry.make_store("chunked", str(tmp_path / "other"), SyncPolicy().on_reactor(),
                                reactor=clock)
    assert cached_bytes_after_an_append(other, clock) > 0, "a store that is no replica caches"
