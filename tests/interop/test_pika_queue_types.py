"""pika against a real broker: single active consumer, consumer priorities,
quorum queues (their refusals, delivery limit and x-delivery-count, no global
QoS) and the declare and consume arguments refused rather than ignored, each
with RabbitMQ 3.10's replies."""

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from tests.support.client_broker import pika_connection, start_broker
from tests.support.pika_clients import closed_by_broker, collector, consumer_count, message_count, pump, settle

pytestmark = pytest.mark.usefixtures("watchdog")

SAC = {"x-single-active-consumer": True}
QUORUM = {"x-queue-type": "quorum"}


def consumers_on_own_channels(connection, queue, count, prefetch=2, arguments=()):
    """C{count} consumers of C{queue}, each on its own channel with C{prefetch}; returns (channels, tags, received)
    where C{received[n]} lists the (body, redelivered) consumer n got."""
    channels, tags, received = [], [], []
    for number in range(count):
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        got = []

        def on_message(channel, method, properties, body, got=got):
            got.append((body, method.redelivered))

        extra = dict(arguments[number]) if arguments else {}
        tags.append(channel.basic_consume(queue, on_message, arguments=extra))
        channels.append(channel)
        received.append(got)
    return channels, tags, received


def publish(channel, queue, count, start=0):
    for number in range(start, start + count):
        channel.basic_publish("", queue, b"%d" % number)


# -- single active consumer


def test_single_active_consumer_delivers_to_the_first_consumer_only(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, arguments=SAC)
    _, _, received = consumers_on_own_channels(connection, queue, 3)
    publish(channel, queue, 4)
    pump(connection, lambda: len(received[0]) >= 2, "the active consumer's prefetch window")
    settle(connection)
    assert received == [[(b"0", False), (b"1", False)], [], []]
    assert (message_count(channel, queue), consumer_count(channel, queue)) == (2, 3)


def test_single_active_consumer_fails_over_in_registration_order(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, arguments=SAC)
    channels, tags, received = consumers_on_own_channels(connection, queue, 3)
    publish(channel, queue, 4)
    pump(connection, lambda: len(received[0]) >= 2, "the first consumer's deliveries")

    channels[0].close()  # its unacked messages go back and on to the next consumer, redelivered
    pump(connection, lambda: len(received[1]) >= 2, "the second consumer taking over")
    settle(connection)
    assert received[1] == [(b"0", True), (b"1", True)]
    assert received[2] == []

    channels[1].basic_cancel(tags[1])  # a cancelled consumer keeps what it holds until it settles it
    channels[1].basic_ack(0, multiple=True)  # then the third takes over
    pump(connection, lambda: len(received[2]) >= 2, "the third consumer taking over")
    settle(connection)
    assert received[2] == [(b"2", False), (b"3", False)]
    assert received[1] == [(b"0", True), (b"1", True)]


def test_single_active_consumer_ignores_consumer_priorities_as_rabbitmq_3_10(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, arguments=SAC)
    _, _, received = consumers_on_own_channels(
        connection, queue, 2, prefetch=5, arguments=[{"x-priority": 1}, {"x-priority": 10}]
    )
    publish(channel, queue, 3)
    pump(connection, lambda: len(received[0]) >= 3, "the first registered consumer's deliveries")
    settle(connection)
    assert received[1] == []


def test_exclusive_consumer_on_a_single_active_consumer_queue_is_refused(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, arguments=SAC)
    error = closed_by_broker(channel.basic_consume, queue, lambda *args: None, exclusive=True)
    assert (error.reply_code, error.reply_text) == (
        403, f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use"
    )


def test_single_active_consumer_flag_must_be_a_boolean(channel, name):
    queue = name()
    error = closed_by_broker(channel.queue_declare, queue, arguments={"x-single-active-consumer": "yes"})
    assert (error.reply_code, error.reply_text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue '{queue}' in vhost '/':"
        " {unacceptable_type,longstr}",
    )


# -- consumer priorities


