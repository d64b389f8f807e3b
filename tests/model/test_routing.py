"""Routing through a real VirtualHost: direct, fanout, topic, headers, default and amq.* exchanges."""

import pytest

from brokerd.errors import AccessRefused, PreconditionFailed
from brokerd.model.message import Message
from brokerd.proto.tables import dict_to_table
from tests.support.broker import TOPIC_MATCH_CASES, make_broker, properties


@pytest.fixture
def vhost():
    broker, _clock = make_broker()
    return broker.vhost("/")


def publish(vhost, exchange, routing_key, headers=None):
    """Publishes a transient message; returns the names of the queues it landed in."""
    before = {name: queue.message_count for name, queue in vhost.queues.items()}
    props = properties(headers=dict_to_table(headers)) if headers is not None else properties()
    routed, _stored, _refused = vhost.publish(exchange, Message(exchange, routing_key, props, b"body"))
    landed = {name for name, queue in vhost.queues.items() if queue.message_count > before[name]}
    assert routed == len(landed)
    for name in landed:
        assert vhost.queues[name].message_count == before[name] + 1, f"{name!r} got the message twice"
    return landed


def bound_queue(vhost, exchange, exchange_type, routing_key="", arguments=None, queue="q"):
    """Declares an exchange (unless predeclared) and a queue bound to it."""
    if not exchange.startswith("amq."):
        vhost.declare_exchange(exchange, exchange_type)
    vhost.declare_queue(queue)
    vhost.bind(queue, exchange, routing_key, arguments)


# -- direct


@pytest.mark.parametrize(
    "binding_key, routing_key, matches",
    [
        ("k", "k", True),
        ("k", "K", False),
        ("k", "k.x", False),
        ("k", "", False),
        ("", "", True),
        ("", "k", False),
        ("a.*", "a.b", False),  # no wildcards in direct exchanges
        ("#", "anything", False),
        ("a.*", "a.*", True),
        ("clé", "clé", True),
    ],
)
def test_direct_exchange_routes_on_the_exact_key(vhost, binding_key, routing_key, matches):
    bound_queue(vhost, "ex", "direct", binding_key)
    assert publish(vhost, "ex", routing_key) == ({"q"} if matches else set())


def test_direct_exchange_routes_to_every_queue_bound_with_the_key(vhost):
    vhost.declare_exchange("ex", "direct")
    for name, key in (("q1", "red"), ("q2", "red"), ("q3", "blue")):
        vhost.declare_queue(name)
        vhost.bind(name, "ex", key)
    assert publish(vhost, "ex", "red") == {"q1", "q2"}
    assert publish(vhost, "ex", "blue") == {"q3"}
    assert publish(vhost, "ex", "green") == set()


def test_two_bindings_of_one_queue_deliver_one_copy_and_unbinding_one_keeps_the_other(vhost):
    bound_queue(vhost, "ex", "direct", "k")
    vhost.bind("q", "ex", "k", {"tag": "second"})
    assert publish(vhost, "ex", "k") == {"q"}
    vhost.unbind("q", "ex", "k")
    assert publish(vhost, "ex", "k") == {"q"}
    vhost.unbind("q", "ex", "k", {"tag": "second"})
    assert publish(vhost, "ex", "k") == set()


def test_binding_twice_is_one_binding(vhost):
    bound_queue(vhost, "ex", "direct", "k")
    vhost.bind("q", "ex", "k")
    vhost.unbind("q", "ex", "k")
    assert publish(vhost, "ex", "k") == set()


# -- fanout


@pytest.mark.parametrize("binding_key, routing_key", [("", ""), ("", "any"), ("k", "other"), ("#", "")])
def test_fanout_exchange_ignores_the_routing_key(vhost, binding_key, routing_key):
    bound_queue(vhost, "ex", "fanout", binding_key)
    vhost.declare_queue("q2")
    vhost.bind("q2", "ex", "something else")
    assert publish(vhost, "ex", routing_key) == {"q", "q2"}


def test_fanout_exchange_stops_routing_to_an_unbound_queue(vhost):
    bound_queue(vhost, "ex", "fanout")
    vhost.unbind("q", "ex", "")
    assert publish(vhost, "ex", "") == set()


# -- topic


@pytest.mark.parametrize("binding_key, routing_key, matches", TOPIC_MATCH_CASES)
def test_topic_exchange_matches_like_rabbitmq(vhost, binding_key, routing_key, matches):
    bound_queue(vhost, "ex", "topic", binding_key)
    assert publish(vhost, "ex", routing_key) == ({"q"} if matches else set())


