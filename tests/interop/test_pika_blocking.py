"""pika's BlockingConnection against a real ``twistd brokerd`` over AMQP 0-9-1.

Each test drives the broker subprocess the way an application would and checks
what that application would see: replies, reply codes, routed messages,
redelivery flags, confirms and message properties. Blocking calls are guarded
by a SIGALRM deadline so a broker that never answers fails the test instead of
hanging the run; waiting for deliveries polls pika's own event loop.
"""

import contextlib
import datetime
import decimal
import hashlib
import itertools
import os
import re
import signal
import time
import uuid

import pika
import pytest
from pika import spec
from pika.exceptions import (
    AMQPError,
    ChannelClosedByBroker,
    ConnectionClosedByBroker,
    UnroutableError,
    UnsupportedAMQPFieldException,
)

from tests.interop.conftest import start_broker
from tests.processes import native_cli

TEST_TIME_LIMIT = 30  # seconds for one test, setup and teardown included
CLOSE_TIME_LIMIT = 5
QUIET = 0.3  # how long "nothing more arrives" is watched for

# Lines in a broker's output that mean it failed rather than refused a client.
CRASH = re.compile(r"Traceback|Unhandled|failed to handle|INTERNAL_ERROR|Error:")

MiB = 1024 * 1024


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


def crash_lines(process, start=0):
    return [line for line in process.output[start:] if CRASH.search(line)]


@pytest.fixture(autouse=True)
def watchdog(amqp_broker):
    """Fails a test that hangs, and one during which the shared broker logged a failure."""
    start = len(amqp_broker.process.output)
    with time_limit(TEST_TIME_LIMIT, "the test"):
        yield
    crashes = crash_lines(amqp_broker.process, start)
    assert not crashes, "the broker logged failures:\n" + "\n".join(crashes)


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
        crashes = crash_lines(running.process)
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


def pump(connection, until, what, timeout=5.0):
    """Runs pika's event loop until C{until()} is true; fails after C{timeout} seconds."""
    deadline = time.monotonic() + timeout
    while not until():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        connection.process_data_events(time_limit=min(0.05, remaining))


def settle(connection):
    """Gives the broker a moment to send anything more it would send."""
    connection.process_data_events(time_limit=QUIET)


def message_count(channel, queue):
    return channel.queue_declare(queue, passive=True).method.message_count


def consumer_count(channel, queue):
    return channel.queue_declare(queue, passive=True).method.consumer_count


def get_bodies(channel, queue):
    """Takes (auto-ack) every message ready in C{queue}; returns their bodies in order."""
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def closed_by_broker(function, *args, **kwargs):
    """Calls C{function}; returns the ChannelClosedByBroker it must raise."""
    with pytest.raises(ChannelClosedByBroker) as raised:
        function(*args, **kwargs)
    return raised.value


def close_reasons(channel):
    """A list that receives the reason C{channel} closes for, once it does."""
    reasons = []
    channel._impl.add_on_close_callback(lambda _channel, reason: reasons.append(reason))
    return reasons


def collector():
    received = []

    def on_message(channel, method, properties, body):
        received.append((method, properties, body))

    return received, on_message


# -- exchanges


def test_exchange_types_route_as_declared(channel, name):
    exchanges = {kind: name(f"ex-{kind}") for kind in ("direct", "fanout", "topic", "headers")}
    for kind, exchange in exchanges.items():
        assert isinstance(channel.exchange_declare(exchange, kind).method, spec.Exchange.DeclareOk)
    queues = {label: channel.queue_declare(name(label)).method.queue for label in ("one", "two")}

    channel.queue_bind(queues["one"], exchanges["direct"], "green")
    channel.queue_bind(queues["one"], exchanges["fanout"], "ignored")
    channel.queue_bind(queues["two"], exchanges["fanout"], "also-ignored")
    channel.queue_bind(queues["one"], exchanges["topic"], "stock.*.nyse")
    channel.queue_bind(queues["two"], exchanges["topic"], "stock.#")
    channel.queue_bind(queues["one"], exchanges["headers"], "", {"x-match": "all", "kind": "report", "format": "pdf"})
    channel.queue_bind(queues["two"], exchanges["headers"], "", {"x-match": "any", "kind": "report", "format": "pdf"})

    def publish(kind, key, body, headers=None):
        channel.basic_publish(exchanges[kind], key, body, pika.BasicProperties(headers=headers))

    publish("direct", "green", b"direct-green")
    publish("direct", "red", b"direct-red")
    publish("fanout", "anything", b"fanout")
    publish("topic", "stock.ibm.nyse", b"topic-ibm-nyse")
    publish("topic", "stock.ibm.nasdaq.extra", b"topic-deep")
    publish("topic", "bond.ibm.nyse", b"topic-bond")
    publish("headers", "", b"headers-both", {"kind": "report", "format": "pdf"})
    publish("headers", "", b"headers-one", {"kind": "report", "format": "csv"})
    publish("headers", "", b"headers-none", {"kind": "invoice"})

    assert get_bodies(channel, queues["one"]) == [b"direct-green", b"fanout", b"topic-ibm-nyse", b"headers-both"]
    assert get_bodies(channel, queues["two"]) == [
        b"fanout",
        b"topic-ibm-nyse",
        b"topic-deep",
        b"headers-both",
        b"headers-one",
    ]


def test_exchange_passive_declare(connection, channel, name):
    exchange = name("ex")
    channel.exchange_declare(exchange, "topic")
    assert isinstance(channel.exchange_declare(exchange, passive=True).method, spec.Exchange.DeclareOk)
    assert isinstance(channel.exchange_declare("amq.fanout", passive=True).method, spec.Exchange.DeclareOk)

    error = closed_by_broker(channel.exchange_declare, name("missing"), passive=True)
    assert error.reply_code == 404
    assert error.reply_text.startswith("NOT_FOUND")
    assert channel.is_closed
    assert connection.is_open


def test_exchange_redeclare_must_match(connection, name):
    exchange = name("ex")
    channel = connection.channel()
    channel.exchange_declare(exchange, "direct", durable=True)
    channel.exchange_declare(exchange, "direct", durable=True)  # the same again is fine

    error = closed_by_broker(channel.exchange_declare, exchange, "direct", durable=False)
    assert error.reply_code == 406
    assert error.reply_text.startswith("PRECONDITION_FAILED")
    assert "durable" in error.reply_text

    channel = connection.channel()
    error = closed_by_broker(channel.exchange_declare, exchange, "fanout", durable=True)
    assert error.reply_code == 406
    assert "type" in error.reply_text


