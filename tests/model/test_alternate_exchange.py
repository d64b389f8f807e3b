"""Alternate exchanges: what no binding of an exchange takes goes to its "alternate-exchange"."""

import pytest

from brokerd.errors import PreconditionFailed
from tests.support.broker import open_channel, properties, ready


def drain(channel, queue):
    bodies = []
    while (result := channel.basic_get(queue, no_ack=True)) is not None:
        bodies.append(result[2].body)
    return bodies


def send(channel, exchange, routing_key, body=b"m", mandatory=False):
    channel.basic_publish(exchange, routing_key, properties(), body, mandatory)


def declare(channel, name, type_name="direct", alternate=None, **options):
    arguments = {} if alternate is None else {"alternate-exchange": alternate}
    channel.exchange_declare(name, type_name, arguments=arguments, **options)


def queue_on(channel, queue, exchange, routing_key=""):
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, routing_key)


def returned(peer):
    return [(code, text, message.body) for code, text, message in peer.returns]


def test_an_unroutable_message_goes_to_the_alternate_exchanges_queues(broker):
    channel, _ = open_channel(broker)
    declare(channel, "main", alternate="ae")
    declare(channel, "ae", "fanout")
    queue_on(channel, "orders", "main", "order")
    queue_on(channel, "unrouted", "ae")
    send(channel, "main", "order", b"routed")
    send(channel, "main", "refund", b"unroutable")
    assert drain(channel, "orders") == [b"routed"]
    assert drain(channel, "unrouted") == [b"unroutable"]


def test_the_alternate_exchange_routes_by_its_own_bindings_with_the_original_key(broker):
    channel, _ = open_channel(broker)
    declare(channel, "main", alternate="ae")
    declare(channel, "ae", "topic")
    queue_on(channel, "eu", "ae", "eu.*")
    queue_on(channel, "us", "ae", "us.*")
    send(channel, "main", "eu.paris")
    _tag, _redelivered, message, _left = channel.basic_get("eu", no_ack=True)
    assert (message.exchange, message.routing_key) == ("main", "eu.paris")
    assert ready(broker, "us") == 0


def test_a_mandatory_message_the_alternate_exchange_routes_is_not_returned(broker, clock):
    channel, peer = open_channel(broker)
    declare(channel, "main", alternate="ae")
    declare(channel, "ae", "fanout")
    queue_on(channel, "unrouted", "ae")
    channel.confirm_select()
    send(channel, "main", "anything", mandatory=True)
    clock.advance(0)
    assert peer.returns == []
    assert peer.confirms == [(1, False, True)]
    assert ready(broker, "unrouted") == 1


def test_a_mandatory_message_neither_routes_is_returned(broker, clock):
    channel, peer = open_channel(broker)
    declare(channel, "main", alternate="ae")
    declare(channel, "ae", "direct")
    queue_on(channel, "other", "ae", "other-key")
    channel.confirm_select()
    send(channel, "main", "nothing", b"lost", mandatory=True)
    clock.advance(0)
    assert returned(peer) == [(312, "NO_ROUTE", b"lost")]
    assert peer.confirms == [(1, False, True)]
    assert ready(broker, "other") == 0


def test_a_message_routed_by_the_exchange_itself_skips_the_alternate(broker):
    channel, _ = open_channel(broker)
    declare(channel, "main", "fanout", alternate="ae")
    declare(channel, "ae", "fanout")
    queue_on(channel, "direct", "main")
    queue_on(channel, "unrouted", "ae")
    send(channel, "main", "any")
    assert (ready(broker, "direct"), ready(broker, "unrouted")) == (1, 0)


def test_a_chain_of_alternate_exchanges_is_followed(broker, clock):
    channel, peer = open_channel(broker)
    declare(channel, "main", alternate="ae1")
    declare(channel, "ae1", "direct", alternate="ae2")
    declare(channel, "ae2", "direct", alternate="ae3")
    declare(channel, "ae3", "fanout")
    queue_on(channel, "at-ae2", "ae2", "k2")
    queue_on(channel, "at-ae3", "ae3")
    send(channel, "main", "k2", b"second", mandatory=True)
    send(channel, "main", "k9", b"third", mandatory=True)
    assert drain(channel, "at-ae2") == [b"second"]
    assert drain(channel, "at-ae3") == [b"third"]
    assert peer.returns == []


def test_the_first_alternate_that_routes_ends_the_chain(broker):
    channel, _ = open_channel(broker)
    declare(channel, "main", alternate="ae1")
    declare(channel, "ae1", "fanout", alternate="ae2")
    declare(channel, "ae2", "fanout")
    queue_on(channel, "at-ae1", "ae1")
    queue_on(channel, "at-ae2", "ae2")
    send(channel, "main", "x")
    assert (ready(broker, "at-ae1"), ready(broker, "at-ae2")) == (1, 0)