def test_higher_priority_consumers_are_served_first_and_round_robin(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channels, _, received = consumers_on_own_channels(
        connection, queue, 3, prefetch=2, arguments=[{"x-priority": 1}, {"x-priority": 10}, {"x-priority": 10}]
    )
    publish(channel, queue, 6)
    pump(connection, lambda: sum(map(len, received)) >= 6, "six deliveries")
    bodies = [[body for body, _ in got] for got in received]
    assert bodies == [[b"4", b"5"], [b"0", b"2"], [b"1", b"3"]]  # the low one only once both high ones are full

    publish(channel, queue, 1, start=6)  # everyone is full: it waits for room
    settle(connection)
    assert message_count(channel, queue) == 1
    channels[0].basic_ack(1)  # room at the low priority only: it gets it
    pump(connection, lambda: len(received[0]) >= 3, "the low-priority consumer getting the seventh")
    publish(channel, queue, 1, start=7)
    settle(connection)
    assert message_count(channel, queue) == 1
    channels[2].basic_ack(1)  # room at a high priority too: it goes there
    pump(connection, lambda: len(received[2]) >= 3, "the high-priority consumer getting the eighth")
    assert received[2][-1] == (b"7", False)
    assert [body for body, _ in received[0]] == [b"4", b"5", b"6"]


def test_the_server_offers_consumer_priorities(connection):
    assert connection._impl.server_capabilities["consumer_priorities"] is True


@pytest.mark.parametrize(
    ("value", "type_name"), [("high", "longstr"), (True, "bool"), (None, "void")]
)
def test_consumer_priority_must_be_an_integer(channel, name, value, type_name):
    queue = name()
    channel.queue_declare(queue)
    error = closed_by_broker(channel.basic_consume, queue, lambda *args: None, arguments={"x-priority": value})
    assert (error.reply_code, error.reply_text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{queue}' in vhost '/':"
        f' "expected integer, got {type_name}"',
    )


# -- quorum queues


@pytest.mark.parametrize(
    ("options", "refused"),
    [({}, "non-durable"), ({"durable": True, "exclusive": True}, "exclusive-owner"),
     ({"durable": True, "auto_delete": True}, "auto-delete")],
)
def test_quorum_queue_properties_are_refused_as_rabbitmq(channel, name, options, refused):
    queue = name()
    error = closed_by_broker(channel.queue_declare, queue, arguments=QUORUM, **options)
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid property '{refused}' for queue '{queue}' in vhost '/'"
    )


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({**QUORUM, "x-max-priority": 5}, "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type"
         " rabbit_quorum_queue"),
        ({**QUORUM, "x-queue-mode": "lazy"}, "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/' of queue type"
         " rabbit_quorum_queue"),
        ({"x-quorum-initial-group-size": 3}, "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost"
         " '/' of queue type rabbit_classic_queue"),
        ({"x-max-age": "1D"}, "invalid arg 'x-max-age' for queue '{q}' in vhost '/' of queue type"
         " rabbit_classic_queue"),
        ({"x-queue-type": "foo"}, "invalid arg 'x-queue-type' for queue '{q}' in vhost '/':"
         " \"unsupported queue type 'foo'\""),
        ({"x-queue-type": "stream"}, "invalid arg 'x-queue-type' for queue '{q}' in vhost '/':"
         " \"unsupported queue type 'stream'\": brokerd has classic and quorum queues only"),
        ({"x-queue-mode": "fast"}, "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/':"
         " \"unsupported queue mode 'fast'\""),
    ],
    ids=["quorum-priority", "quorum-mode", "classic-group-size", "stream-argument", "unknown-type", "stream",
         "bad-mode"],
)
def test_arguments_brokerd_would_not_honour_are_refused(channel, name, arguments, text):
    queue = name()
    error = closed_by_broker(channel.queue_declare, queue, durable=True, arguments=arguments)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - " + text.format(q=queue))


def test_arguments_rabbitmq_accepts_without_effect_are_accepted(channel, name):
    classic, quorum = name("classic"), name("quorum")
    channel.queue_declare(classic, durable=True, arguments={
        "x-queue-mode": "lazy", "x-queue-master-locator": "client-local", "x-queue-version": 2, "x-custom": 1})
    channel.queue_declare(quorum, durable=True, arguments={
        **QUORUM, "x-quorum-initial-group-size": 3, "x-dead-letter-strategy": "at-least-once",
        "x-queue-leader-locator": "balanced", "x-max-in-memory-length": 10, "x-custom": 1})
    channel.queue_declare(classic, durable=True, arguments={  # classic is the type a queue has without one
        "x-queue-type": "classic", "x-queue-mode": "lazy", "x-queue-master-locator": "client-local",
        "x-queue-version": 2, "x-custom": 1})
    assert channel.queue_declare(quorum, passive=True).method.queue == quorum


@pytest.mark.parametrize(
    ("first", "again", "difference"),
    [
        ({}, QUORUM, "received the value 'quorum' of type 'longstr' but current is none"),
        (QUORUM, {"x-queue-type": "classic"}, "received 'classic' but current is 'quorum'"),
        ({**QUORUM, "x-delivery-limit": 3}, {**QUORUM, "x-delivery-limit": 4}, "received '4' but current is '3'"),
    ],
    ids=["classic-to-quorum", "quorum-to-classic", "delivery-limit"],
)
def test_redeclaring_a_queue_differently_is_refused_as_rabbitmq(channel, name, first, again, difference):
    queue = name()
    channel.queue_declare(queue, durable=True, arguments=first)
    error = closed_by_broker(channel.queue_declare, queue, durable=True, arguments=again)
    key = "x-delivery-limit" if "x-delivery-limit" in again else "x-queue-type"
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{queue}' in vhost '/': {difference}"
    )


def test_redeclaring_a_queue_with_other_arguments_rabbitmq_does_not_know_is_accepted(channel, name):
    queue = name()
    channel.queue_declare(queue, durable=True, arguments={"x-custom": 1, "x-message-ttl": 1000})
    channel.queue_declare(queue, durable=True, arguments={"x-custom": 2, "x-message-ttl": 1000})
    channel.queue_declare(queue, durable=True, arguments={"x-message-ttl": 1000})


