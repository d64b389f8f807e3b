"""pika's BlockingConnection against a real broker: the queue lifecycle a
RabbitMQ user sets up with x- arguments. Priority queues, message TTLs,
dead-lettering (rejected, expired, maxlen, delivery_limit) with the x-death
header as pika decodes it, x-overflow reject-publish nacks, x-delivery-count
on redelivery, alternate exchanges, and 406 for arguments out of range.

TTLs are a few hundred milliseconds at most; waiting is polling with a
deadline, never a fixed sleep."""

import datetime
import time

import pika
import pytest
from pika.exceptions import NackError, UnroutableError

from tests.support.pika_clients import closed_by_broker, collector, get_bodies, message_count, pump, settle

pytestmark = pytest.mark.usefixtures("watchdog")

WAIT = 5.0  # seconds a poll waits for what must happen


def poll(connection, check, what, timeout=WAIT):
    """Calls C{check()} (which may talk to the broker) until it returns something true; returns that."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        connection.process_data_events(time_limit=0.02)


def wait_for_count(connection, channel, queue, count):
    poll(connection, lambda: message_count(channel, queue) == count, f"{queue} to hold {count} messages")


def get_one(connection, channel, queue):
    """basic.get (auto-ack) until a message comes or the deadline passes: (method, properties, body)."""

    def check():
        got = channel.basic_get(queue, auto_ack=True)
        return got if got[0] is not None else None

    return poll(connection, check, f"a message in {queue}")


def dead_letter_queues(channel, name, arguments=None):
    """A source queue dead-lettering through a fanout exchange into a queue of its own: (source, dlx, dead)."""
    dlx, dead, source = name("dlx"), name("dead"), name("source")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx, **(arguments or {})})
    return source, dlx, dead


def assert_death(properties, reason, queue, exchange="", routing_keys=None, count=1):
    """The dead-lettered message's x-death (most recent first) and x-first/last-death headers."""
    headers = properties.headers
    deaths = headers["x-death"]
    assert isinstance(deaths, list) and deaths, headers
    first = deaths[0]
    assert isinstance(first, dict), deaths
    assert (first["reason"], first["queue"], first["count"], first["exchange"], first["routing-keys"]) == (
        reason,
        queue,
        count,
        exchange,
        routing_keys if routing_keys is not None else [queue],
    )
    assert isinstance(first["time"], datetime.datetime), first["time"]
    age = datetime.datetime.now(datetime.timezone.utc) - first["time"]
    assert datetime.timedelta(seconds=-2) < age < datetime.timedelta(seconds=60), first["time"]
    assert (headers["x-first-death-reason"], headers["x-first-death-queue"]) == (reason, queue)
    assert (headers["x-last-death-reason"], headers["x-last-death-queue"]) == (reason, queue)
    return first


# -- priority queues


def test_priority_queue_delivers_highest_first_and_fifo_within_a_priority(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, arguments={"x-max-priority": 10})
    for index, priority in enumerate([1, 5, 9, 5, 1]):
        channel.basic_publish("", queue, b"p%d-%d" % (priority, index), pika.BasicProperties(priority=priority))
    channel.basic_publish("", queue, b"none")  # no priority counts as 0
    channel.basic_publish("", queue, b"p200", pika.BasicProperties(priority=200))  # above the max counts as 10
    assert message_count(channel, queue) == 7

    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: len(received) >= 7, "7 deliveries")
    assert [body for _, _, body in received] == [b"p200", b"p9-2", b"p5-1", b"p5-3", b"p1-0", b"p1-4", b"none"]
    assert [properties.priority for _, properties, _ in received] == [200, 9, 5, 5, 1, 1, None]


# -- message TTL


def test_queue_message_ttl_empties_the_queue_without_a_consumer(connection, channel, name):
    queue = name()
    channel.queue_declare(queue, arguments={"x-message-ttl": 200})
    published = time.monotonic()
    channel.basic_publish("", queue, b"plain")
    channel.basic_publish("", queue, b"own ttl longer", pika.BasicProperties(expiration="60000"))  # the queue's wins
    wait_for_count(connection, channel, queue, 0)
    assert time.monotonic() - published >= 0.19, "expired before the queue's TTL"
    assert channel.basic_get(queue) == (None, None, None)


