"""pika's BlockingConnection against a real broker: basic properties and header
tables round trip with their types, messages cross to and from the native
protocol CLI, and non-ASCII and 255-byte names work."""

import pika
import pytest
from pika.exceptions import UnsupportedAMQPFieldException

from brokerd.testing import native_cli
from tests.support.pika_clients import HEADERS, collector, message_count, pump, type_differences

pytestmark = pytest.mark.usefixtures("watchdog")


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


# -- names


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
