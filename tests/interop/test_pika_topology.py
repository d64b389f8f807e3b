"""pika's BlockingConnection against a real broker: declaring, binding, purging
and deleting exchanges and queues, and the errors the broker answers with."""

import pika
import pytest
from pika import spec

from tests.support.pika_clients import (
    closed_by_broker,
    collector,
    consumer_count,
    fill,
    get_bodies,
    message_count,
    pump,
    redelivery_state,
)

pytestmark = pytest.mark.usefixtures("watchdog")


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


# -- bindings


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


# -- purge and delete


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