def test_exchange_declare_with_reserved_name_is_refused(channel, name):
    error = closed_by_broker(channel.exchange_declare, "amq." + name("ex"), "direct")
    assert error.reply_code == 403
    assert error.reply_text.startswith("ACCESS_REFUSED")


def test_auto_delete_exchange_goes_with_its_last_binding(connection, channel, name):
    exchange, queue = name("ex"), name()
    channel.exchange_declare(exchange, "fanout", auto_delete=True)
    channel.queue_declare(queue)
    channel.exchange_declare(exchange, passive=True)  # not deleted while it never had a binding
    channel.queue_bind(queue, exchange)
    channel.exchange_declare(exchange, passive=True)

    channel.queue_unbind(queue, exchange)

    error = closed_by_broker(connection.channel().exchange_declare, exchange, passive=True)
    assert error.reply_code == 404


def test_exchange_delete_if_unused(connection, name):
    channel = connection.channel()
    exchange, queue = name("ex"), name()
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "key")

    error = closed_by_broker(channel.exchange_delete, exchange, if_unused=True)
    assert error.reply_code == 406
    assert error.reply_text.startswith("PRECONDITION_FAILED")

    channel = connection.channel()
    channel.exchange_declare(exchange, passive=True)  # still there
    channel.queue_unbind(queue, exchange, "key")
    assert isinstance(channel.exchange_delete(exchange, if_unused=True).method, spec.Exchange.DeleteOk)
    error = closed_by_broker(channel.exchange_declare, exchange, passive=True)
    assert error.reply_code == 404


def test_exchange_delete_removes_its_bindings(channel, name):
    exchange, queue = name("ex"), name()
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange)
    channel.exchange_delete(exchange)
    channel.exchange_declare(exchange, "fanout")  # a new exchange of the same name: no bindings
    channel.basic_publish(exchange, "", b"nobody")
    assert message_count(channel, queue) == 0


# -- queues


def test_queue_declare_ok_counts_and_passive(connection, channel, name):
    queue = name()
    declared = channel.queue_declare(queue)
    assert (declared.method.queue, declared.method.message_count, declared.method.consumer_count) == (queue, 0, 0)
    for body in (b"1", b"2", b"3"):
        channel.basic_publish("", queue, body)
    consuming = connection.channel()
    consuming.basic_qos(prefetch_count=1)
    received, on_message = collector()
    consuming.basic_consume(queue, on_message)
    pump(connection, lambda: received, "the first delivery")

    passive = channel.queue_declare(queue, passive=True).method
    assert (passive.queue, passive.message_count, passive.consumer_count) == (queue, 2, 1)

    error = closed_by_broker(channel.queue_declare, name("missing"), passive=True)
    assert error.reply_code == 404
    assert error.reply_text.startswith("NOT_FOUND")


def test_queue_redeclare_must_match(connection, name):
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.queue_declare(queue, durable=True)
    error = closed_by_broker(channel.queue_declare, queue, durable=False)
    assert error.reply_code == 406
    assert "durable" in error.reply_text

    channel = connection.channel()
    error = closed_by_broker(channel.queue_declare, queue, durable=True, auto_delete=True)
    assert error.reply_code == 406
    assert "auto_delete" in error.reply_text


def test_queue_arguments_are_kept(connection, name):
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue, arguments={"x-max-length": 10, "x-queue-mode": "lazy"})
    channel.queue_declare(queue, arguments={"x-max-length": 10, "x-queue-mode": "lazy"})

    error = closed_by_broker(channel.queue_declare, queue, arguments={"x-max-length": 20, "x-queue-mode": "lazy"})
    assert error.reply_code == 406
    assert error.reply_text.startswith("PRECONDITION_FAILED")
    assert "x-max-length" in error.reply_text


def test_server_named_queue(connection, channel, name):
    declared = channel.queue_declare("", exclusive=True).method
    assert declared.queue.startswith("amq.gen-")
    assert declared.queue != channel.queue_declare("", exclusive=True).method.queue

    channel.basic_publish("", declared.queue, b"to a server-named queue")
    assert get_bodies(channel, declared.queue) == [b"to a server-named queue"]
    error = closed_by_broker(channel.queue_declare, "amq." + name(), passive=False)
    assert error.reply_code == 403


def test_exclusive_queue_belongs_to_its_connection(connect, name):
    owner, other = connect(), connect()
    queue = name()
    owner_channel = owner.channel()
    owner_channel.queue_declare(queue, exclusive=True)
    owner_channel.basic_publish("", queue, b"mine")

    error = closed_by_broker(other.channel().queue_declare, queue, passive=True)
    assert error.reply_code == 405
    assert error.reply_text.startswith("RESOURCE_LOCKED")
    error = closed_by_broker(other.channel().basic_consume, queue, lambda *args: None)
    assert error.reply_code == 405
    error = closed_by_broker(other.channel().basic_get, queue)
    assert error.reply_code == 405

    second = owner.channel()  # another channel of the owner may use it
    assert message_count(second, queue) == 1
    other.channel().basic_publish("", queue, b"others may publish to it")
    assert get_bodies(second, queue) == [b"mine", b"others may publish to it"]

    owner.close()
    error = closed_by_broker(other.channel().queue_declare, queue, passive=True)
    assert error.reply_code == 404


def test_auto_delete_queue_goes_with_its_last_consumer(connection, name):
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=True)
    channel.queue_declare(queue, passive=True)  # still there without ever having had a consumer
    first = channel.basic_consume(queue, lambda *args: None)
    second = channel.basic_consume(queue, lambda *args: None)
    channel.basic_cancel(first)
    assert consumer_count(channel, queue) == 1
    channel.basic_cancel(second)

    error = closed_by_broker(connection.channel().queue_declare, queue, passive=True)
    assert error.reply_code == 404


def test_bind_unbind(channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.queue_bind(queue, "amq.direct", "orders")
    channel.queue_bind(queue, "amq.topic", "orders.*")
    channel.basic_publish("amq.direct", "orders", b"direct while bound")
    channel.basic_publish("amq.topic", "orders.new", b"topic while bound")
    assert get_bodies(channel, queue) == [b"direct while bound", b"topic while bound"]

    assert isinstance(channel.queue_unbind(queue, "amq.direct", "orders").method, spec.Queue.UnbindOk)
    channel.basic_publish("amq.direct", "orders", b"direct after unbind")
    channel.basic_publish("amq.topic", "orders.new", b"topic still bound")
    assert get_bodies(channel, queue) == [b"topic still bound"]


def test_bind_to_missing_exchange_is_not_found(channel, name):
    queue = name()
    channel.queue_declare(queue)
    error = closed_by_broker(channel.queue_bind, queue, name("missing-ex"), "key")
    assert error.reply_code == 404


def test_purge_returns_the_count(channel, name):
    queue = name()
    channel.queue_declare(queue)
    for number in range(7):
        channel.basic_publish("", queue, b"%d" % number)
    assert channel.queue_purge(queue).method.message_count == 7
    assert message_count(channel, queue) == 0
    assert channel.queue_purge(queue).method.message_count == 0


def test_purge_leaves_unacked_deliveries(connection, name):
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"%d" % number for number in range(5)])
    consuming = connection.channel()
    consuming.basic_qos(prefetch_count=2)
    received, on_message = collector()
    consuming.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")
    assert channel.queue_purge(queue).method.message_count == 3
    consuming.close()  # the two un-acked come back
    assert redelivery_state(channel, queue) == [(b"0", True), (b"1", True)]