def test_a_cycle_of_alternate_exchanges_ends_unroutable(broker, clock):
    channel, peer = open_channel(broker)
    declare(channel, "a", alternate="b")
    declare(channel, "b", alternate="c")
    declare(channel, "c", alternate="a")
    declare(channel, "self", alternate="self")
    send(channel, "a", "k", b"round", mandatory=True)
    send(channel, "self", "k", b"self", mandatory=True)
    assert returned(peer) == [(312, "NO_ROUTE", b"round"), (312, "NO_ROUTE", b"self")]


def test_a_cycle_of_alternates_still_routes_where_a_member_has_a_binding(broker):
    channel, _ = open_channel(broker)
    declare(channel, "a", alternate="b")
    declare(channel, "b", alternate="a")
    queue_on(channel, "on-a", "a", "ka")
    queue_on(channel, "on-b", "b", "kb")
    send(channel, "a", "kb", b"to-b")
    send(channel, "b", "ka", b"to-a")
    assert drain(channel, "on-b") == [b"to-b"]
    assert drain(channel, "on-a") == [b"to-a"]


def test_a_missing_alternate_exchange_leaves_the_message_unroutable(broker, clock):
    channel, peer = open_channel(broker)
    declare(channel, "main", alternate="not-there")
    channel.confirm_select()
    send(channel, "main", "k", b"lost", mandatory=True)
    send(channel, "main", "k", b"quietly-lost")
    clock.advance(0)
    assert returned(peer) == [(312, "NO_ROUTE", b"lost")]
    assert peer.confirms == [(2, True, True)]


def test_a_missing_link_ends_the_chain(broker):
    channel, peer = open_channel(broker)
    declare(channel, "main", alternate="ae1")
    declare(channel, "ae1", alternate="gone")
    send(channel, "main", "k", b"lost", mandatory=True)
    assert returned(peer) == [(312, "NO_ROUTE", b"lost")]


def test_the_alternate_may_be_declared_after_the_exchange_and_deleted_again(broker):
    channel, peer = open_channel(broker)
    declare(channel, "main", alternate="ae")
    send(channel, "main", "k", b"before", mandatory=True)
    declare(channel, "ae", "fanout")
    queue_on(channel, "unrouted", "ae")
    send(channel, "main", "k", b"during", mandatory=True)
    channel.exchange_delete("ae")
    send(channel, "main", "k", b"after", mandatory=True)
    assert drain(channel, "unrouted") == [b"during"]
    assert returned(peer) == [(312, "NO_ROUTE", b"before"), (312, "NO_ROUTE", b"after")]


def test_an_internal_exchange_can_be_the_alternate(broker):
    channel, _ = open_channel(broker)
    declare(channel, "main", alternate="ae")
    declare(channel, "ae", "fanout", internal=True)
    queue_on(channel, "unrouted", "ae")
    send(channel, "main", "k")
    assert ready(broker, "unrouted") == 1


def test_a_full_queue_behind_the_alternate_nacks_the_publish(broker, clock):
    channel, peer = open_channel(broker)
    declare(channel, "main", alternate="ae")
    declare(channel, "ae", "fanout")
    channel.queue_declare("small", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.queue_bind("small", "ae")
    channel.confirm_select()
    send(channel, "main", "k", b"1", mandatory=True)
    send(channel, "main", "k", b"2", mandatory=True)
    clock.advance(0)
    assert peer.confirms == [(1, False, True), (2, False, False)]
    assert peer.returns == []
    assert drain(channel, "small") == [b"1"]


def test_dead_letters_the_dead_letter_exchange_cannot_route_go_to_its_alternate(broker):
    channel, _ = open_channel(broker)
    declare(channel, "dlx", "direct", alternate="dlx-ae")
    declare(channel, "dlx-ae", "fanout")
    queue_on(channel, "dead-catchall", "dlx-ae")
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "dlx"})
    send(channel, "", "q")
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    _tag, _redelivered, message, _left = channel.basic_get("dead-catchall", no_ack=True)
    assert message.headers["x-death"][0]["reason"] == "rejected"


def test_the_default_exchange_has_no_alternate(broker, clock):
    channel, peer = open_channel(broker)
    send(channel, "", "no-such-queue", b"lost", mandatory=True)
    assert returned(peer) == [(312, "NO_ROUTE", b"lost")]


def test_alternate_exchange_is_part_of_the_exchanges_identity_on_redeclare(broker):
    channel, _ = open_channel(broker)
    declare(channel, "main", alternate="ae")
    declare(channel, "main", alternate="ae")
    with pytest.raises(PreconditionFailed) as raised:
        declare(channel, "main", alternate="other")
    assert "alternate-exchange" in raised.value.text