def test_expired_message_behind_a_longer_lived_head_leaves_the_count_on_time(connection, channel, name):
    """brokerd takes a message out at its expiry even when it is not at the head, so
    the count drops then; RabbitMQ drops it only once it reaches the head, but
    never delivers it either way."""
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"head", pika.BasicProperties(expiration="60000"))
    channel.basic_publish("", queue, b"short", pika.BasicProperties(expiration="100"))
    channel.basic_publish("", queue, b"tail")
    wait_for_count(connection, channel, queue, 2)
    assert get_bodies(channel, queue) == [b"head", b"tail"]


def test_expired_message_is_not_delivered_to_a_waiting_consumer(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"held")
    channel.basic_publish("", queue, b"short", pika.BasicProperties(expiration="150"))
    channel.basic_publish("", queue, b"after")
    channel.basic_qos(prefetch_count=1)
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: received, "the first delivery")
    wait_for_count(connection, channel, queue, 1)  # "short" expired while the consumer had no room
    channel.basic_ack(received[0][0].delivery_tag)
    pump(connection, lambda: len(received) >= 2, "the next delivery")
    settle(connection)
    assert [body for _, _, body in received] == [b"held", b"after"]


# -- dead-lettering


def test_rejected_message_is_dead_lettered_with_x_death(connection, channel, name):
    source, dlx, dead = dead_letter_queues(channel, name)
    channel.queue_bind(source, "amq.direct", "orders")
    properties = pika.BasicProperties(message_id="m-1", headers={"app": "kept"})
    channel.basic_publish("amq.direct", "orders", b"bad order", properties)
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)

    method, properties, body = get_one(connection, channel, dead)
    assert (body, method.exchange, method.routing_key) == (b"bad order", dlx, "orders")
    assert (properties.message_id, properties.headers["app"]) == ("m-1", "kept")
    assert_death(properties, "rejected", source, exchange="amq.direct", routing_keys=["orders"])
    assert properties.headers["x-first-death-exchange"] == "amq.direct"
    assert message_count(channel, source) == 0


def test_second_death_for_the_same_reason_in_the_same_queue_counts_up_the_first_entry(connection, channel, name):
    """The source queue is bound to its own dead-letter exchange, so a rejected message
    comes back to it, now published by the DLX. Rejected again, RabbitMQ does not add
    an entry: it counts up the (queue, reason) one, which keeps the exchange,
    routing keys and time of the first death; x-last-death-exchange is the DLX."""
    source, dlx, dead = dead_letter_queues(channel, name)
    channel.queue_bind(source, dlx)
    channel.basic_publish("", source, b"twice")
    for round_ in (1, 2):
        method = poll(connection, lambda: channel.basic_get(source)[0], f"delivery {round_} from {source}")
        channel.basic_reject(method.delivery_tag, requeue=False)
    _, first_copy, _ = get_one(connection, channel, dead)
    _, second_copy, body = get_one(connection, channel, dead)
    assert body == b"twice"
    assert len(first_copy.headers["x-death"]) == 1
    assert len(second_copy.headers["x-death"]) == 1, second_copy.headers["x-death"]
    death = assert_death(second_copy, "rejected", source, exchange="", count=2)
    assert death["time"] == first_copy.headers["x-death"][0]["time"]
    assert (second_copy.headers["x-first-death-exchange"], second_copy.headers["x-last-death-exchange"]) == ("", dlx)