def test_queue_delete_if_unused_if_empty_and_count(connection, name):
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue)
    for number in range(4):
        channel.basic_publish("", queue, b"%d" % number)

    error = closed_by_broker(channel.queue_delete, queue, if_empty=True)
    assert error.reply_code == 406
    assert error.reply_text.startswith("PRECONDITION_FAILED")

    consuming = connection.channel()
    consuming.basic_qos(prefetch_count=1)
    received, on_message = collector()
    tag = consuming.basic_consume(queue, on_message)
    pump(connection, lambda: received, "a delivery")
    channel = connection.channel()
    error = closed_by_broker(channel.queue_delete, queue, if_unused=True)
    assert error.reply_code == 406

    consuming.basic_cancel(tag)
    channel = connection.channel()
    assert message_count(channel, queue) == 3
    assert channel.queue_delete(queue, if_unused=True).method.message_count == 3
    error = closed_by_broker(channel.queue_declare, queue, passive=True)
    assert error.reply_code == 404


def test_queue_delete_if_empty_on_an_empty_queue(channel, name):
    queue = name()
    channel.queue_declare(queue)
    assert channel.queue_delete(queue, if_empty=True).method.message_count == 0


# -- basic.qos


def test_prefetch_count_limits_unacked_deliveries(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    for number in range(10):
        channel.basic_publish("", queue, b"%d" % number)
    channel.basic_qos(prefetch_count=3)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)

    pump(connection, lambda: len(received) >= 3, "three deliveries")
    settle(connection)
    assert [body for _, _, body in received] == [b"0", b"1", b"2"]

    channel.basic_ack(received[0][0].delivery_tag)
    pump(connection, lambda: len(received) >= 4, "a fourth delivery after an ack")
    settle(connection)
    assert len(received) == 4

    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    pump(connection, lambda: len(received) >= 7, "three more after a multiple ack")
    settle(connection)
    assert [body for _, _, body in received] == [b"%d" % number for number in range(7)]
    other = connection.channel()
    assert message_count(other, queue) == 3


def test_prefetch_count_is_per_consumer_without_global(connection, channel, name):
    queues = [name(), name()]
    for queue in queues:
        channel.queue_declare(queue)
        for number in range(5):
            channel.basic_publish("", queue, b"%d" % number)
    channel.basic_qos(prefetch_count=2)
    received, on_message = collector()
    for queue in queues:
        channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 4, "two deliveries per consumer")
    settle(connection)
    assert len(received) == 4


def test_global_prefetch_count_is_shared_by_the_channel(connection, channel, name):
    queues = [name(), name()]
    for queue in queues:
        channel.queue_declare(queue)
        for number in range(5):
            channel.basic_publish("", queue, b"%d" % number)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    received, on_message = collector()
    for queue in queues:
        channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 3, "three deliveries")
    settle(connection)
    assert len(received) == 3

    channel.basic_ack(0, multiple=True)
    pump(connection, lambda: len(received) >= 6, "three more deliveries")
    settle(connection)
    assert len(received) == 6


def test_prefetch_size_is_refused(connection, channel):
    """RabbitMQ answers 540 NOT_IMPLEMENTED to a non-zero prefetch_size; so does brokerd."""
    with pytest.raises(ConnectionClosedByBroker) as raised:
        channel.basic_qos(prefetch_size=4096)
    assert raised.value.reply_code == 540
    assert connection.is_closed


# -- consumers


def test_consume_with_explicit_tag(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message, consumer_tag="my-own-tag")
    assert tag == "my-own-tag"
    channel.basic_publish("", queue, b"tagged")
    pump(connection, lambda: received, "a delivery")
    method, _, body = received[0]
    assert (method.consumer_tag, method.exchange, method.routing_key, method.redelivered, body) == (
        "my-own-tag",
        "",
        queue,
        False,
        b"tagged",
    )
    assert method.delivery_tag == 1  # the first delivery on a fresh channel


def test_consume_with_server_named_tag(connection, channel, name):
    """pika always makes up a tag itself, so basic.consume with an empty tag is sent by hand."""
    queue = name()
    channel.queue_declare(queue)
    replies = []
    channel._impl._rpc(
        spec.Basic.Consume(queue=queue, consumer_tag=""), replies.append, [spec.Basic.ConsumeOk]
    )
    pump(connection, lambda: replies, "basic.consume-ok")
    tag = replies[0].method.consumer_tag
    assert tag.startswith("amq.ctag-")
    assert consumer_count(channel, queue) == 1

    channel._impl._rpc(spec.Basic.Cancel(consumer_tag=tag), replies.append, [spec.Basic.CancelOk])
    pump(connection, lambda: len(replies) == 2, "basic.cancel-ok")
    assert replies[1].method.consumer_tag == tag
    assert consumer_count(channel, queue) == 0


