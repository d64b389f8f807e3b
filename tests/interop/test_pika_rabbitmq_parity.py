"""Smaller RabbitMQ 3.10 behaviours through pika and a real broker: delayed
exchanges reached through exchange-to-exchange bindings, which exchange
arguments a redeclaration compares, the refusal texts of deleting the default
and amq.* exchanges, binding to the default exchange and a bad x-match, and
x-max-priority 0."""

import time
from decimal import Decimal

import pika
import pytest

from tests.support.pika_clients import closed_by_broker, get_bodies, message_count

pytestmark = pytest.mark.usefixtures("watchdog")

DELAYED = {"x-delayed-type": "direct"}


def confirmed_publish(channel, exchange, routing_key, body, headers):
    """Publishes mandatory on a confirming channel; returns whether the broker took it (no basic.return)."""
    try:
        channel.basic_publish(exchange, routing_key, body, pika.BasicProperties(headers=headers), mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    return True


def next_message(connection, channel, queue, timeout=5.0):
    """Polls C{queue} until a message is there (within C{timeout} s); returns (properties, body)."""
    deadline = time.monotonic() + timeout
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return properties, body
        assert time.monotonic() < deadline, f"nothing arrived in {queue} within {timeout} s"
        connection.process_data_events(time_limit=0.02)


# -- 1. a delayed exchange reached through a binding


def test_a_delayed_exchange_reached_through_a_binding_holds_the_message_until_due(connection, name):
    channel = connection.channel()
    channel.confirm_delivery()
    entry, delayed, after = name("entry"), name("delayed"), name("after")
    channel.exchange_declare(entry, "fanout")
    channel.exchange_declare(delayed, "x-delayed-message", arguments=DELAYED)
    channel.exchange_declare(after, "fanout")
    channel.exchange_bind(delayed, entry)
    channel.exchange_bind(after, delayed, "k")
    channel.exchange_bind(entry, after)  # a cycle back: the fired message does not come round to be held again
    at_entry, at_delayed, at_after = (channel.queue_declare(name(label)).method.queue for label in ("e", "d", "a"))
    channel.queue_bind(at_entry, entry)
    channel.queue_bind(at_delayed, delayed, "k")
    channel.queue_bind(at_after, after)

    published = time.monotonic()
    assert confirmed_publish(channel, entry, "k", b"later", {"x-delay": 300})  # acked, not returned
    assert get_bodies(channel, at_entry) == [b"later"]  # the rest of the way routes at once
    assert message_count(channel, at_delayed) == 0 and message_count(channel, at_after) == 0

    properties, body = next_message(connection, channel, at_delayed)
    assert time.monotonic() - published >= 0.3
    assert body == b"later" and properties.headers["x-delay"] == -300  # as the delayed-message plugin marks it
    assert type(properties.headers["x-delay"]) is int  # a signedint, as the plugin writes it
    # Once due it goes from the delayed exchange on through its bindings, round the cycle once.
    assert next_message(connection, channel, at_after)[1] == b"later"
    assert next_message(connection, channel, at_entry)[1] == b"later"
    assert message_count(channel, at_delayed) == 0


def test_a_message_held_by_a_bound_delayed_exchange_alone_is_routed_for_a_mandatory_publisher(connection, name):
    channel = connection.channel()
    channel.confirm_delivery()
    entry, delayed = name("entry"), name("delayed")
    channel.exchange_declare(entry, "direct")
    channel.exchange_declare(delayed, "x-delayed-message", arguments=DELAYED)
    channel.exchange_bind(delayed, entry, "k")
    queue = channel.queue_declare(name("q")).method.queue
    channel.queue_bind(queue, delayed, "k")

    assert confirmed_publish(channel, entry, "k", b"held", {"x-delay": 200})
    assert message_count(channel, queue) == 0
    assert next_message(connection, channel, queue)[1] == b"held"
    assert not confirmed_publish(channel, entry, "other", b"nowhere", {"x-delay": 200})  # still returned


def test_a_fired_message_is_not_held_again_by_the_next_delayed_exchange(connection, name):
    channel = connection.channel()
    first, second = name("first"), name("second")
    channel.exchange_declare(first, "x-delayed-message", arguments=DELAYED)
    channel.exchange_declare(second, "x-delayed-message", arguments=DELAYED)
    channel.exchange_bind(second, first, "k")
    queue = channel.queue_declare(name("q")).method.queue
    channel.queue_bind(queue, second, "k")

    published = time.monotonic()
    channel.basic_publish(first, "k", b"once", pika.BasicProperties(headers={"x-delay": 600}))
    properties, body = next_message(connection, channel, queue)
    assert 0.6 <= time.monotonic() - published < 1.2  # held 600 ms by the first, not again by the second
    assert properties.headers["x-delay"] == -600


def test_x_delay_is_read_as_the_delayed_message_plugin_reads_it(connection, name):
    channel = connection.channel()
    exchange = name("delayed")
    channel.exchange_declare(exchange, "x-delayed-message", arguments=DELAYED)
    queue = channel.queue_declare(name("q")).method.queue
    channel.queue_bind(queue, exchange, "k")
    for body, delay in ((b"digits", "600"), (b"too long", 2**32), (b"not a number", "soon"), (b"zero", 0)):
        channel.basic_publish(exchange, "k", body, pika.BasicProperties(headers={"x-delay": delay}))
    now = []
    while (taken := channel.basic_get(queue, auto_ack=True))[0] is not None:
        now.append((taken[2], taken[1].headers["x-delay"]))
    assert now == [(b"too long", 2**32), (b"not a number", "soon"), (b"zero", 0)]  # routed at once, unchanged
    properties, body = next_message(connection, channel, queue)
    assert (body, properties.headers["x-delay"]) == (b"digits", -600)


def test_a_dead_letter_exchange_that_is_a_delayed_exchange_holds_the_dead_letter(connection, name):
    channel = connection.channel()
    delayed = name("delayed")
    channel.exchange_declare(delayed, "x-delayed-message", arguments=DELAYED)
    target = channel.queue_declare(name("target")).method.queue
    channel.queue_bind(target, delayed, "k")
    dying = channel.queue_declare(name("dying"), arguments={"x-dead-letter-exchange": delayed,
                                                            "x-dead-letter-routing-key": "k"}).method.queue
    channel.basic_publish("", dying, b"dead", pika.BasicProperties(headers={"x-delay": 300}))
    method, _, _ = channel.basic_get(dying)
    channel.basic_reject(method.delivery_tag, requeue=False)
    rejected = time.monotonic()
    assert message_count(channel, target) == 0
    properties, body = next_message(connection, channel, target)
    assert time.monotonic() - rejected >= 0.25
    assert (body, properties.headers["x-delay"]) == (b"dead", -300)
    assert properties.headers["x-death"][0]["reason"] == "rejected"


# -- 2. exchange redeclaration


def test_an_exchange_redeclaration_compares_only_alternate_exchange(connection, name):
    channel = connection.channel()
    exchange, plain = name("x"), name("plain")
    channel.exchange_declare(exchange, "direct", arguments={"alternate-exchange": "ae1", "x-foo": 1})
    channel.exchange_declare(exchange, "direct", arguments={"alternate-exchange": "ae1", "x-foo": 2})
    channel.exchange_declare(exchange, "direct", arguments={"alternate-exchange": "ae1", "x-bar": "z"})
    channel.exchange_declare(plain, "direct")
    channel.exchange_declare(plain, "direct", arguments={"x-dead-letter-exchange": "dlx"})
    where = f"for exchange '{exchange}' in vhost '/'"
    refusals = [
        (exchange, {"alternate-exchange": "ae2", "x-foo": 1}, f"{where}: received 'ae2' but current is 'ae1'"),
        (exchange, {"x-foo": 1}, f"{where}: received none but current is the value 'ae1' of type 'longstr'"),
        (plain, {"alternate-exchange": "ae1"},
         f"for exchange '{plain}' in vhost '/': received the value 'ae1' of type 'longstr' but current is none"),
    ]
    for target, arguments, text in refusals:
        channel = connection.channel()
        error = closed_by_broker(channel.exchange_declare, target, "direct", arguments=arguments)
        assert (error.reply_code, error.reply_text) == (
            406, f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' {text}"), arguments


def test_a_delayed_exchange_redeclared_with_another_delayed_type_keeps_its_own(connection, name):
    channel = connection.channel()
    exchange = name("delayed")
    channel.exchange_declare(exchange, "x-delayed-message", arguments=DELAYED)
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    queue = channel.queue_declare(name("q")).method.queue
    channel.queue_bind(queue, exchange, "k")
    channel.basic_publish(exchange, "other", b"not direct-routed", pika.BasicProperties())
    channel.basic_publish(exchange, "k", b"direct-routed", pika.BasicProperties())
    assert get_bodies(channel, queue) == [b"direct-routed"]


# -- 3. refusal texts


def test_deleting_the_default_or_a_system_exchange_is_refused_with_rabbitmqs_texts(connection):
    refusals = [
        ("", "ACCESS_REFUSED - operation not permitted on the default exchange"),
        ("amq.direct", "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"),
        ("amq.none-such", "ACCESS_REFUSED - deletion of system exchange 'amq.none-such' in vhost '/' not allowed"),
    ]
    for exchange, text in refusals:
        error = closed_by_broker(connection.channel().exchange_delete, exchange)
        assert (error.reply_code, error.reply_text) == (403, text)
    error = closed_by_broker(connection.channel().exchange_declare, "", "direct")
    assert (error.reply_code, error.reply_text) == (403, refusals[0][1])


def test_binding_a_queue_to_the_default_exchange_is_refused_with_rabbitmqs_text(connection, name):
    channel = connection.channel()
    queue = channel.queue_declare(name("q")).method.queue
    error = closed_by_broker(channel.queue_bind, queue, "", "k")
    assert (error.reply_code, error.reply_text) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_a_bad_x_match_is_refused_with_rabbitmqs_text(connection, name):
    channel = connection.channel()
    queue = channel.queue_declare(name("q")).method.queue
    expected = "; expected all, any, all-with-x, or any-with-x"
    refusals = [
        ("bogus", 'Invalid x-match field value <<"bogus">>' + expected),
        ("", "Invalid x-match field value <<>>" + expected),
        ('a"b\\c', 'Invalid x-match field value <<"a\\"b\\\\c">>' + expected),
        (True, "Invalid x-match field type bool (value true); expected longstr"),
        (-1, "Invalid x-match field type signedint (value -1); expected longstr"),
        (Decimal("1.5"), "Invalid x-match field type decimal (value {1,15}); expected longstr"),
        (b"\xff\x01", "Invalid x-match field type binary (value <<255,1>>); expected longstr"),
        ({"a": 1}, 'Invalid x-match field type table (value [{<<"a">>,signedint,1}]); expected longstr'),
        (None, "Invalid x-match field type void (value undefined); expected longstr"),
    ]
    for mode, text in refusals:
        error = closed_by_broker(connection.channel().queue_bind, queue, "amq.headers", "", {"x-match": mode, "a": 1})
        assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - " + text), mode


def test_x_match_with_x_compares_x_headers_too(connection, name):
    channel = connection.channel()
    queues = {mode: channel.queue_declare(name(mode)).method.queue for mode in ("all", "all-with-x", "any-with-x")}
    for mode, queue in queues.items():
        channel.queue_bind(queue, "amq.headers", "", {"x-match": mode, "kind": "job", "x-tenant": "a"})
    for body, headers in ((b"tenant b", {"kind": "job", "x-tenant": "b"}),
                          (b"tenant a", {"kind": "job", "x-tenant": "a"}),
                          (b"other job", {"kind": "mail", "x-tenant": "a"})):
        channel.basic_publish("amq.headers", "", body, pika.BasicProperties(headers=headers))
    assert get_bodies(channel, queues["all"]) == [b"tenant b", b"tenant a"]  # x- arguments are not compared
    assert get_bodies(channel, queues["all-with-x"]) == [b"tenant a"]
    assert get_bodies(channel, queues["any-with-x"]) == [b"tenant b", b"tenant a", b"other job"]


# -- 4. x-max-priority 0


def test_x_max_priority_0_is_a_queue_without_priorities(connection, name):
    channel = connection.channel()
    queue = name("q")
    channel.queue_declare(queue, arguments={"x-max-priority": 0})
    channel.basic_publish("", queue, b"first", pika.BasicProperties(priority=0))
    channel.basic_publish("", queue, b"second", pika.BasicProperties(priority=5))
    assert get_bodies(channel, queue) == [b"first", b"second"]
    error = closed_by_broker(connection.channel().queue_declare, queue)
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue '{queue}' in vhost '/':"
             " received none but current is the value '0' of type 'signedint'")
    refusals = [
        (-1, "{value_negative,-1}"), (256, "{max_value_exceeded,256}"), ("a", '"expected integer, got longstr"'),
    ]
    for value, reason in refusals:
        error = closed_by_broker(connection.channel().queue_declare, name("bad"), arguments={"x-max-priority": value})
        assert error.reply_text.endswith(f"in vhost '/': {reason}"), error.reply_text


def test_an_unknown_exchange_type_closes_the_connection_with_rabbitmqs_text(connect, name):
    # RabbitMQ answers an unknown type with a connection-level 503, as pika's own acceptance test expects.
    connection = connect()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        connection.channel().exchange_declare(name("odd"), "ZZwwInvalid")
    assert (raised.value.reply_code, raised.value.reply_text) == (
        503, "COMMAND_INVALID - unknown exchange type 'ZZwwInvalid'")