def test_deaths_in_two_queues_are_listed_most_recent_first(connection, channel, name):
    """The retry pattern: expired in a waiting queue, then rejected in the work queue."""
    waiting, work, final = name("waiting"), name("work"), name("final")
    retry_dlx, final_dlx = name("retry-dlx"), name("final-dlx")
    for exchange in (retry_dlx, final_dlx):
        channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(waiting, arguments={"x-message-ttl": 100, "x-dead-letter-exchange": retry_dlx})
    channel.queue_declare(work, arguments={"x-dead-letter-exchange": final_dlx})
    channel.queue_declare(final)
    channel.queue_bind(work, retry_dlx)
    channel.queue_bind(final, final_dlx)
    channel.basic_publish("", waiting, b"retry me")
    method = poll(connection, lambda: channel.basic_get(work)[0], f"the expired message in {work}")
    channel.basic_reject(method.delivery_tag, requeue=False)

    _, properties, _ = get_one(connection, channel, final)
    headers = properties.headers
    deaths = [(death["reason"], death["queue"], death["exchange"], death["count"]) for death in headers["x-death"]]
    assert deaths == [("rejected", work, retry_dlx, 1), ("expired", waiting, "", 1)]
    assert (headers["x-first-death-reason"], headers["x-first-death-queue"]) == ("expired", waiting)
    assert (headers["x-last-death-reason"], headers["x-last-death-queue"]) == ("rejected", work)


def test_expired_message_is_dead_lettered_with_its_original_expiration(connection, channel, name):
    source, _, dead = dead_letter_queues(channel, name)
    channel.basic_publish("", source, b"too late", pika.BasicProperties(expiration="100"))
    _, properties, body = get_one(connection, channel, dead)
    assert body == b"too late"
    death = assert_death(properties, "expired", source)
    assert death["original-expiration"] == "100"
    assert properties.expiration is None  # the copy does not die again of the same TTL
    assert message_count(channel, source) == 0


def test_queue_ttl_expiry_is_dead_lettered(connection, channel, name):
    source, _, dead = dead_letter_queues(channel, name, {"x-message-ttl": 100})
    channel.basic_publish("", source, b"queue ttl")
    _, properties, body = get_one(connection, channel, dead)
    assert body == b"queue ttl"
    assert "original-expiration" not in assert_death(properties, "expired", source)


def test_drop_head_overflow_dead_letters_the_oldest(connection, channel, name):
    source, _, dead = dead_letter_queues(channel, name, {"x-max-length": 2})
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", source, body)
    _, properties, body = get_one(connection, channel, dead)
    assert body == b"a"
    assert_death(properties, "maxlen", source)
    assert get_bodies(channel, source) == [b"b", b"c"]
    assert get_bodies(channel, dead) == []


def test_delivery_limit_dead_letters_a_message_returned_too_often(connection, channel, name):
    source, _, dead = dead_letter_queues(channel, name, {"x-delivery-limit": 1})
    channel.basic_publish("", source, b"poison")
    for attempt in range(2):
        method, _, body = channel.basic_get(source)
        assert method is not None, f"delivery {attempt + 1} did not come"
        assert body == b"poison"
        channel.basic_nack(method.delivery_tag, requeue=True)

    _, properties, body = get_one(connection, channel, dead)
    assert body == b"poison"
    assert_death(properties, "delivery_limit", source)
    assert message_count(channel, source) == 0


# -- x-overflow reject-publish


def test_reject_publish_nacks_a_publish_to_a_full_queue(channel, name):
    queue = name()
    channel.queue_declare(queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"first")
    with pytest.raises(NackError) as raised:
        channel.basic_publish("", queue, b"second", mandatory=True)
    assert raised.value.messages == []  # routed to a queue that refused it: a nack, no basic.return
    assert message_count(channel, queue) == 1
    assert get_bodies(channel, queue) == [b"first"]
    channel.basic_publish("", queue, b"third")  # room again: acked
    assert get_bodies(channel, queue) == [b"third"]


