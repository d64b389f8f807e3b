"""kombu (pyamqp transport, that is py-amqp) against a real broker subprocess.

Producers, consumers, SimpleQueue, serializers, acknowledgement outcomes,
prefetch, mandatory returns, publisher confirms, header types and a large
body, each as a kombu user writes them. Every test uses its own queue and
exchange names, so the tests share the module's broker without meeting.
"""

import datetime
import decimal
import json
import os
import socket
import time

import amqp
import pytest

kombu = pytest.importorskip("kombu")

from kombu import Connection, Consumer, Exchange, Producer, Queue  # noqa: E402

from tests.interop.conftest import TRACEBACK_MARKS, logged_errors, start_broker, unique_names  # noqa: E402

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


def test_transport_is_py_amqp_and_server_is_brokerd(connection):
    assert connection.transport_cls in ("pyamqp", "amqp")
    assert isinstance(connection.connection, amqp.Connection)
    properties = connection.connection.server_properties
    assert properties["product"] == "brokerd"
    assert properties["capabilities"]["publisher_confirms"] is True


def test_direct_exchange_producer_and_consumer_with_manual_ack(connection):
    exchange = Exchange(unique("direct"), type="direct", durable=False)
    queue = Queue(unique("direct-q"), exchange, routing_key="jobs", durable=False)
    producer = Producer(connection)
    for number in range(5):
        producer.publish(
            {"number": number},
            exchange=exchange,
            routing_key="jobs",
            declare=[queue],
            serializer="json",
            retry=True,
            retry_policy=RETRY_POLICY,
        )
    received = []

    def on_message(body, message):
        received.append((body, message.delivery_info))
        message.ack()

    with Consumer(connection, queues=[queue], callbacks=[on_message], accept=["json"]):
        drain_until(connection, lambda: len(received) == 5)
    assert [body for body, _ in received] == [{"number": number} for number in range(5)]
    for _, info in received:
        assert info["exchange"] == exchange.name
        assert info["routing_key"] == "jobs"
        assert info["redelivered"] is False
    assert ready_count(connection, queue) == 0
    # Acknowledged: a fresh consumer finds nothing.
    assert queue.bind(connection.default_channel).get() is None


def test_topic_exchange_routes_by_pattern(connection):
    exchange = Exchange(unique("topic"), type="topic", durable=False)
    star = Queue(unique("topic-star"), exchange, routing_key="stock.*.nyse", durable=False)
    hash_ = Queue(unique("topic-hash"), exchange, routing_key="stock.#", durable=False)
    producer = Producer(connection)
    keys = ["stock.ibm.nyse", "stock.ibm.lse", "stock.nyse", "stock", "weather.nyse", "stock.a.b.nyse"]
    for key in keys:
        producer.publish(
            {"key": key}, exchange=exchange, routing_key=key, declare=[star, hash_], retry=True,
            retry_policy=RETRY_POLICY,
        )
    got = {star.name: [], hash_.name: []}

    def collector(name):
        def on_message(body, message):
            got[name].append(body["key"])
            message.ack()

        return on_message

    with Consumer(connection, queues=[star], callbacks=[collector(star.name)], accept=["json"]), Consumer(
        connection, queues=[hash_], callbacks=[collector(hash_.name)], accept=["json"]
    ):
        drain_until(connection, lambda: len(got[star.name]) == 1 and len(got[hash_.name]) == 5)
    assert got[star.name] == ["stock.ibm.nyse"]
    assert got[hash_.name] == ["stock.ibm.nyse", "stock.ibm.lse", "stock.nyse", "stock", "stock.a.b.nyse"]


