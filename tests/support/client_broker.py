"""Real ``twistd brokerd`` subprocesses for the client-library tests, and what their modules share.

Each module gets its own broker subprocess (memory backend, AMQP and native
listeners on port 0) so modules cannot disturb each other's queues; tests
inside a module use their own queue names. Besides the broker fixtures this
holds the broker-log checks, name makers and byte comparisons every client
module uses, the pika BlockingConnection fixtures of the test_pika_*
modules (which switch their deadline on with ``usefixtures("watchdog")``),
and what the test_amqp_*_errors modules share: brokers checked for tracebacks
(``usefixtures("no_broker_tracebacks")``), a bystander pika connection that
must survive another connection's error, and raw clients from L{rawamqp}.
"""

import contextlib
import itertools
import os
import re
import signal
import uuid

import pika
import pytest
from pika.exceptions import AMQPError

from brokerd.testing import BrokerProcess
from tests.support.rawamqp import TIMEOUT, RawAmqp

TEST_TIME_LIMIT = 30  # seconds for one test, setup and teardown included
CLOSE_TIME_LIMIT = 5

# What a broker prints when it failed rather than refused a client; modules pick how strict to be.
TRACEBACK_MARKS = ("Traceback", "Unhandled")
ERROR_MARKS = (*TRACEBACK_MARKS, "#critical]", "#error]")
CRASH_MARKS = (*TRACEBACK_MARKS, "failed to handle", "INTERNAL_ERROR", "Error:")


class RunningBroker:
    """Where a broker subprocess listens."""

    def __init__(self, process):
        self.process = process
        amqp = process.wait_listening("AMQP")
        native = process.wait_listening("native protocol")
        _, self.host, port = amqp.split(":")
        self.amqp_port = int(port)
        self.native_endpoint = native

    @property
    def amqp_url(self):
        return f"amqp://guest:guest@{self.host}:{self.amqp_port}/%2F"


def start_broker(directory, *extra_args):
    """Start a broker with AMQP and native listeners on free ports; returns a RunningBroker."""
    process = BrokerProcess(
        ["--native", "tcp:0:interface=127.0.0.1", "--amqp", "tcp:0:interface=127.0.0.1", *extra_args], cwd=directory
    )
    try:
        return RunningBroker(process)
    except BaseException:
        process.kill()
        raise


@pytest.fixture(scope="module")
def amqp_broker(tmp_path_factory):
    """A broker subprocess shared by the tests of one module."""
    running = start_broker(tmp_path_factory.mktemp("broker"))
    yield running
    running.process.stop()


def logged_errors(process, start=0, marks=ERROR_MARKS):
    """The lines a broker C{process} printed from line C{start} on that contain one of C{marks}."""
    return [line for line in process.output[start:] if any(mark in line for mark in marks)]


_names = itertools.count(1)


def unique_names(library):
    """A function making queue and exchange names no other test in this run uses: C{unique("orders")}."""

    def unique(prefix):
        return f"{library}.{prefix}.{os.getpid()}.{next(_names)}"

    return unique


def first_difference(expected, received):
    """A short description of where two byte strings differ, for failure messages."""
    if len(expected) != len(received):
        return f"length {len(received)}, expected {len(expected)}"
    offset = next((index for index, (a, b) in enumerate(zip(expected, received)) if a != b), None)
    return "no difference" if offset is None else f"first difference at byte {offset}"


# -- a deadline for blocking clients


class Hung(AssertionError):
    """A blocking call did not come back in time."""


@contextlib.contextmanager
def time_limit(seconds, what):
    def expire(signum, frame):
        raise Hung(f"{what} took longer than {seconds} s: the broker did not answer")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def watchdog(amqp_broker):
    """Fails a test that hangs, and one during which the shared broker logged a failure."""
    start = len(amqp_broker.process.output)
    with time_limit(TEST_TIME_LIMIT, "the test"):
        yield
    crashes = logged_errors(amqp_broker.process, start, CRASH_MARKS)
    assert not crashes, "the broker logged failures:\n" + "\n".join(crashes)


# -- pika BlockingConnection fixtures


@pytest.fixture
def own_broker(tmp_path):
    """Starts brokers with extra options: C{own_broker("--heartbeat", "1")}."""
    started = []

    def start(*extra_args):
        directory = tmp_path / f"broker{len(started)}"
        directory.mkdir()
        running = start_broker(directory, *extra_args)
        started.append(running)
        return running

    yield start
    for running in started:
        running.process.stop()
    for running in started:
        crashes = logged_errors(running.process, 0, CRASH_MARKS)
        assert not crashes, "the broker logged failures:\n" + "\n".join(crashes)