def test_quorum_delivery_limit_dead_letters_a_poison_message(connection, channel, name):
    queue, graveyard = name("work"), name("graveyard")
    channel.queue_declare(graveyard, durable=True)
    channel.queue_declare(queue, durable=True, arguments={
        **QUORUM, "x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": graveyard})
    channel.basic_publish("", queue, b"poison", pika.BasicProperties(delivery_mode=2, headers={"app": 1}))
    seen = []
    while True:
        method, properties, body = channel.basic_get(queue)
        if method is None:
            break
        seen.append((body, method.redelivered, properties.headers))
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [(b"poison", False, {"app": 1, "x-delivery-count": 0}),
                    (b"poison", True, {"app": 1, "x-delivery-count": 1}),
                    (b"poison", True, {"app": 1, "x-delivery-count": 2})]
    method, properties, body = channel.basic_get(graveyard, auto_ack=True)
    assert body == b"poison"
    assert properties.headers["x-first-death-reason"] == "delivery_limit"
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"


def test_quorum_delivery_limit_drops_a_poison_message_without_dead_letter_exchange(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, durable=True, arguments={**QUORUM, "x-delivery-limit": 0})
    channel.basic_publish("", queue, b"poison")
    method, properties, _ = channel.basic_get(queue)
    assert properties.headers == {"x-delivery-count": 0}
    channel.basic_reject(method.delivery_tag, requeue=True)
    assert message_count(channel, queue) == 0


def test_consuming_from_a_quorum_queue_with_global_qos_closes_the_connection(connect, name):
    connection = connect()
    channel = connection.channel()
    queue = name()
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    channel.basic_qos(prefetch_count=5, global_qos=True)
    with pytest.raises(ConnectionClosedByBroker) as raised:
        channel.basic_consume(queue, lambda *args: None)
    assert (raised.value.reply_code, raised.value.reply_text) == (
        540, f"NOT_IMPLEMENTED - queue '{queue}' in vhost '/' does not support global qos"
    )


def test_quorum_queue_consumer_with_per_consumer_prefetch(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    publish(channel, queue, 3)
    channel.basic_qos(prefetch_count=2)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: len(received) >= 2, "two deliveries")
    settle(connection)
    assert [(body, properties.headers) for _, properties, body in received] == [
        (b"0", {"x-delivery-count": 0}), (b"1", {"x-delivery-count": 0})]


def test_global_qos_set_later_does_not_hold_back_a_quorum_queue_consumer(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    channel.basic_qos(prefetch_count=2, global_qos=True)  # as RabbitMQ: quorum queues ignore it
    publish(channel, queue, 5)
    pump(connection, lambda: len(received) >= 5, "all five deliveries")


def test_quorum_queue_keeps_transient_messages_across_a_restart(tmp_path):
    """As RabbitMQ's quorum queues: every message is kept, whatever its delivery mode; a classic queue
    keeps only persistent ones."""
    broker = start_broker(tmp_path)
    try:
        with pika_connection(broker) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("quorum", durable=True, arguments=QUORUM)
            channel.queue_declare("classic", durable=True)
            for queue in ("quorum", "classic"):
                channel.basic_publish("", queue, b"transient", pika.BasicProperties(delivery_mode=1))
    finally:
        broker.process.stop()
    broker = start_broker(tmp_path)
    try:
        with pika_connection(broker) as connection:
            channel = connection.channel()
            _, properties, body = channel.basic_get("quorum", auto_ack=True)
            assert (body, properties.delivery_mode) == (b"transient", 1)
            assert message_count(channel, "classic") == 0
    finally:
        broker.process.stop()


# -- consumer arguments brokerd does not implement


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-stream-offset": "first"}, "invalid arg 'x-stream-offset' for queue '{q}' in vhost '/'"
         " of queue type rabbit_classic_queue"),
        ({"x-cancel-on-ha-failover": "yes"}, "invalid arg 'x-cancel-on-ha-failover' for queue '{q}' in vhost '/':"
         " {{unacceptable_type,longstr}}"),
        ({"x-credit": {"credit": 5, "drain": False}}, "invalid arg 'x-credit' for queue '{q}' in vhost '/':"
         " credit flow control is not implemented"),
    ],
    ids=["stream-offset", "bad-failover-flag", "credit"],
)
def test_consumer_arguments_brokerd_would_not_honour_are_refused(channel, name, arguments, text):
    queue = name()
    channel.queue_declare(queue)
    error = closed_by_broker(channel.basic_consume, queue, lambda *args: None, arguments=arguments)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - " + text.format(q=queue))


def test_consumer_arguments_without_effect_here_are_accepted(channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_consume(queue, lambda *args: None, arguments={"x-cancel-on-ha-failover": True, "x-custom": 1})
    assert consumer_count(channel, queue) == 1
