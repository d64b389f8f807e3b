"""Broker.recover: durable topology and persistent messages come back from the store."""

import pytest

from brokerd.errors import AccessRefused, NotFound, PreconditionFailed
from brokerd.proto.tables import dict_to_table
from brokerd.session.connection import Connection
from tests.support.broker import make_broker, open_channel, properties


def fill_store():
    """A store filled through one broker: durable and transient topology, some messages acked."""
    broker, _clock = make_broker()
    channel, _ = open_channel(broker)
    channel.exchange_declare("events", "topic", durable=True)
    channel.exchange_declare("by-header", "headers", durable=True, arguments={"alternate-exchange": "ae"})
    channel.exchange_declare("hidden", "direct", durable=True, internal=True)
    channel.exchange_declare("transient-ex", "fanout")
    channel.queue_declare("work", durable=True, arguments={"x-max-length": 10})
    channel.queue_declare("transient-q")
    channel.queue_bind("work", "events", "order.*")
    channel.queue_bind("work", "amq.direct", "direct-key")
    channel.queue_bind("work", "by-header", "", {"x-match": "any", "kind": "order"})
    channel.queue_bind("transient-q", "events", "#")
    for body in (b"m1", b"m2", b"m3", b"m4"):
        channel.basic_publish("events", "order.new", properties(persistent=True), body)
    channel.basic_publish("events", "order.new", properties(), b"transient")
    m1_tag, _, m1, _ = channel.basic_get("work")
    _, _, m2, _ = channel.basic_get("work")  # delivered, never acked: the store still holds it
    m3_tag, _, m3, _ = channel.basic_get("work")
    assert [m1.body, m2.body, m3.body] == [b"m1", b"m2", b"m3"]
    channel.basic_ack(m1_tag)
    channel.basic_ack(m3_tag)
    return broker.store


def test_recover_reports_what_it_rebuilt():
    store = fill_store()
    broker, _ = make_broker(store)
    assert broker.recover() == {
        "exchanges": 3, "queues": 1, "bindings": 3, "messages": 2, "unavailable": 0, "quarantined": 0,
    }


def test_recover_brings_back_unacked_persistent_messages_in_queue_order():
    store = fill_store()
    broker, _ = make_broker(store)
    broker.recover()
    channel, _ = open_channel(broker)
    bodies = []
    while (got := channel.basic_get("work")) is not None:
        delivery_tag, _redelivered, message, _left = got
        bodies.append(message.body)
        channel.basic_ack(delivery_tag)
    assert bodies == [b"m2", b"m4"]
    assert store.stats()["messages"] == 0, "acking recovered messages must release them in the store"


def test_recover_brings_back_exchanges_and_queues_with_their_attributes():
    broker, _ = make_broker(fill_store())
    broker.recover()
    vhost = broker.vhost("/")
    assert vhost.declare_exchange("events", "topic", durable=True).type_name == "topic"
    vhost.declare_exchange("by-header", "headers", durable=True, arguments={"alternate-exchange": "ae"})
    vhost.declare_exchange("hidden", "direct", durable=True, internal=True)
    vhost.declare_queue("work", durable=True, arguments={"x-max-length": 10})
    with pytest.raises(PreconditionFailed):
        vhost.declare_queue("work", durable=True)
    with pytest.raises(AccessRefused):
        open_channel(broker)[0].basic_publish("hidden", "", properties(), b"m")


def test_recover_leaves_transient_topology_behind():
    broker, _ = make_broker(fill_store())
    broker.recover()
    vhost = broker.vhost("/")
    with pytest.raises(NotFound):
        vhost.declare_exchange("transient-ex", "fanout", passive=True)
    with pytest.raises(NotFound):
        vhost.declare_queue("transient-q", passive=True)


@pytest.mark.parametrize(
    "exchange, routing_key, headers",
    [("events", "order.paid", None), ("amq.direct", "direct-key", None), ("by-header", "", {"kind": "order"})],
)
def test_recovered_bindings_route(exchange, routing_key, headers):
    broker, _ = make_broker(fill_store())
    broker.recover()
    channel, _ = open_channel(broker)
    props = properties(headers=dict_to_table(headers)) if headers else properties()
    channel.basic_publish(exchange, routing_key, props, b"new")
    assert broker.vhost("/").queues["work"].message_count == 3


def test_recover_recreates_other_vhosts():
    first, _ = make_broker()
    first.add_vhost("staging")
    channel, _ = open_channel(first, connection=Connection(first, "staging"))
    channel.queue_declare("q", durable=True)
    channel.basic_publish("", "q", properties(persistent=True), b"m")

    second, _ = make_broker(first.store)
    second.recover()
    channel, _ = open_channel(second, connection=Connection(second, "staging"))
    assert channel.queue_declare("q", passive=True) == ("q", 1, 0)
    assert "q" not in second.vhost("/").queues


@pytest.mark.parametrize("arguments", [{}, {"x-max-length": 10}], ids=["paged", "loaded"])
def test_recovered_messages_are_not_counted_as_published_and_new_ones_are(arguments):
    """The management API's per-queue publish count: what publishers sent since start, not what came back."""
    broker, _clock = make_broker()
    channel, _ = open_channel(broker)
    channel.queue_declare("kept", durable=True, arguments=arguments)
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", "kept", properties(persistent=True), body)
    assert broker.vhosts["/"].queues["kept"].messages_published == 3
    restarted, _ = make_broker(broker.store)
    restarted.recover()
    queue = restarted.vhosts["/"].queues["kept"]
    assert (queue.message_count, queue.messages_published) == (3, 0)
    channel, _ = open_channel(restarted)
    channel.basic_publish("", "kept", properties(persistent=True), b"d")
    assert (queue.message_count, queue.messages_published) == (4, 1)
