"""Damage a stopped broker's store the way a buggy backend would, so that tests
can check the validation notices: L{drop_stored_message} makes the store lose
one message of one queue, through the store's own API (found by its message
id, then acked), as if the backend had forgotten it.

A store needs a running reactor and Twisted's reactor runs once per process,
so the work is done by a child process: run as ``python -m tests.support.store_damage
BACKEND DATA_DIR QUEUE MESSAGE_ID [--vhost V]``, this module is that child; it
exits 0 once the message is dropped, L{NOT_FOUND} if the queue holds no such
message.
"""

import argparse
import os
import subprocess
import sys

from twisted.internet import defer, task

from spark_jobs.export import ExportError, open_store, queue_messages
from tests.support.paths import ROOT

NOT_FOUND = 3


def drop_stored_message(backend, data_dir, queue, message_id, vhost="/"):
    """
    Make the stopped broker's store under C{data_dir} lose the message whose
    AMQP message-id is C{message_id} from C{queue} (other queues holding it
    keep it).

    @return: True if the queue held it (and now does not), False if not.
    @raise AssertionError: if the store cannot be opened, with the reason.
    """
    finished = subprocess.run(
        [sys.executable, "-m", "tests.support.store_damage", backend, os.path.abspath(data_dir), queue, message_id,
         "--vhost", vhost],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    if finished.returncode not in (0, NOT_FOUND):
        raise AssertionError(f"could not drop {message_id!r} from {queue!r} in the {backend} store in {data_dir}:"
                             f" {finished.stderr.strip()}")
    return finished.returncode == 0


@defer.inlineCallbacks
def drop_in_open_store(store, queue, message_id, vhost="/"):
    """L{drop_stored_message} on an open store: a Deferred firing with True once the ack is durable, or False."""
    key = (vhost, queue)
    for handle, message in queue_messages(store, key):
        properties = message.properties
        if properties.HasField("message_id") and properties.message_id == message_id:
            store.ack(key, handle)
            yield store.sync()
            return True
    return False


@defer.inlineCallbacks
def _child(reactor, arguments):
    try:
        store = yield open_store(arguments.backend, arguments.data_dir, reactor)
    except ExportError as problem:
        print(problem, file=sys.stderr)
        raise SystemExit(1) from None
    try:
        dropped = yield drop_in_open_store(store, arguments.queue, arguments.message_id, arguments.vhost)
    finally:
        yield store.close()
    if not dropped:
        raise SystemExit(NOT_FOUND)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.support.store_damage",
                                     description="Make a stopped broker's store lose one message of one queue.")
    parser.add_argument("backend")
    parser.add_argument("data_dir")
    parser.add_argument("queue")
    parser.add_argument("message_id")
    parser.add_argument("--vhost", default="/")
    task.react(_child, (parser.parse_args(argv),))


if __name__ == "__main__":
    main()