def test_reused_consumer_tag_closes_the_connection(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_consume(queue, lambda *args: None, consumer_tag="twice")
    replies = []
    channel._impl._rpc(spec.Basic.Consume(queue=queue, consumer_tag="twice"), replies.append, [spec.Basic.ConsumeOk])
    with pytest.raises(ConnectionClosedByBroker) as raised:
        pump(connection, lambda: replies, "the broker's answer")
    assert raised.value.reply_code == 530
    assert "twice" in raised.value.reply_text


def test_exclusive_consumer(connect, name):
    first, second = connect(), connect()
    queue = name()
    owner = first.channel()
    owner.queue_declare(queue)
    tag = owner.basic_consume(queue, lambda *args: None, exclusive=True)

    error = closed_by_broker(second.channel().basic_consume, queue, lambda *args: None)
    assert error.reply_code == 403
    assert error.reply_text.startswith("ACCESS_REFUSED")
    error = closed_by_broker(first.channel().basic_consume, queue, lambda *args: None)
    assert error.reply_code == 403

    owner.basic_cancel(tag)
    received, on_message = collector()
    second.channel().basic_consume(queue, on_message)
    owner.basic_publish("", queue, b"after the exclusive consumer left")
    pump(second, lambda: received, "a delivery to the new consumer")
    assert received[0][2] == b"after the exclusive consumer left"


def test_exclusive_consume_refused_while_others_consume(connection, name):
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.basic_consume(queue, lambda *args: None)
    error = closed_by_broker(connection.channel().basic_consume, queue, lambda *args: None, exclusive=True)
    assert error.reply_code == 403


def test_no_ack_consumer(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    for number in range(3):
        channel.basic_publish("", queue, b"%d" % number)
    consuming = connection.channel()
    consuming.basic_qos(prefetch_count=1)  # no effect on a no-ack consumer
    received, on_message = collector()
    consuming.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: len(received) >= 3, "three deliveries")
    assert [body for _, _, body in received] == [b"0", b"1", b"2"]
    consuming.close()  # nothing is requeued: there was nothing to ack
    assert message_count(channel, queue) == 0


def test_cancel_stops_deliveries(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message, auto_ack=True)
    channel.basic_publish("", queue, b"before cancel")
    pump(connection, lambda: received, "a delivery")

    channel.basic_cancel(tag)
    assert channel.consumer_tags == []
    channel.basic_publish("", queue, b"after cancel 1")
    channel.basic_publish("", queue, b"after cancel 2")
    settle(connection)
    assert len(received) == 1
    assert message_count(channel, queue) == 2
    assert consumer_count(channel, queue) == 0


def test_broker_cancels_consumer_when_its_queue_is_deleted(connect, name):
    consuming_connection, deleting_connection = connect(), connect()
    queue = name()
    channel = consuming_connection.channel()
    channel.queue_declare(queue)
    cancelled = []
    channel.add_on_cancel_callback(cancelled.append)
    tag = channel.basic_consume(queue, lambda *args: None, consumer_tag="doomed")
    assert tag == "doomed"

    deleting_connection.channel().queue_delete(queue)
    pump(consuming_connection, lambda: cancelled, "the broker's basic.cancel")
    assert isinstance(cancelled[0].method, spec.Basic.Cancel)
    assert cancelled[0].method.consumer_tag == "doomed"
    assert channel.consumer_tags == []
    assert channel.is_open
    channel.queue_declare(name())  # the channel still works


def test_broker_cancels_consumer_when_another_channel_deletes_the_queue(connection, name):
    queue = name()
    consuming, deleting = connection.channel(), connection.channel()
    consuming.queue_declare(queue)
    cancelled = []
    consuming.add_on_cancel_callback(cancelled.append)
    received, on_message = collector()
    consuming.basic_consume(queue, on_message, consumer_tag="same-connection")
    deleting.basic_publish("", queue, b"before the delete")
    pump(connection, lambda: received, "a delivery")

    assert deleting.queue_delete(queue).method.message_count == 0  # the delivered message is not ready
    pump(connection, lambda: cancelled, "the broker's basic.cancel")
    assert cancelled[0].method.consumer_tag == "same-connection"
    assert consuming.consumer_tags == []
    consuming.basic_ack(received[0][0].delivery_tag)  # acking after the queue went is harmless
    consuming.queue_declare(name())
    assert consuming.is_open and deleting.is_open


def test_cancel_keeps_unacked_deliveries_ackable(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c", b"d"])
    channel.basic_qos(prefetch_count=2)
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")
    channel.basic_cancel(tag)

    channel.basic_ack(received[0][0].delivery_tag)
    channel.basic_nack(received[1][0].delivery_tag, requeue=True)
    settle(connection)
    assert channel.is_open
    assert len(received) == 2
    assert redelivery_state(channel, queue) == [(b"b", True), (b"c", False), (b"d", False)]


def test_consume_generator_cancel_requeues_what_it_held(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"%d" % number for number in range(5)])
    channel.basic_qos(prefetch_count=5)
    events = channel.consume(queue, inactivity_timeout=2)
    method, _, body = next(events)
    assert body == b"0"
    channel.basic_ack(method.delivery_tag)
    channel.cancel()  # pika rejects (requeue) what it was still holding
    assert redelivery_state(channel, queue) == [(b"%d" % number, True) for number in range(1, 5)]


def test_slow_reader_gets_every_delivery_in_order(connect, name):
    """The consumer's connection is not read while the other one publishes 16 MiB: the
    broker has to hold deliveries back and resume once the consumer catches up."""
    queue = name()
    consumer_connection, publisher_connection = connect(), connect()
    consuming = consumer_connection.channel()
    consuming.queue_declare(queue)
    received, on_message = collector()
    consuming.basic_consume(queue, on_message, auto_ack=True)

    publishing = publisher_connection.channel()
    publishing.confirm_delivery()
    chunk = os.urandom(64 * 1024)
    for number in range(256):
        publishing.basic_publish("", queue, b"%03d" % number + chunk)

    pump(consumer_connection, lambda: len(received) >= 256, "256 deliveries", timeout=20)
    assert [body[:3] for _, _, body in received] == [b"%03d" % number for number in range(256)]
    assert all(body[3:] == chunk for _, _, body in received)
    assert message_count(publishing, queue) == 0


def test_consume_generator_ends_on_broker_cancel(connect, name):
    consuming_connection, deleting_connection = connect(), connect()
    queue = name()
    channel = consuming_connection.channel()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"only one")
    events = channel.consume(queue, auto_ack=True, inactivity_timeout=0.1)
    first = next(event for event in events if event != (None, None, None))
    assert first[2] == b"only one"

    deleting_connection.channel().queue_delete(queue)
    deadline = time.monotonic() + 5
    rest = []
    for event in events:  # pika ends the generator when the broker cancels its consumer
        rest.append(event)
        assert time.monotonic() < deadline, "the consume() generator did not end after the broker's basic.cancel"
    assert all(event == (None, None, None) for event in rest)


# -- publishing


def test_mandatory_unroutable_raises_with_confirms(channel, name):
    channel.confirm_delivery()
    missing = name("nobody")
    with pytest.raises(UnroutableError) as raised:
        channel.basic_publish("", missing, b"lost", pika.BasicProperties(message_id="m-1"), mandatory=True)
    [returned] = raised.value.messages
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    assert (returned.method.exchange, returned.method.routing_key) == ("", missing)
    assert returned.body == b"lost"
    assert returned.properties.message_id == "m-1"

    with pytest.raises(UnroutableError):
        channel.basic_publish("amq.direct", missing, b"lost too", mandatory=True)
    channel.basic_publish("amq.direct", missing, b"not mandatory: dropped quietly")  # no exception


