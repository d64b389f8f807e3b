"""What the kombu modules share: the pyamqp URL of a broker, draining events
until a condition holds (or until a quiet spell shows nothing more is coming),
ready counts by passive declare, a kombu C{connection} fixture to the module's
broker, and the autouse fixture C{broker_log_stays_clean} (imported by each
module) that fails a test during which the broker logged a traceback.

Import it after ``pytest.importorskip("kombu")``.
"""

import socket
import time

import pytest
from kombu import Connection, Exchange, Queue

from tests.support.client_broker import TRACEBACK_MARKS, logged_errors, unique_names

WAIT = 15.0  # seconds any expected event may take
QUIET = 0.3  # seconds of silence that show nothing more is on its way
RETRY_POLICY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 1}


unique = unique_names("kombu")


def kombu_url(broker):
    return f"pyamqp://guest:guest@{broker.host}:{broker.amqp_port}//"


def drain_until(connection, condition, timeout=WAIT):
    """drain_events until condition() holds; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"condition not met within {timeout} s")
        try:
            connection.drain_events(timeout=min(remaining, 1.0))
        except socket.timeout:
            pass


def assert_nothing_more(connection, received, count):
    """Nothing beyond the first count messages arrives within QUIET seconds."""
    try:
        connection.drain_events(timeout=QUIET)
    except socket.timeout:
        pass
    assert len(received) == count, [message.payload for message in received[count:]]


def ready_count(connection, queue):
    """Messages ready in queue (not delivered to anyone), from a passive declare on a fresh channel."""
    with connection.channel() as channel:
        _, message_count, _ = queue.bind(channel).queue_declare(passive=True)
    return message_count


@pytest.fixture(autouse=True)
def broker_log_stays_clean(amqp_broker):
    """Fails a test during which the broker logged a traceback or an unhandled error."""
    first = len(amqp_broker.process.output)
    yield
    problems = logged_errors(amqp_broker.process, first, TRACEBACK_MARKS)
    assert not problems, "broker log during the test:\n" + "\n".join(amqp_broker.process.output[first:])


@pytest.fixture
def connection(amqp_broker):
    with Connection(kombu_url(amqp_broker), connect_timeout=10) as conn:
        conn.connect()
        yield conn


def one_queue(connection, prefix):
    """A new queue bound under routing key C{rk} to a new direct exchange, both declared on C{connection}."""
    queue = Queue(unique(prefix), Exchange(unique(f"{prefix}-x"), durable=False), "rk", durable=False)
    queue.bind(connection.default_channel).declare()
    return queue