def test_simple_queue_put_get_qsize_clear(connection):
    name = unique("simple")
    queue = connection.SimpleQueue(name, queue_opts={"durable": False}, exchange_opts={"durable": False})
    try:
        for number in range(5):
            queue.put({"n": number})
        assert queue.qsize() == 5
        first = queue.get_nowait()  # basic.get
        assert first.payload == {"n": 0}
        first.ack()
        assert queue.qsize() == 4
        assert queue.clear() == 4
        assert queue.qsize() == 0
        with pytest.raises(queue.Empty):
            queue.get_nowait()

        queue.put({"n": "a"})
        queue.put({"n": "b"})
        payloads = []
        for _ in range(2):
            message = queue.get(block=True, timeout=WAIT)  # basic.consume
            payloads.append(message.payload)
            message.ack()
        assert payloads == [{"n": "a"}, {"n": "b"}]
        with pytest.raises(queue.Empty):
            queue.get(block=True, timeout=QUIET)
        assert queue.qsize() == 0
    finally:
        queue.close()


@pytest.mark.parametrize(
    "serializer, compression, payload",
    [
        ("json", None, {"text": "héllo ☃", "numbers": [1, 2.5, -3], "nested": {"ok": True, "none": None}}),
        ("json", "zlib", {"text": "x" * 10000, "list": list(range(100))}),
        (
            "pickle",
            None,
            {
                "set": {1, 2, 3},
                "tuple": (1, "two"),
                "bytes": b"\x00\xff\x10",
                "when": datetime.datetime(2024, 2, 29, 12, 30, 15, 123456),
                "decimal": decimal.Decimal("3.14159"),
            },
        ),
    ],
    ids=["json", "json-zlib", "pickle"],
)
def test_serializer_round_trip(connection, serializer, compression, payload):
    queue = Queue(unique(f"ser-{serializer}"), Exchange(unique("ser-x"), durable=False), "ser", durable=False)
    Producer(connection).publish(
        payload,
        exchange=queue.exchange,
        routing_key="ser",
        declare=[queue],
        serializer=serializer,
        compression=compression,
        retry=True,
        retry_policy=RETRY_POLICY,
    )
    received = []

    def on_message(body, message):
        received.append((body, message))
        message.ack()

    with Consumer(connection, queues=[queue], callbacks=[on_message], accept=[serializer]):
        drain_until(connection, lambda: received)
    body, message = received[0]
    assert body == payload
    expected_type = {"json": "application/json", "pickle": "application/x-python-serialize"}[serializer]
    assert message.content_type == expected_type
    if compression:
        assert message.headers["compression"] == "application/x-gzip"


def _one_queue(connection, prefix):
    queue = Queue(unique(prefix), Exchange(unique(f"{prefix}-x"), durable=False), "rk", durable=False)
    queue.bind(connection.default_channel).declare()
    return queue


def test_requeue_redelivers_with_redelivered_flag(connection):
    queue = _one_queue(connection, "requeue")
    Producer(connection).publish({"job": 1}, exchange=queue.exchange, routing_key="rk", retry=True)
    seen = []

    def on_message(body, message):
        seen.append(message.delivery_info["redelivered"])
        if len(seen) == 1:
            message.requeue()
        else:
            message.ack()

    with Consumer(connection, queues=[queue], callbacks=[on_message], accept=["json"]):
        drain_until(connection, lambda: len(seen) == 2)
    assert seen == [False, True]
    assert ready_count(connection, queue) == 0


def test_reject_with_requeue_redelivers(connection):
    queue = _one_queue(connection, "reject-requeue")
    Producer(connection).publish({"job": 2}, exchange=queue.exchange, routing_key="rk", retry=True)
    seen = []

    def on_message(body, message):
        seen.append((body, message.delivery_info["redelivered"]))
        if len(seen) == 1:
            message.reject(requeue=True)
        else:
            message.ack()

    with Consumer(connection, queues=[queue], callbacks=[on_message], accept=["json"]):
        drain_until(connection, lambda: len(seen) == 2)
    assert seen == [({"job": 2}, False), ({"job": 2}, True)]