def test_topic_exchange_routes_once_per_queue_whatever_the_matching_bindings(vhost):
    bound_queue(vhost, "ex", "topic", "a.*")
    vhost.bind("q", "ex", "#")
    vhost.bind("q", "ex", "a.b")
    assert publish(vhost, "ex", "a.b") == {"q"}


def test_topic_route_cache_forgets_an_unbound_queue(vhost):
    bound_queue(vhost, "ex", "topic", "a.*")
    assert publish(vhost, "ex", "a.b") == {"q"}
    vhost.unbind("q", "ex", "a.*")
    assert publish(vhost, "ex", "a.b") == set()


def test_topic_route_cache_learns_a_new_binding(vhost):
    bound_queue(vhost, "ex", "topic", "a.*")
    assert publish(vhost, "ex", "x.y") == set()
    vhost.bind("q", "ex", "x.#")
    assert publish(vhost, "ex", "x.y") == {"q"}


def test_topic_route_cache_forgets_a_deleted_queue(vhost):
    bound_queue(vhost, "ex", "topic", "a.*")
    assert publish(vhost, "ex", "a.b") == {"q"}
    vhost.delete_queue("q")
    vhost.declare_queue("q")
    assert publish(vhost, "ex", "a.b") == set()


# -- headers


def headers_queue(vhost, arguments):
    bound_queue(vhost, "hx", "headers", "", arguments)


@pytest.mark.parametrize(
    "arguments, headers, matches",
    [
        # all: every argument must match
        ({"x-match": "all", "a": 1, "b": "two"}, {"a": 1, "b": "two"}, True),
        ({"x-match": "all", "a": 1, "b": "two"}, {"a": 1, "b": "two", "c": 3}, True),
        ({"x-match": "all", "a": 1, "b": "two"}, {"a": 1}, False),
        ({"x-match": "all", "a": 1, "b": "two"}, {"a": 2, "b": "two"}, False),
        ({"x-match": "all", "a": 1, "b": "two"}, {}, False),
        # no x-match means all
        ({"a": 1, "b": "two"}, {"a": 1, "b": "two"}, True),
        ({"a": 1, "b": "two"}, {"b": "two"}, False),
        # any: one matching argument is enough
        ({"x-match": "any", "a": 1, "b": "two"}, {"a": 1}, True),
        ({"x-match": "any", "a": 1, "b": "two"}, {"b": "two", "c": 0}, True),
        ({"x-match": "any", "a": 1, "b": "two"}, {"a": 2, "b": "three"}, False),
        ({"x-match": "any", "a": 1, "b": "two"}, {}, False),
        # x- arguments are ignored by all / any
        ({"x-match": "all", "a": 1, "x-tenant": "t1"}, {"a": 1}, True),
        ({"x-match": "all", "a": 1, "x-tenant": "t1"}, {"a": 1, "x-tenant": "t2"}, True),
        ({"x-match": "any", "x-tenant": "t1"}, {"x-tenant": "t1"}, False),
        ({"x-match": "all", "x-tenant": "t1"}, {}, True),
        # ... and compared by all-with-x / any-with-x
        ({"x-match": "all-with-x", "a": 1, "x-tenant": "t1"}, {"a": 1}, False),
        ({"x-match": "all-with-x", "a": 1, "x-tenant": "t1"}, {"a": 1, "x-tenant": "t1"}, True),
        ({"x-match": "all-with-x", "a": 1, "x-tenant": "t1"}, {"a": 1, "x-tenant": "t2"}, False),
        ({"x-match": "any-with-x", "x-tenant": "t1"}, {"x-tenant": "t1"}, True),
        ({"x-match": "any-with-x", "x-tenant": "t1"}, {"x-tenant": "t2"}, False),
        ({"x-match": "any-with-x", "a": 1, "x-tenant": "t1"}, {"a": 1}, True),
        # a void argument asks only that the header be present
        ({"a": None}, {"a": "anything"}, True),
        ({"a": None}, {"a": 0}, True),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"b": 1}, False),
        ({"a": None}, {}, False),
        ({"x-match": "any", "a": None, "b": 1}, {"a": 5}, True),
        ({"x-match": "any", "a": None, "b": 1}, {"c": 5}, False),
        ({"a": 1}, {"a": None}, False),
        # values compare with their types
        ({"a": True}, {"a": True}, True),
        ({"a": True}, {"a": 1}, False),
        ({"a": 1}, {"a": True}, False),
        ({"a": 1}, {"a": 1.0}, False),
        ({"a": 1}, {"a": "1"}, False),
        ({"a": 0}, {"a": False}, False),
        ({"a": {"k": [1, "v"]}}, {"a": {"k": [1, "v"]}}, True),
        ({"a": {"k": [1, "v"]}}, {"a": {"k": [1, "w"]}}, False),
        # no arguments: all matches everything, any matches nothing
        ({}, {}, True),
        ({}, {"z": 1}, True),
        ({"x-match": "all"}, {"z": 1}, True),
        ({"x-match": "any"}, {"z": 1}, False),
        ({"x-match": "any"}, {}, False),
    ],
)
def test_headers_exchange_matches_like_rabbitmq(vhost, arguments, headers, matches):
    headers_queue(vhost, arguments)
    assert publish(vhost, "hx", "", headers) == ({"q"} if matches else set())


