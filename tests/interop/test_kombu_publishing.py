"""kombu (pyamqp transport, that is py-amqp) against a real broker subprocess,
publishing and declaring: mandatory returns, publisher confirms (and a refused
publish), exclusive, auto-delete and server-named queues, header values of
every type (also as a headers exchange routes on them) and a 10 MiB body.

Every test uses its own queue and exchange names, so the tests share the
module's broker without meeting.
"""

import datetime
import decimal
import json
import os

import amqp
import pytest

kombu = pytest.importorskip("kombu")

from kombu import Connection, Consumer, Exchange, Producer, Queue  # noqa: E402

from tests.support.client_broker import TRACEBACK_MARKS, logged_errors, start_broker  # noqa: E402
from tests.support.kombu_clients import (  # noqa: E402, F401 (broker_log_stays_clean is an autouse fixture)
    assert_nothing_more,
    broker_log_stays_clean,
    connection,
    drain_until,
    kombu_url,
    one_queue,
    ready_count,
    unique,
)


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
    queue = one_queue(connection, "headers")
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
    queue = one_queue(connection, "large")
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