def test_reject_without_requeue_drops_the_message(connection):
    queue = _one_queue(connection, "reject-drop")
    producer = Producer(connection)
    producer.publish({"job": "drop me"}, exchange=queue.exchange, routing_key="rk", retry=True)
    producer.publish({"job": "keep me"}, exchange=queue.exchange, routing_key="rk", retry=True)
    received = []

    def on_message(body, message):
        received.append(message)
        if body["job"] == "drop me":
            message.reject(requeue=False)

    channel = connection.channel()
    with Consumer(channel, queues=[queue], callbacks=[on_message], accept=["json"]):
        drain_until(connection, lambda: len(received) == 2)
    # Closing the channel returns the unacknowledged "keep me", not the rejected one.
    channel.close()
    assert ready_count(connection, queue) == 1
    left = queue.bind(connection.default_channel).get(accept=["json"])
    assert left.payload == {"job": "keep me"}
    assert left.delivery_info["redelivered"] is True
    left.ack()


def test_prefetch_count_limits_unacked_deliveries(connection):
    queue = _one_queue(connection, "prefetch")
    producer = Producer(connection)
    for number in range(5):
        producer.publish({"n": number}, exchange=queue.exchange, routing_key="rk", retry=True)
    received = []

    def on_message(body, message):
        received.append(message)

    channel = connection.channel()
    with Consumer(channel, queues=[queue], callbacks=[on_message], accept=["json"], prefetch_count=2):
        drain_until(connection, lambda: len(received) == 2)
        assert ready_count(connection, queue) == 3
        assert_nothing_more(connection, received, 2)
        received[0].ack()
        drain_until(connection, lambda: len(received) == 3)
        assert_nothing_more(connection, received, 3)
        for message in received[1:]:
            message.ack()
        drain_until(connection, lambda: len(received) == 5)
        for message in received[3:]:
            message.ack()
    channel.close()
    assert [message.payload["n"] for message in received] == [0, 1, 2, 3, 4]
    assert ready_count(connection, queue) == 0


def test_mandatory_publish_to_unroutable_key_is_returned_with_312(connection):
    exchange = Exchange(unique("mandatory"), type="direct", durable=False)
    bound = Queue(unique("mandatory-q"), exchange, routing_key="routed", durable=False)
    returned = []

    def on_return(exception, exchange_name, routing_key, message):
        returned.append((exception, exchange_name, routing_key, message))

    producer = Producer(connection.default_channel, on_return=on_return)
    producer.publish(
        {"lost": True}, exchange=exchange, routing_key="nobody-binds-this", declare=[bound], mandatory=True
    )
    producer.publish({"lost": False}, exchange=exchange, routing_key="routed", mandatory=True)
    drain_until(connection, lambda: returned)
    exception, exchange_name, routing_key, message = returned[0]
    assert exception.reply_code == 312
    assert exception.reply_text == "NO_ROUTE"
    assert exchange_name == exchange.name
    assert routing_key == "nobody-binds-this"
    assert json.loads(message.body) == {"lost": True}  # py-amqp decodes it by its content_encoding
    assert message.properties["content_type"] == "application/json"
    # The routable one was queued, not returned.
    assert_nothing_more(connection, returned, 1)
    assert ready_count(connection, bound) == 1


def test_mandatory_publish_to_missing_queue_on_default_exchange_is_returned(connection):
    returned = []
    producer = Producer(connection.default_channel, on_return=lambda *args: returned.append(args))
    producer.publish(b"orphan", exchange="", routing_key=unique("no-such-queue"), mandatory=True)
    drain_until(connection, lambda: returned)
    exception, exchange_name, _, message = returned[0]
    assert (exception.reply_code, exchange_name, message.body) == (312, "", b"orphan")