def test_mandatory_unroutable_returned_without_confirms(connection, channel, name):
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method, body)))
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"routed", mandatory=True)
    channel.basic_publish("", name("nobody"), b"unroutable", mandatory=True)
    pump(connection, lambda: returned, "basic.return")
    settle(connection)
    assert [(method.reply_code, body) for method, body in returned] == [(312, b"unroutable")]
    assert message_count(channel, queue) == 1


def test_publish_to_missing_exchange_closes_the_channel(connection, channel, name):
    channel.confirm_delivery()
    error = closed_by_broker(channel.basic_publish, name("missing-ex"), "key", b"body")
    assert error.reply_code == 404
    assert error.reply_text.startswith("NOT_FOUND")
    assert connection.is_open


def test_immediate_publish_closes_the_connection_with_540(connect, connection, channel, name):
    """pika has no immediate argument, so the basic.publish is sent by hand. As
    in RabbitMQ, immediate is refused with a connection-level 540."""
    queue = name()
    channel.queue_declare(queue)
    channel._impl._send_method(
        spec.Basic.Publish(exchange="", routing_key=queue, immediate=True),
        (pika.BasicProperties(), b"right now"),
    )
    with pytest.raises(ConnectionClosedByBroker) as raised:
        pump(connection, lambda: False, "the connection to close")
    assert raised.value.reply_code == 540
    assert raised.value.reply_text.startswith("NOT_IMPLEMENTED")
    assert "immediate" in raised.value.reply_text
    assert connection.is_closed

    # The message went nowhere, and the broker still serves everyone else.
    assert message_count(connect().channel(), queue) == 0


def test_publisher_confirms_for_many_publishes(channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    for number in range(500):
        channel.basic_publish("", queue, b"%d" % number, persistent)  # each returns once confirmed
    assert message_count(channel, queue) == 500
    assert get_bodies(channel, queue) == [b"%d" % number for number in range(500)]


def test_publisher_confirms_for_persistent_messages_on_a_durable_queue(channel, name):
    queue = name()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    for number in range(200):
        channel.basic_publish("", queue, b"%d" % number, persistent)
    with pytest.raises(UnroutableError):
        channel.basic_publish("", name("nobody"), b"lost", persistent, mandatory=True)
    assert get_bodies(channel, queue) == [b"%d" % number for number in range(200)]
    channel.queue_delete(queue)


def test_confirm_select_after_tx_select_is_refused(channel):
    channel.tx_select()
    error = closed_by_broker(channel.confirm_delivery)
    assert error.reply_code == 406


# -- get, ack, nack, reject, recover


def test_get_and_get_empty(channel, name):
    queue = name()
    channel.queue_declare(queue)
    assert channel.basic_get(queue) == (None, None, None)
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", queue, body)

    method, properties, body = channel.basic_get(queue)
    assert isinstance(method, spec.Basic.GetOk)
    assert (body, method.message_count, method.redelivered, method.exchange, method.routing_key) == (
        b"a",
        2,
        False,
        "",
        queue,
    )
    channel.basic_ack(method.delivery_tag)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count) == (b"b", 1)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count) == (b"c", 0)
    assert channel.basic_get(queue) == (None, None, None)


def test_get_from_missing_queue_is_not_found(channel, name):
    error = closed_by_broker(channel.basic_get, name("missing"))
    assert error.reply_code == 404


def fill(channel, queue, bodies):
    channel.queue_declare(queue)
    for body in bodies:
        channel.basic_publish("", queue, body)


def take(channel, queue, count):
    """basic.get (manual ack) C{count} messages; returns their GetOk methods and bodies."""
    taken = []
    for _ in range(count):
        method, _, body = channel.basic_get(queue)
        assert method is not None, f"queue {queue} ran dry after {len(taken)} messages"
        taken.append((method, body))
    return taken


def redelivery_state(channel, queue):
    """Takes everything ready in C{queue}: a list of (body, redelivered)."""
    state = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return state
        state.append((body, method.redelivered))


def test_nack_multiple_requeue_keeps_order_and_marks_redelivered(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c", b"d"])
    taken = take(channel, queue, 3)
    channel.basic_nack(taken[-1][0].delivery_tag, multiple=True, requeue=True)
    assert redelivery_state(channel, queue) == [(b"a", True), (b"b", True), (b"c", True), (b"d", False)]


def test_nack_everything_outstanding_with_tag_zero(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    take(channel, queue, 3)
    channel.basic_nack(0, multiple=True, requeue=True)
    assert redelivery_state(channel, queue) == [(b"a", True), (b"b", True), (b"c", True)]


def test_reject_requeue_redelivers_to_the_consumer(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b"])
    channel.basic_qos(prefetch_count=1)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: received, "a delivery")
    channel.basic_reject(received[0][0].delivery_tag, requeue=True)
    pump(connection, lambda: len(received) >= 2, "the redelivery")
    channel.basic_ack(received[1][0].delivery_tag)
    pump(connection, lambda: len(received) >= 3, "the next message")
    assert [(body, method.redelivered) for method, _, body in received] == [
        (b"a", False),
        (b"a", True),
        (b"b", False),
    ]


def test_nack_without_requeue_drops(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    taken = take(channel, queue, 2)
    channel.basic_nack(taken[1][0].delivery_tag, multiple=True, requeue=False)
    assert redelivery_state(channel, queue) == [(b"c", False)]


def test_nack_single_requeue(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    taken = take(channel, queue, 2)
    channel.basic_nack(taken[1][0].delivery_tag, multiple=False, requeue=True)
    channel.basic_ack(taken[0][0].delivery_tag)
    assert redelivery_state(channel, queue) == [(b"b", True), (b"c", False)]


def test_reject_requeue_and_drop(channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    (first, _), (second, _) = take(channel, queue, 2)
    channel.basic_reject(first.delivery_tag, requeue=False)
    channel.basic_reject(second.delivery_tag, requeue=True)
    assert redelivery_state(channel, queue) == [(b"b", True), (b"c", False)]


def test_ack_multiple(connection, name):
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"a", b"b", b"c"])
    taken = take(channel, queue, 3)
    channel.basic_ack(taken[1][0].delivery_tag, multiple=True)
    channel.close()  # the un-acked third goes back
    assert redelivery_state(connection.channel(), queue) == [(b"c", True)]


def test_ack_of_unknown_delivery_tag_closes_the_channel(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a"])
    take(channel, queue, 1)
    reasons = close_reasons(channel)
    channel.basic_ack(99)  # basic.ack has no reply: the channel.close comes when it comes
    pump(connection, lambda: reasons, "the channel to close")
    [reason] = reasons
    assert isinstance(reason, ChannelClosedByBroker)
    assert reason.reply_code == 406
    assert reason.reply_text.startswith("PRECONDITION_FAILED")
    assert redelivery_state(connection.channel(), queue) == [(b"a", True)]


def test_recover_requeue_redelivers(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c"])
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 3, "three deliveries")
    assert [method.redelivered for method, _, _ in received] == [False, False, False]

    channel.basic_recover(requeue=True)
    pump(connection, lambda: len(received) >= 6, "three redeliveries")
    settle(connection)
    again = received[3:]
    assert [(body, method.redelivered) for method, _, body in again] == [(b"a", True), (b"b", True), (b"c", True)]
    assert len({method.delivery_tag for method, _, _ in received}) == 6  # new tags for the redeliveries
    channel.basic_ack(again[-1][0].delivery_tag, multiple=True)
    settle(connection)
    assert message_count(connection.channel(), queue) == 0


def test_recover_without_requeue_redelivers_to_the_same_consumer(connection, name):
    """basic_recover() without arguments is requeue=False in pika."""
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"a", b"b"])
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")

    channel.basic_recover()
    pump(connection, lambda: len(received) >= 4, "two redeliveries")
    settle(connection)
    assert [(method.consumer_tag, body, method.redelivered) for method, _, body in received[2:]] == [
        (tag, b"a", True),
        (tag, b"b", True),
    ]
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    channel.close()
    assert message_count(connection.channel(), queue) == 0


def test_recover_respects_the_prefetch_window(connection, channel, name):
    queue = name()
    fill(channel, queue, [b"a", b"b", b"c", b"d"])
    channel.basic_qos(prefetch_count=2)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")

    channel.basic_recover(requeue=True)
    pump(connection, lambda: len(received) >= 4, "two redeliveries")
    settle(connection)
    assert [(body, method.redelivered) for method, _, body in received] == [
        (b"a", False),
        (b"b", False),
        (b"a", True),
        (b"b", True),
    ]
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    pump(connection, lambda: len(received) >= 6, "the rest")
    settle(connection)
    assert [body for _, _, body in received[4:]] == [b"c", b"d"]


def test_many_messages_consumed_in_order_with_multiple_acks(connection, channel, name):
    queue = name()
    count = 2000
    fill(channel, queue, [b"%d" % number for number in range(count)])
    channel.basic_qos(prefetch_count=50)
    bodies = []

    def on_message(ch, method, properties, body):
        bodies.append(body)
        if len(bodies) % 25 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)

    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(bodies) >= count, f"{count} deliveries", timeout=20)
    assert bodies == [b"%d" % number for number in range(count)]
    assert message_count(connection.channel(), queue) == 0


