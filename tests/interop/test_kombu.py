"""kombu (pyamqp transport, that is py-amqp) against a real broker subprocess:
producers and consumers on direct and topic exchanges, SimpleQueue,
serializers, acknowledgement outcomes and prefetch, each as a kombu user
writes them. Mandatory returns, publisher confirms, queue kinds, header types
and a large body are in L{tests.interop.test_kombu_publishing}.

Every test uses its own queue and exchange names, so the tests share the
module's broker without meeting.
"""

import datetime
import decimal

import amqp
import pytest

kombu = pytest.importorskip("kombu")

from kombu import Consumer, Exchange, Producer, Queue  # noqa: E402

from tests.support.kombu_clients import (  # noqa: E402, F401 (broker_log_stays_clean is an autouse fixture)
    QUIET,
    RETRY_POLICY,
    WAIT,
    assert_nothing_more,
    broker_log_stays_clean,
    connection,
    drain_until,
    one_queue,
    ready_count,
    unique,
)


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


def test_requeue_redelivers_with_redelivered_flag(connection):
    queue = one_queue(connection, "requeue")
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
    queue = one_queue(connection, "reject-requeue")
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
    queue = one_queue(connection, "reject-drop")
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
    queue = one_queue(connection, "prefetch")
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