@pytest.fixture
def connect(amqp_broker, own_broker):
    """Opens BlockingConnections (to the shared broker unless told); closes them afterwards."""
    opened = []

    def connect(broker=None, **options):
        broker = broker or amqp_broker
        options.setdefault("blocked_connection_timeout", 10)
        parameters = pika.ConnectionParameters(
            host=broker.host,
            port=broker.amqp_port,
            virtual_host="/",
            credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=1,
            socket_timeout=5,
            stack_timeout=10,
            **options,
        )
        connection = pika.BlockingConnection(parameters)
        opened.append(connection)
        return connection

    yield connect
    for connection in opened:
        if connection.is_open:
            with contextlib.suppress(AMQPError, Hung, OSError), time_limit(CLOSE_TIME_LIMIT, "connection.close"):
                connection.close()


@pytest.fixture
def connection(connect):
    return connect()


@pytest.fixture
def channel(connection):
    return connection.channel()


@pytest.fixture
def name(request):
    """Makes names unique to this test and run: C{name("jobs")}."""
    base = re.sub(r"[^\w.-]", "-", request.node.name)[:80]
    run = uuid.uuid4().hex[:8]
    counter = itertools.count()

    def make(label="q"):
        return f"{base}.{label}.{run}.{next(counter)}"

    return make


# -- the AMQP error modules: checked brokers, raw clients and a bystander

_checked_brokers = []


@contextlib.contextmanager
def checked_for_tracebacks(running):
    """Has C{no_broker_tracebacks} watch broker C{running} while inside."""
    _checked_brokers.append(running)
    try:
        yield running
    finally:
        _checked_brokers.remove(running)


@pytest.fixture(scope="module")
def broker(amqp_broker):
    """The module's shared broker, watched by C{no_broker_tracebacks}."""
    with checked_for_tracebacks(amqp_broker):
        yield amqp_broker


@pytest.fixture
def no_broker_tracebacks():
    """Fails a test during which any checked broker logged a traceback or an unhandled error."""
    seen = {id(running): len(running.process.output) for running in _checked_brokers}
    yield
    for running in _checked_brokers:
        start = seen.get(id(running), 0)
        bad = logged_errors(running.process, start, TRACEBACK_MARKS)
        assert not bad, "the broker logged a failure:\n" + "\n".join(running.process.output[start:])


@contextlib.contextmanager
def raw_client(broker, handshake=True, **options):
    """A L{RawAmqp} to C{broker} that has done C{handshake(**options)} unless C{handshake=False}."""
    client = RawAmqp(broker.host, broker.amqp_port)
    try:
        if handshake:
            client.handshake(**options)
        yield client
    finally:
        client.close()


def pika_parameters(broker, username="guest", password="guest", **options):
    return pika.ConnectionParameters(
        host=broker.host,
        port=broker.amqp_port,
        credentials=pika.PlainCredentials(username, password),
        connection_attempts=1,
        socket_timeout=TIMEOUT,
        blocked_connection_timeout=TIMEOUT,
        **options,
    )


@contextlib.contextmanager
def pika_connection(broker, username="guest", password="guest"):
    connection = pika.BlockingConnection(pika_parameters(broker, username, password))
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


_round_trip_names = unique_names("round-trip")


def pika_round_trip(connection):
    """Declare a queue, publish to it and get the message back, on a new channel of C{connection}."""
    channel = connection.channel()
    queue = _round_trip_names("pika")
    channel.queue_declare(queue, auto_delete=False)
    body = f"round trip {uuid.uuid4().hex}".encode()
    channel.basic_publish("", queue, body, pika.BasicProperties(content_type="text/plain"))
    method, properties, received = channel.basic_get(queue, auto_ack=True)
    assert method is not None, f"basic.get on {queue} found nothing after a publish"
    assert received == body
    assert properties.content_type == "text/plain"
    channel.queue_delete(queue)
    channel.close()


@contextlib.contextmanager
def bystander(broker, username="guest", password="guest"):
    """
    A pika connection opened before the error under test; on leaving, it must
    still be open and do a full publish / get round trip.
    """
    with pika_connection(broker, username, password) as connection:
        pika_round_trip(connection)
        yield connection
        assert connection.is_open, "the bystander connection was closed by another connection's error"
        pika_round_trip(connection)