# -- requeue when a client goes away


def test_unacked_messages_requeued_in_order_when_a_consumer_disconnects(connect, name):
    queue = name()
    first = connect()
    channel = first.channel()
    fill(channel, queue, [b"m%d" % number for number in range(5)])
    channel.basic_qos(prefetch_count=3)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(first, lambda: len(received) >= 3, "three deliveries")
    settle(first)
    assert [body for _, _, body in received] == [b"m0", b"m1", b"m2"]
    first.close()

    second = connect().channel()
    assert redelivery_state(second, queue) == [
        (b"m0", True),
        (b"m1", True),
        (b"m2", True),
        (b"m3", False),
        (b"m4", False),
    ]


def test_unacked_messages_requeued_when_a_channel_closes(connection, name):
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"x", b"y"])
    take(channel, queue, 2)
    channel.close()
    assert redelivery_state(connection.channel(), queue) == [(b"x", True), (b"y", True)]


# -- transactions


def test_tx_publishes_wait_for_commit_and_vanish_on_rollback(connection, name):
    queue = name()
    watcher = connection.channel()
    watcher.queue_declare(queue)
    channel = connection.channel()
    assert isinstance(channel.tx_select().method, spec.Tx.SelectOk)

    channel.basic_publish("", queue, b"t1")
    channel.basic_publish("", queue, b"t2")
    assert message_count(watcher, queue) == 0
    assert isinstance(channel.tx_commit().method, spec.Tx.CommitOk)
    assert message_count(watcher, queue) == 2

    channel.basic_publish("", queue, b"rolled back")
    assert isinstance(channel.tx_rollback().method, spec.Tx.RollbackOk)
    assert message_count(watcher, queue) == 2
    channel.tx_commit()  # an empty transaction
    assert get_bodies(watcher, queue) == [b"t1", b"t2"]


def test_tx_acks_apply_on_commit_only(connection, name):
    queue = name()
    channel = connection.channel()
    fill(channel, queue, [b"a", b"b"])
    channel.tx_select()
    taken = take(channel, queue, 2)

    channel.basic_ack(taken[0][0].delivery_tag)
    channel.tx_rollback()  # the ack is forgotten: "a" stays un-acked
    channel.basic_ack(taken[1][0].delivery_tag)
    channel.tx_commit()  # only "b" is acked
    channel.close()
    assert redelivery_state(connection.channel(), queue) == [(b"a", True)]


def test_tx_mandatory_unroutable_returned_at_commit(connection, channel, name):
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method, body)))
    channel.tx_select()
    channel.basic_publish("", name("nobody"), b"unroutable in tx", mandatory=True)
    settle(connection)
    assert returned == []
    channel.tx_commit()
    pump(connection, lambda: returned, "basic.return after commit")
    assert [(method.reply_code, body) for method, body in returned] == [(312, b"unroutable in tx")]


def test_tx_commit_without_select_is_refused(channel):
    error = closed_by_broker(channel.tx_commit)
    assert error.reply_code == 406


# -- channel.flow


@pytest.mark.skipif(not hasattr(pika.adapters.blocking_connection.BlockingChannel, "flow"), reason="no channel.flow")
def test_channel_flow_pauses_and_resumes_deliveries(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    assert channel.flow(False) is False

    publisher = connection.channel()
    for body in (b"1", b"2", b"3"):
        publisher.basic_publish("", queue, body)
    settle(connection)
    assert received == []
    assert message_count(publisher, queue) == 3

    assert channel.flow(True) is True
    pump(connection, lambda: len(received) >= 3, "deliveries after flow resumed")
    assert [body for _, _, body in received] == [b"1", b"2", b"3"]


# -- heartbeats


def test_heartbeats_keep_an_idle_connection_alive(connect, own_broker, name):
    broker = own_broker("--heartbeat", "1")
    connection = connect(broker, heartbeat=1)
    negotiated = connection._impl.params.heartbeat
    assert negotiated == 1
    connection.sleep(3.2)  # pika's event loop runs (and heartbeats) while it waits
    assert connection.is_open
    checker = connection._impl._heartbeat_checker
    assert checker is not None
    assert checker._heartbeat_frames_received >= 2, "the broker sent no heartbeats on an idle connection"

    channel = connection.channel()
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"still alive")
    assert get_bodies(channel, queue) == [b"still alive"]
    assert not [line for line in broker.process.output if "missed heartbeats" in line]