def test_headers_exchange_ignores_the_routing_key(vhost):
    bound_queue(vhost, "hx", "headers", "some-key", {"a": 1})
    assert publish(vhost, "hx", "another-key", {"a": 1}) == {"q"}


def test_headers_exchange_without_headers_property_matches_only_match_all_bindings(vhost):
    headers_queue(vhost, {"x-match": "any", "a": 1})
    vhost.declare_queue("catch-all")
    vhost.bind("catch-all", "hx", "", {})
    assert publish(vhost, "hx", "") == {"catch-all"}


def test_headers_exchange_stops_routing_after_unbind(vhost):
    headers_queue(vhost, {"x-match": "any", "a": 1})
    vhost.unbind("q", "hx", "", {"x-match": "any", "a": 1})
    assert publish(vhost, "hx", "", {"a": 1}) == set()


@pytest.mark.parametrize("mode", ["one", "ALL", "", "all-with-y"])
def test_headers_binding_with_invalid_x_match_is_refused(vhost, mode):
    vhost.declare_exchange("hx", "headers")
    vhost.declare_queue("q")
    with pytest.raises(PreconditionFailed) as caught:
        vhost.bind("q", "hx", "", {"x-match": mode, "a": 1})
    assert caught.value.reply_code == 406
    shown = f'"{mode}"' if mode else ""
    assert caught.value.text.startswith(f"Invalid x-match field value <<{shown}>>")
    assert publish(vhost, "hx", "", {"a": 1}) == set()


# -- the default exchange


def test_default_exchange_routes_to_the_queue_named_by_the_key(vhost):
    vhost.declare_queue("orders")
    vhost.declare_queue("invoices")
    assert publish(vhost, "", "orders") == {"orders"}
    assert publish(vhost, "", "invoices") == {"invoices"}
    assert publish(vhost, "", "missing") == set()
    assert publish(vhost, "", "") == set()


def test_default_exchange_forgets_a_deleted_queue(vhost):
    vhost.declare_queue("orders")
    vhost.delete_queue("orders")
    assert publish(vhost, "", "orders") == set()


@pytest.mark.parametrize("operation", ["bind", "unbind"])
def test_default_exchange_cannot_be_bound_or_unbound(vhost, operation):
    vhost.declare_queue("q")
    with pytest.raises(AccessRefused) as caught:
        getattr(vhost, operation)("q", "", "q")
    assert caught.value.reply_code == 403
    assert "default exchange" in caught.value.text


# -- predeclared exchanges


@pytest.mark.parametrize(
    "exchange, type_name", [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                            ("amq.headers", "headers"), ("amq.match", "headers")]
)
def test_predeclared_exchange_exists_durable_with_its_type(vhost, exchange, type_name):
    declared = vhost.declare_exchange(exchange, type_name, passive=True)
    assert declared.type_name == type_name
    assert declared.durable
    # redeclaring with the same attributes is allowed
    assert vhost.declare_exchange(exchange, type_name, durable=True) is declared


@pytest.mark.parametrize(
    "exchange, binding_key, arguments, routing_key, headers, matches",
    [
        ("amq.direct", "k", None, "k", None, True),
        ("amq.direct", "k", None, "k2", None, False),
        ("amq.fanout", "", None, "whatever", None, True),
        ("amq.topic", "logs.*.error", None, "logs.db.error", None, True),
        ("amq.topic", "logs.*.error", None, "logs.db.info", None, False),
        ("amq.topic", "logs.#", None, "logs", None, True),
        ("amq.headers", "", {"x-match": "any", "a": 1}, "", {"a": 1}, True),
        ("amq.headers", "", {"x-match": "all", "a": 1, "b": 2}, "", {"a": 1}, False),
        ("amq.match", "", {"a": None}, "", {"a": "x"}, True),
    ],
)
def test_predeclared_exchanges_route(vhost, exchange, binding_key, arguments, routing_key, headers, matches):
    bound_queue(vhost, exchange, None, binding_key, arguments)
    assert publish(vhost, exchange, routing_key, headers) == ({"q"} if matches else set())