def test_reject_publish_dlx_nacks_and_dead_letters(connection, channel, name):
    source, _, dead = dead_letter_queues(channel, name, {"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    channel.confirm_delivery()
    channel.basic_publish("", source, b"first")
    with pytest.raises(NackError):
        channel.basic_publish("", source, b"second")
    _, properties, body = get_one(connection, channel, dead)
    assert body == b"second"
    assert_death(properties, "maxlen", source)
    assert get_bodies(channel, source) == [b"first"]


# -- x-delivery-count


def test_requeued_message_comes_back_with_x_delivery_count(channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"again")
    seen = []
    for _ in range(3):
        method, properties, body = channel.basic_get(queue)
        seen.append((body, method.redelivered, properties.headers))
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [
        (b"again", False, None),
        (b"again", True, {"x-delivery-count": 1}),
        (b"again", True, {"x-delivery-count": 2}),
    ]


def test_consumer_redelivery_keeps_headers_and_adds_x_delivery_count(connection, channel, name):
    queue = name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"again", pika.BasicProperties(headers={"app": "value"}))
    received, on_message = collector()
    channel.basic_consume(queue, on_message)
    pump(connection, lambda: received, "the delivery")
    channel.basic_reject(received[0][0].delivery_tag, requeue=True)
    pump(connection, lambda: len(received) >= 2, "the redelivery")
    channel.basic_ack(received[1][0].delivery_tag)
    assert [properties.headers for _, properties, _ in received] == [
        {"app": "value"},
        {"app": "value", "x-delivery-count": 1},
    ]


# -- alternate exchanges


def test_alternate_exchange_takes_what_the_exchange_cannot_route(channel, name):
    ae, main, routed, caught = name("ae"), name("main"), name("routed"), name("caught")
    channel.exchange_declare(ae, "fanout")
    channel.queue_declare(caught)
    channel.queue_bind(caught, ae)
    channel.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    channel.queue_declare(routed)
    channel.queue_bind(routed, main, "known")
    channel.confirm_delivery()

    channel.basic_publish(main, "known", b"bound", mandatory=True)
    channel.basic_publish(main, "unknown", b"unroutable", mandatory=True)  # the AE routes it: no basic.return
    assert get_bodies(channel, routed) == [b"bound"]
    method, _, body = channel.basic_get(caught, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"unroutable", main, "unknown")
    assert channel.basic_get(caught) == (None, None, None)


def test_mandatory_publish_the_alternate_exchange_cannot_route_either_is_returned(channel, name):
    ae, main = name("ae"), name("main")
    channel.exchange_declare(ae, "direct")  # nothing bound
    channel.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    channel.confirm_delivery()
    with pytest.raises(UnroutableError) as raised:
        channel.basic_publish(main, "nowhere", b"lost", mandatory=True)
    [returned] = raised.value.messages
    assert (returned.method.reply_code, returned.method.exchange, returned.method.routing_key) == (312, main, "nowhere")


# -- invalid arguments


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"x-max-priority": 300}, "x-max-priority"),
        ({"x-overflow": "nonsense"}, "x-overflow"),
        ({"x-message-ttl": -1}, "x-message-ttl"),
        ({"x-max-length": "ten"}, "x-max-length"),
        ({"x-dead-letter-routing-key": "dead"}, "x-dead-letter-routing-key"),
    ],
)
def test_invalid_queue_argument_closes_the_channel_with_406(connection, name, arguments, named):
    queue = name()
    error = closed_by_broker(connection.channel().queue_declare, queue, arguments=arguments)
    assert error.reply_code == 406
    assert error.reply_text.startswith("PRECONDITION_FAILED")
    assert named in error.reply_text
    assert connection.is_open

    channel = connection.channel()
    assert closed_by_broker(channel.queue_declare, queue, passive=True).reply_code == 404  # nothing was declared
    channel = connection.channel()
    channel.queue_declare(queue, arguments={"x-max-priority": 5})
    channel.basic_publish("", queue, b"still works")
    assert get_bodies(channel, queue) == [b"still works"]


# -- delayed delivery


def test_delayed_messages_arrive_in_due_order_not_publish_order(connection, channel, name):
    exchange, queue = name("delayed"), name()
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "k")
    channel.confirm_delivery()
    started = time.monotonic()
    for body, delay in ((b"third", 600), (b"first", 200), (b"second", 400), (b"now", None)):
        headers = {"x-delay": delay} if delay is not None else None
        channel.basic_publish(exchange, "k", body, pika.BasicProperties(headers=headers))
    received, on_message = collector()
    channel.basic_consume(queue, on_message, auto_ack=True)
    pump(connection, lambda: len(received) >= 4, "4 deliveries")
    elapsed = time.monotonic() - started
    assert [body for _, _, body in received] == [b"now", b"first", b"second", b"third"]
    assert elapsed >= 0.6, "the last one was due 600 ms after it was published"
    assert received[1][1].headers == {"x-delay": -200}, "x-delay negated, as the delayed-message plugin marks it"