def test_broker_heartbeat_is_offered_to_the_client(connect, own_broker):
    """With heartbeat=None pika takes whatever the broker proposes in connection.tune."""
    broker = own_broker("--heartbeat", "7")
    connection = connect(broker, heartbeat=None)
    assert connection._impl.params.heartbeat == 7


def test_client_may_turn_heartbeats_off(connect, own_broker, name):
    broker = own_broker("--heartbeat", "1")
    connection = connect(broker, heartbeat=0)
    assert connection._impl.params.heartbeat == 0
    connection.sleep(2.5)  # longer than the two missed 1 s heartbeats the broker would allow
    assert connection.is_open
    channel = connection.channel()
    queue = name()
    channel.queue_declare(queue)
    assert message_count(channel, queue) == 0
    assert not [line for line in broker.process.output if "missed heartbeats" in line]


# -- bodies


def round_trip_large(connection, queue, body):
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    channel.basic_publish("", queue, body)
    channel.basic_publish("", queue, body)

    method, _, got = channel.basic_get(queue, auto_ack=True)
    assert method is not None
    assert (len(got), hashlib.sha256(got).hexdigest()) == (len(body), hashlib.sha256(body).hexdigest())

    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: received, "a large delivery", timeout=20)
    got = received[0][2]
    assert (len(got), hashlib.sha256(got).hexdigest()) == (len(body), hashlib.sha256(body).hexdigest())


def test_ten_mebibyte_body_round_trips(connection, name):
    round_trip_large(connection, name(), os.urandom(10 * MiB))


def test_ten_mebibyte_body_with_small_frames(connect, own_broker, name):
    broker = own_broker("--frame-max", "4096")
    connection = connect(broker)
    assert connection._impl.params.frame_max == 4096
    round_trip_large(connection, name(), os.urandom(10 * MiB))

    # A returned message is split the same way.
    channel = connection.channel()
    channel.confirm_delivery()
    body = os.urandom(100 * 1024)
    with pytest.raises(UnroutableError) as raised:
        channel.basic_publish("", name("nobody"), body, pika.BasicProperties(headers=HEADERS), mandatory=True)
    [returned] = raised.value.messages
    assert returned.body == body
    assert type_differences(returned.properties.headers, HEADERS) == []


def test_empty_body(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"", pika.BasicProperties(content_type="text/plain"))
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert (body, properties.content_type) == (b"", "text/plain")

    channel.basic_publish("", queue, b"")
    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: received, "an empty delivery")
    assert received[0][2] == b""


def test_message_larger_than_max_message_size_closes_the_channel(connect, own_broker, name):
    broker = own_broker("--max-message-size", "1M")
    connection = connect(broker)
    queue = name()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"x" * MiB)  # exactly the limit is fine

    error = closed_by_broker(channel.basic_publish, "", queue, b"x" * (MiB + 1))
    assert error.reply_code == 406
    assert error.reply_text.startswith("PRECONDITION_FAILED")
    assert connection.is_open
    channel = connection.channel()
    assert message_count(channel, queue) == 1
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert len(body) == MiB


# -- properties and headers


def every_property(headers=None):
    return pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=headers if headers is not None else {"origin": "pika"},
        delivery_mode=2,
        priority=7,
        correlation_id="correlation-1",
        reply_to="replies.here",
        expiration="60000",
        message_id="message-1",
        timestamp=1_700_000_000,
        type="order.created",
        user_id="guest",
        app_id="interop-tests",
    )


PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


def typed(value):
    """C{value} with the type of every part spelled out, so that 1 == True or 1 == 1.0 do not pass."""
    if isinstance(value, dict):
        return ("dict", {key: typed(item) for key, item in value.items()})
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    if type(value) is pika.compat.long:
        return ("int", int(value))  # pika reads every 64-bit 'l' integer as its int subclass "long"
    return (type(value).__name__, value)


def type_differences(received, sent, path="headers"):
    """Where C{received} differs from C{sent} in value or type, one line per place."""
    if isinstance(sent, dict) and isinstance(received, dict):
        problems = [f"{path}: missing {key!r}" for key in sent if key not in received]
        problems += [f"{path}: unexpected {key!r}" for key in received if key not in sent]
        for key in sent:
            if key in received:
                problems += type_differences(received[key], sent[key], f"{path}[{key!r}]")
        return problems
    if isinstance(sent, list) and isinstance(received, list) and len(sent) == len(received):
        problems = []
        for index, (got, expected) in enumerate(zip(received, sent)):
            problems += type_differences(got, expected, f"{path}[{index}]")
        return problems
    if typed(received) != typed(sent):
        return [f"{path}: sent {sent!r} ({type(sent).__name__}), received {received!r} ({type(received).__name__})"]
    return []


def test_every_basic_property_round_trips(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    sent = every_property()
    channel.basic_publish("", queue, b"{}", sent)
    channel.basic_publish("", queue, b"{}", sent)

    _, by_get, _ = channel.basic_get(queue, auto_ack=True)
    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: received, "a delivery")
    by_consume = received[0][1]
    for properties in (by_get, by_consume):
        assert {field: getattr(properties, field) for field in PROPERTY_NAMES} == {
            field: getattr(sent, field) for field in PROPERTY_NAMES
        }


def test_unset_properties_stay_unset(channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"bare")
    _, properties, _ = channel.basic_get(queue, auto_ack=True)
    assert all(getattr(properties, field) is None for field in PROPERTY_NAMES)


HEADERS = {
    "string": "text with ünïcödé",
    "empty string": "",
    "bytes": b"\x00\x01\xfe\xffbinary",
    "small int": 42,
    "zero": 0,
    "negative int": -7,
    "int32 max": 2**31 - 1,
    "int32 min": -(2**31),
    "large int": 2**40 + 3,
    "large negative int": -(2**62),
    "true": True,
    "false": False,
    "decimal": decimal.Decimal("3.14"),
    "negative decimal": decimal.Decimal("-0.005"),
    "whole decimal": decimal.Decimal("12"),
    "datetime": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc),
    "nested": {"inner": "value", "number": 1, "deeper": {"list": [1, "two"], "flag": False}},
    "empty table": {},
    "list": [1, "two", b"three", True, None, -(2**40), decimal.Decimal("1.5"), {"key": "value"}, [2, [3]]],
    "empty list": [],
    "none": None,
}