def test_confirm_publish_waits_for_the_broker(amqp_broker):
    url = kombu_url(amqp_broker)
    queue = Queue(unique("confirm"), Exchange(unique("confirm-x"), durable=False), "rk", durable=False)
    returned = []
    with Connection(url, transport_options={"confirm_publish": True}) as conn:
        channel = conn.default_channel
        assert channel.basic_publish == channel.basic_publish_confirm
        producer = Producer(channel, on_return=lambda *args: returned.append(args))
        for number in range(20):
            producer.publish({"n": number}, exchange=queue.exchange, routing_key="rk", declare=[queue])
        # Each publish returned only after its basic.ack: all 20 are in the queue already.
        assert ready_count(conn, queue) == 20
        # Unroutable and mandatory: basic.return comes before the basic.ack the publish waits for.
        producer.publish({"n": "lost"}, exchange=queue.exchange, routing_key="elsewhere", mandatory=True)
        assert len(returned) == 1
        assert returned[0][0].reply_code == 312
        assert queue.bind(channel).purge() == 20


def test_confirm_publish_raises_when_the_broker_refuses_a_message(tmp_path):
    broker = start_broker(tmp_path, "--max-message-size", "1K")
    try:
        queue = Queue(unique("refused"), Exchange(unique("refused-x"), durable=False), "rk", durable=False)
        with Connection(kombu_url(broker), transport_options={"confirm_publish": True}) as conn:
            producer = Producer(conn)
            producer.publish(b"small", exchange=queue.exchange, routing_key="rk", declare=[queue])
            with pytest.raises(amqp.exceptions.PreconditionFailed) as caught:
                Producer(conn.channel()).publish(b"x" * 2048, exchange=queue.exchange, routing_key="rk")
            assert caught.value.reply_code == 406
            assert "max size" in caught.value.reply_text
            assert ready_count(conn, queue) == 1
    finally:
        broker.process.stop()
    assert not logged_errors(broker.process, 0, TRACEBACK_MARKS), "\n".join(broker.process.output)


def test_exclusive_queue_belongs_to_its_connection(amqp_broker, connection):
    queue = Queue(unique("exclusive"), exclusive=True, durable=False)
    queue.bind(connection.default_channel).declare()
    with Connection(kombu_url(amqp_broker)) as other:
        with pytest.raises(amqp.exceptions.ResourceLocked) as caught, other.channel() as channel:
            queue.bind(channel).queue_declare(passive=True)
        assert caught.value.reply_code == 405
    assert ready_count(connection, queue) == 0  # its owner still sees it
    connection.release()
    with Connection(kombu_url(amqp_broker)) as later:
        with pytest.raises(amqp.exceptions.NotFound) as caught, later.channel() as channel:
            queue.bind(channel).queue_declare(passive=True)
        assert caught.value.reply_code == 404


def test_auto_delete_queue_goes_with_its_last_consumer(connection):
    queue = Queue(unique("auto-delete"), Exchange(unique("auto-delete-x"), durable=False), "rk",
                  auto_delete=True, durable=False)
    channel = connection.channel()
    consumer = Consumer(channel, queues=[queue], callbacks=[lambda body, message: None], accept=["json"])
    consumer.consume()
    assert ready_count(connection, queue) == 0  # declared, and alive while consumed
    consumer.cancel()  # basic.cancel of the only consumer
    with pytest.raises(amqp.exceptions.NotFound), connection.channel() as probe:
        queue.bind(probe).queue_declare(passive=True)
    channel.close()


def test_server_named_queue(connection):
    queue = Queue("", exclusive=True, auto_delete=True, durable=False)
    bound = queue.bind(connection.default_channel)
    bound.declare()
    assert bound.name.startswith("amq.gen-"), bound.name
    Producer(connection).publish({"to": "anonymous"}, exchange="", routing_key=bound.name, retry=True)
    received = []
    with Consumer(connection, queues=[bound], callbacks=[lambda body, message: received.append(message)],
                  accept=["json"]):
        drain_until(connection, lambda: received)
    received[0].ack()
    assert received[0].payload == {"to": "anonymous"}
    assert received[0].delivery_info["routing_key"] == bound.name


