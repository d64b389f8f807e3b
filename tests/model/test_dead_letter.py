"""Dead-lettering: x-dead-letter-exchange / -routing-key and the x-death header as RabbitMQ writes it."""

import datetime

import pytest

from brokerd.proto.tables import dict_to_table, table_to_dict
from tests.support.broker import make_broker, open_channel, properties, ready


def at(seconds):
    """The x-death time of a death C{seconds} after the fake clock's start (the epoch); AMQP
    timestamps are whole seconds."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def setup(channel, dlx_type="fanout", dead_key="", **arguments):
    """Queue "q" dead-lettering to exchange "dlx", bound to queue "dead" with C{dead_key}."""
    channel.exchange_declare("dlx", dlx_type)
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx", dead_key)
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "dlx", **arguments})


def get(channel, queue):
    """The next message of C{queue} (taken without ack), or None."""
    result = channel.basic_get(queue, no_ack=True)
    return None if result is None else result[2]


def send(channel, body=b"m", queue="q", exchange="", headers=None, **fields):
    props = properties(**fields)
    if headers is not None:
        dict_to_table(headers, props.headers)
    channel.basic_publish(exchange, queue, props, body)


def death_headers(message):
    return {name: value for name, value in message.headers.items() if name.startswith("x-")}


# -- why a message dies


@pytest.mark.parametrize("settle", ["reject", "nack"])
def test_reject_or_nack_without_requeue_dead_letters_with_reason_rejected(broker, clock, settle):
    channel, _ = open_channel(broker)
    setup(channel)
    clock.advance(7)
    send(channel, b"refused")
    tag = channel.basic_get("q")[0]
    if settle == "reject":
        channel.basic_reject(tag, requeue=False)
    else:
        channel.basic_nack(tag, requeue=False)
    assert ready(broker, "q") == 0
    dead = get(channel, "dead")
    assert dead.body == b"refused"
    assert dead.exchange == "dlx" and dead.routing_key == "q"
    assert death_headers(dead) == {
        "x-death": [{"count": 1, "reason": "rejected", "queue": "q", "time": at(7), "exchange": "",
                     "routing-keys": ["q"]}],
        "x-first-death-queue": "q", "x-first-death-reason": "rejected", "x-first-death-exchange": "",
        "x-last-death-queue": "q", "x-last-death-reason": "rejected", "x-last-death-exchange": "",
    }


def test_nack_multiple_without_requeue_dead_letters_each_in_order(broker):
    channel, _ = open_channel(broker)
    setup(channel)
    for body in (b"1", b"2", b"3"):
        send(channel, body)
    tags = [channel.basic_get("q")[0] for _ in range(3)]
    channel.basic_nack(tags[-1], multiple=True, requeue=False)
    assert [get(channel, "dead").body for _ in range(3)] == [b"1", b"2", b"3"]


def test_a_consumers_reject_dead_letters_too(broker, clock):
    channel, peer = open_channel(broker)
    setup(channel)
    channel.basic_consume("q")
    clock.advance(0)
    send(channel, b"m")
    channel.basic_reject(peer.deliveries[0][1], requeue=False)
    assert get(channel, "dead").headers["x-death"][0]["reason"] == "rejected"


def test_expiry_dead_letters_with_reason_expired_and_original_expiration(broker, clock):
    channel, _ = open_channel(broker)
    setup(channel)
    channel.queue_bind("q", "amq.direct", "key")
    send(channel, b"m", queue="key", exchange="amq.direct", expiration="1500")
    clock.advance(1.5)
    dead = get(channel, "dead")
    assert dead.body == b"m"
    assert not dead.properties.HasField("expiration"), "the dead-lettered copy still has an expiration"
    assert dead.headers["x-death"] == [{
        "count": 1, "reason": "expired", "queue": "q", "time": at(1), "exchange": "amq.direct",
        "routing-keys": ["key"], "original-expiration": "1500",
    }]
    assert dead.headers["x-first-death-exchange"] == "amq.direct"
    clock.advance(60)
    assert ready(broker, "dead") == 0  # taken above; nothing dies twice


def test_expiry_by_queue_ttl_has_no_original_expiration(broker, clock):
    channel, _ = open_channel(broker)
    setup(channel, **{"x-message-ttl": 2000})
    send(channel)
    clock.advance(2)
    death = get(channel, "dead").headers["x-death"][0]
    assert (death["reason"], death["time"]) == ("expired", at(2))
    assert "original-expiration" not in death


def test_overflow_dead_letters_the_dropped_head_with_reason_maxlen(broker):
    channel, _ = open_channel(broker)
    setup(channel, **{"x-max-length": 1})
    send(channel, b"old")
    send(channel, b"new")
    dead = get(channel, "dead")
    assert dead.body == b"old"
    assert dead.headers["x-death"][0]["reason"] == "maxlen"
    assert get(channel, "q").body == b"new"


def test_delivery_limit_dead_letters_with_reason_delivery_limit(broker):
    channel, _ = open_channel(broker)
    setup(channel, **{"x-delivery-limit": 0})
    send(channel)
    channel.basic_nack(channel.basic_get("q")[0], requeue=True)
    assert ready(broker, "q") == 0
    assert get(channel, "dead").headers["x-death"][0]["reason"] == "delivery_limit"


# -- where it goes


def test_the_dead_letter_routing_key_replaces_the_messages_key(broker):
    channel, _ = open_channel(broker)
    setup(channel, dlx_type="direct", dead_key="dead-key", **{"x-dead-letter-routing-key": "dead-key"})
    send(channel)
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    dead = get(channel, "dead")
    assert dead.routing_key == "dead-key"
    assert dead.headers["x-death"][0]["routing-keys"] == ["q"]  # the key it was published with


def test_without_a_dead_letter_routing_key_the_original_key_is_used(broker):
    channel, _ = open_channel(broker)
    setup(channel, dlx_type="direct", dead_key="orders.new")
    channel.queue_declare("other")
    channel.queue_bind("other", "dlx", "q")
    channel.queue_bind("q", "amq.direct", "orders.new")
    send(channel, queue="orders.new", exchange="amq.direct")
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    assert (ready(broker, "dead"), ready(broker, "other")) == (1, 0)


def test_a_missing_dead_letter_exchange_drops_the_message(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "no-such", "x-message-ttl": 1000})
    send(channel, b"rejected")
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    send(channel, b"expires")
    clock.advance(1)
    assert ready(broker, "q") == 0
    assert channel.unacked_count == 0


def test_without_a_dead_letter_exchange_a_rejected_message_is_gone(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    send(channel)
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    assert ready(broker, "q") == 0


@pytest.mark.parametrize("reason", ["rejected", "expired"])
def test_an_internal_dead_letter_exchange_receives_dead_letters(broker, clock, reason):
    # As in RabbitMQ: only clients may not publish to an internal exchange; the broker dead-letters to it.
    channel, _ = open_channel(broker)
    channel.exchange_declare("dlx", "fanout", internal=True)
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx")
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 1000})
    send(channel, b"1")
    send(channel, b"2")
    if reason == "rejected":
        channel.basic_reject(channel.basic_get("q")[0], requeue=False)
        channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    else:
        clock.advance(1)
    assert ready(broker, "q") == 0
    assert [get(channel, "dead").headers["x-death"][0]["reason"] for _ in range(2)] == [reason, reason]


def test_users_headers_and_properties_survive_dead_lettering(broker):
    channel, _ = open_channel(broker)
    setup(channel)
    headers = {"tenant": "acme", "attempt": 3, "flags": [1, "two"], "nested": {"k": True}}
    send(channel, b"body", headers=headers, content_type="text/plain", message_id="id-1", priority=4)
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    dead = get(channel, "dead")
    assert {name: dead.headers[name] for name in headers} == headers
    props = dead.properties
    assert (props.content_type, props.message_id, props.priority) == ("text/plain", "id-1", 4)
    assert table_to_dict(props.headers)["tenant"] == "acme"


def test_a_persistent_dead_letter_replaces_the_original_in_the_store(broker):
    channel, _ = open_channel(broker)
    channel.exchange_declare("dlx", "fanout", durable=True)
    channel.queue_declare("dead", durable=True)
    channel.queue_bind("dead", "dlx")
    channel.queue_declare("q", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    channel.basic_publish("", "q", properties(persistent=True), b"keep-me")
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    assert broker.store.stats()["messages"] == 1
    recovered, _ = make_broker(broker.store)
    recovered.recover()
    queues = recovered.vhost("/").queues
    assert (queues["q"].message_count, queues["dead"].message_count) == (0, 1)
    survivor, _ = open_channel(recovered)
    assert get(survivor, "dead").headers["x-death"][0]["reason"] == "rejected"


# -- dying again


def retry_loop(channel, **arguments):
    """Queue "q" dead-lettering to fanout "retry", which routes back to "q"."""
    channel.exchange_declare("retry", "fanout")
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "retry", **arguments})
    channel.queue_bind("q", "retry")


def test_dying_again_in_the_same_queue_for_the_same_reason_counts_up(broker, clock):
    channel, _ = open_channel(broker)
    retry_loop(channel)
    send(channel, b"m")
    for count in (1, 2, 3):
        clock.advance(1)
        channel.basic_reject(channel.basic_get("q")[0], requeue=False)
        assert ready(broker, "q") == 1, "a rejection cycle must keep going"
        message = get(channel, "q") if count == 3 else None
    # As RabbitMQ: the entry only counts up; its time, exchange and routing keys stay those of the first death.
    assert message.headers["x-death"] == [
        {"count": 3, "reason": "rejected", "queue": "q", "time": at(1), "exchange": "", "routing-keys": ["q"]}
    ]
    assert message.headers["x-first-death-exchange"] == ""
    assert message.headers["x-last-death-exchange"] == "retry"


def test_deaths_are_listed_most_recent_first_and_the_first_death_is_kept(broker, clock):
    channel, _ = open_channel(broker)
    channel.exchange_declare("to-b", "fanout")
    channel.exchange_declare("to-c", "fanout")
    channel.queue_declare("a", arguments={"x-dead-letter-exchange": "to-b", "x-message-ttl": 1000})
    channel.queue_declare("b", arguments={"x-dead-letter-exchange": "to-c"})
    channel.queue_declare("c")
    channel.queue_bind("b", "to-b")
    channel.queue_bind("c", "to-c")
    send(channel, queue="a", headers={"mine": "kept"}, expiration="500")
    clock.advance(0.5)
    channel.basic_reject(channel.basic_get("b")[0], requeue=False)
    message = get(channel, "c")
    assert message.headers == {
        "mine": "kept",
        "x-death": [
            {"count": 1, "reason": "rejected", "queue": "b", "time": at(0), "exchange": "to-b",
             "routing-keys": ["a"]},
            {"count": 1, "reason": "expired", "queue": "a", "time": at(0), "exchange": "",
             "routing-keys": ["a"], "original-expiration": "500"},
        ],
        "x-first-death-queue": "a", "x-first-death-reason": "expired", "x-first-death-exchange": "",
        "x-last-death-queue": "b", "x-last-death-reason": "rejected", "x-last-death-exchange": "to-b",
    }


def test_an_expiry_cycle_keeps_the_dead_letter_out_of_the_queue_it_died_in(broker, clock):
    # As RabbitMQ: the dead letter's route is checked queue by queue; the queue it just
    # died in (with no rejection since) is left out, the other queues still get it.
    channel, _ = open_channel(broker)
    retry_loop(channel, **{"x-message-ttl": 1000})
    channel.queue_declare("spy")
    channel.queue_bind("spy", "retry")
    send(channel, b"m")
    clock.advance(1)
    assert ready(broker, "q") == 0
    assert ready(broker, "spy") == 1
    clock.advance(60)
    assert ready(broker, "spy") == 1
    assert get(channel, "spy").headers["x-death"][0]["count"] == 1


def test_an_expiry_cycle_through_two_queues_ends(broker, clock):
    channel, _ = open_channel(broker)
    for name, other in (("a", "b"), ("b", "a")):
        channel.exchange_declare(f"to-{other}", "fanout")
        channel.queue_declare(name, arguments={"x-dead-letter-exchange": f"to-{other}", "x-message-ttl": 1000})
    channel.queue_bind("a", "to-a")
    channel.queue_bind("b", "to-b")
    send(channel, queue="a")
    clock.advance(1)
    assert (ready(broker, "a"), ready(broker, "b")) == (0, 1)
    clock.advance(1)
    assert (ready(broker, "a"), ready(broker, "b")) == (0, 0), "back into a, where it died before: dropped"
    clock.advance(60)
    assert (ready(broker, "a"), ready(broker, "b")) == (0, 0)


def test_a_cycle_with_a_rejection_on_the_way_keeps_going(broker, clock):
    channel, _ = open_channel(broker)
    channel.exchange_declare("to-b", "fanout")
    channel.exchange_declare("to-a", "fanout")
    channel.queue_declare("a", arguments={"x-dead-letter-exchange": "to-b", "x-message-ttl": 1000})
    channel.queue_declare("b", arguments={"x-dead-letter-exchange": "to-a"})
    channel.queue_bind("b", "to-b")
    channel.queue_bind("a", "to-a")
    send(channel, queue="a")
    for _round in range(3):
        clock.advance(1)
        channel.basic_reject(channel.basic_get("b")[0], requeue=False)
        assert ready(broker, "a") == 1
    deaths = get(channel, "a").headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [("b", "rejected", 3), ("a", "expired", 3)]


def test_an_overflow_cycle_ends(broker):
    channel, _ = open_channel(broker)
    retry_loop(channel, **{"x-max-length": 1})
    send(channel, b"1")
    send(channel, b"2")
    assert ready(broker, "q") == 1


@pytest.mark.parametrize("count, counted", [("abc", 1), (-5, 1), (2.5, 1), (2**63 - 1, 2**63 - 1)])
def test_an_x_death_count_a_publisher_wrote_badly_still_dead_letters(broker, count, counted):
    channel, _ = open_channel(broker)
    setup(channel)
    send(channel, b"forged", headers={"x-death": [{"queue": "q", "reason": "rejected", "count": count}]})
    channel.basic_reject(channel.basic_get("q")[0], requeue=False)
    dead = get(channel, "dead")
    assert dead.body == b"forged"
    assert dead.headers["x-death"][0]["count"] == counted