def test_headers_of_every_pika_type_round_trip(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"headers", pika.BasicProperties(headers=HEADERS))
    channel.basic_publish("", queue, b"headers", pika.BasicProperties(headers=HEADERS))

    _, by_get, _ = channel.basic_get(queue, auto_ack=True)
    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: received, "a delivery")
    by_consume = received[0][1]
    for properties in (by_get, by_consume):
        assert type_differences(properties.headers, HEADERS) == []


def test_headers_survive_a_headers_exchange(channel, name):
    """A headers exchange reads the headers to route; what is delivered must still be what was sent."""
    queue = name()
    channel.queue_declare(queue)
    channel.queue_bind(queue, "amq.headers", "", {"x-match": "any", "string": "text with ünïcödé"})
    channel.basic_publish("amq.headers", "", b"routed by headers", pika.BasicProperties(headers=HEADERS))
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"routed by headers"
    assert type_differences(properties.headers, HEADERS) == []


def test_float_header_round_trips(channel, name):
    try:
        pika.data.encode_value([], 1.5)
    except UnsupportedAMQPFieldException:
        pytest.skip(f"pika {pika.__version__} cannot encode float field values")
    queue = name()
    channel.queue_declare(queue)
    headers = {"float": 1.5, "list": [0.25, -2.0]}
    channel.basic_publish("", queue, b"floats", pika.BasicProperties(headers=headers))
    _, properties, _ = channel.basic_get(queue, auto_ack=True)
    assert type_differences(properties.headers, headers) == []


# -- the native protocol on the other side


def test_pika_publish_native_get(amqp_broker, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    body = "from pika: ünïcödé \x01\x02 tab\tend".encode()
    channel.basic_publish("", queue, body, every_property(HEADERS))  # the broker decodes them for native

    result = native_cli(amqp_broker.native_endpoint, "get", queue)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == body + b"\n"
    assert message_count(channel, queue) == 0  # the CLI acked it

    empty = native_cli(amqp_broker.native_endpoint, "get", queue)
    assert empty.returncode == 2


def test_native_publish_pika_consume(amqp_broker, connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    result = native_cli(
        amqp_broker.native_endpoint,
        "publish",
        "--routing-key",
        queue,
        "--persistent",
        "--confirm",
        "--content-type",
        "text/plain; charset=utf-8",
        "--header",
        "origin=native",
        "--header",
        "trace=a=b",
        "first from native ✓",
        "second",
    )
    assert result.returncode == 0, result.stderr.decode()

    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")
    assert [body for _, _, body in received] == ["first from native ✓".encode(), b"second"]
    for method, properties, _ in received:
        assert (method.exchange, method.routing_key, method.redelivered) == ("", queue, False)
        assert properties.content_type == "text/plain; charset=utf-8"
        assert properties.delivery_mode == 2
        assert type_differences(properties.headers, {"origin": "native", "trace": "a=b"}) == []
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)


def test_native_publish_pika_get_through_topic_exchange(amqp_broker, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.queue_bind(queue, "amq.topic", "native.*")
    result = native_cli(
        amqp_broker.native_endpoint, "publish", "--exchange", "amq.topic", "--routing-key", "native.news", "-",
        input="piped body\nwith a newline".encode(),
    )
    assert result.returncode == 0, result.stderr.decode()
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"piped body\nwith a newline"
    assert (method.exchange, method.routing_key) == ("amq.topic", "native.news")
    assert properties.content_type is None and properties.headers is None


# -- errors stay where they happen


def test_non_ascii_names_and_longest_names(connection, channel, name):
    queue = "очередь-ünï-" + name()
    routing_key = "ключ.ünï"
    channel.queue_declare(queue)
    channel.queue_bind(queue, "amq.topic", "ключ.*")
    received, on_message = collector()
    tag = channel.basic_consume(queue, on_message, consumer_tag="потребитель-✓")
    channel.basic_publish("amq.topic", routing_key, b"unicode")
    pump(connection, lambda: received, "a delivery")
    method = received[0][0]
    assert (method.consumer_tag, method.exchange, method.routing_key) == (tag, "amq.topic", routing_key)
    assert tag == "потребитель-✓"

    longest = (name() + "-" + "é" * 127)
    longest = longest.encode()[:255].decode(errors="ignore")
    longest += "x" * (255 - len(longest.encode()))
    assert len(longest.encode()) == 255
    assert channel.queue_declare(longest).method.queue == longest
    channel.basic_publish("", longest, b"to the longest name")
    method, _, body = channel.basic_get(longest, auto_ack=True)
    assert (method.routing_key, body) == (longest, b"to the longest name")


def test_wrong_password_is_refused(amqp_broker):
    parameters = pika.ConnectionParameters(
        host=amqp_broker.host,
        port=amqp_broker.amqp_port,
        credentials=pika.PlainCredentials("guest", "not the password"),
        connection_attempts=1,
    )
    # pika names a connection.close received during start/start-ok a "probable" authentication error.
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as raised:
        pika.BlockingConnection(parameters)
    assert "(403) 'ACCESS_REFUSED" in str(raised.value)


def test_unknown_virtual_host_is_refused(amqp_broker):
    parameters = pika.ConnectionParameters(
        host=amqp_broker.host,
        port=amqp_broker.amqp_port,
        virtual_host="no-such-vhost",
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
    )
    # pika names a connection.close in answer to connection.open a "probable" access-denied error.
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as raised:
        pika.BlockingConnection(parameters)
    assert "(530)" in str(raised.value) and "NOT_ALLOWED" in str(raised.value)


def test_channel_error_leaves_other_channels_and_connections_working(connect, name):
    first, second = connect(), connect()
    queue = name()
    healthy = first.channel()
    healthy.queue_declare(queue)
    failing = first.channel()
    other = second.channel()

    error = closed_by_broker(failing.queue_declare, name("missing"), passive=True)
    assert error.reply_code == 404
    assert failing.is_closed
    assert first.is_open and healthy.is_open

    healthy.basic_publish("", queue, b"from the healthy channel")
    assert message_count(other, queue) == 1
    other.basic_publish("", queue, b"from the other connection")
    assert get_bodies(healthy, queue) == [b"from the healthy channel", b"from the other connection"]

    reopened = first.channel()
    reopened.queue_declare(queue, passive=True)
    assert first.is_open and second.is_open


def test_many_channels_on_one_connection(connection, name):
    queue = name()
    channels = [connection.channel() for _ in range(20)]
    channels[0].queue_declare(queue)
    for number, channel in enumerate(channels):
        channel.basic_publish("", queue, b"%d" % number)
    assert get_bodies(channels[-1], queue) == [b"%d" % number for number in range(20)]
    for channel in channels:
        channel.close()
    assert connection.is_open