HEADERS = {
    "string": "plain",
    "unicode": "grüße ☃ 日本",
    "empty": "",
    "int": 42,
    "negative": -7,
    "zero": 0,
    "int32_max": 2**31 - 1,
    "big": 2**40 + 3,
    "big_negative": -(2**50),
    "float": 3.25,
    "negative_float": -0.5,
    "true": True,
    "false": False,
    "none": None,
    "decimal": decimal.Decimal("12.345"),
    "timestamp": datetime.datetime(2023, 7, 14, 8, 30, 45),
    "list": [1, "two", 3.5, True, None, [4, 5], {"six": 6}],
    "empty_list": [],
    "table": {"nested": {"deeper": "yes", "n": 1}, "flag": False},
    "empty_table": {},
    "binary": b"\xff\x00\xfe",
}


def test_headers_of_several_types_round_trip(connection):
    queue = _one_queue(connection, "headers")
    Producer(connection).publish(
        {"body": 1}, exchange=queue.exchange, routing_key="rk", headers=HEADERS, retry=True
    )
    received = []
    with Consumer(connection, queues=[queue], callbacks=[lambda body, message: received.append(message)],
                  accept=["json"]):
        drain_until(connection, lambda: received)
    message = received[0]
    message.ack()
    for name, value in HEADERS.items():
        assert name in message.headers, name
        assert message.headers[name] == value, name
        assert type(message.headers[name]) is type(value), name


def test_headers_exchange_routes_on_typed_header_values(connection):
    exchange = Exchange(unique("headers-x"), type="headers", durable=False)
    all_match = Queue(
        unique("headers-all"), exchange, binding_arguments={"x-match": "all", "format": "pdf", "version": 2},
        durable=False,
    )
    any_match = Queue(
        unique("headers-any"), exchange, binding_arguments={"x-match": "any", "format": "zip", "urgent": True},
        durable=False,
    )
    producer = Producer(connection)
    cases = [
        ({"format": "pdf", "version": 2, "extra": [1, {"a": None}]}, "pdf-2"),
        ({"format": "pdf", "version": 3}, "pdf-3"),
        ({"format": "zip"}, "zip"),
        ({"urgent": True, "size": 2**40}, "urgent"),
        ({"format": "txt", "urgent": False}, "none"),
    ]
    for headers, label in cases:
        producer.publish(
            label, exchange=exchange, routing_key="", headers=headers, declare=[all_match, any_match],
            serializer="json", retry=True,
        )
    channel = connection.default_channel
    got = {}
    for queue in (all_match, any_match):
        labels = []
        while (message := queue.bind(channel).get(no_ack=True, accept=["json"])) is not None:
            labels.append(message.payload)
        got[queue.name] = labels
    assert got[all_match.name] == ["pdf-2"]
    assert got[any_match.name] == ["zip", "urgent"]


def test_ten_mebibyte_body(connection):
    body = os.urandom(10 * 1024 * 1024)
    queue = _one_queue(connection, "large")
    producer = Producer(connection)
    for _ in range(2):
        producer.publish(
            body, exchange=queue.exchange, routing_key="rk", content_type="application/octet-stream",
            content_encoding="binary", retry=True,
        )
    # One by basic.get...
    fetched = queue.bind(connection.default_channel).get(no_ack=False, accept=["application/octet-stream"])
    assert fetched is not None
    assert len(fetched.body) == len(body)
    assert fetched.body == body
    fetched.ack()
    # ...and one by basic.consume.
    received = []
    with Consumer(connection, queues=[queue], callbacks=[lambda _, message: received.append(message)],
                  accept=["application/octet-stream"]):
        drain_until(connection, lambda: received, timeout=60)
    received[0].ack()
    assert len(received[0].body) == len(body)
    assert received[0].body == body
    assert ready_count(connection, queue) == 0
