"""aio-pika (asyncio, over aiormq) against a real ``twistd brokerd`` subprocess.

Each test runs one coroutine with ``asyncio.run`` against the module's broker
(the ``amqp_broker`` fixture) and uses its own queue and exchange names.
Every awaited broker event has a timeout, so a hang fails naming the step
instead of stalling the run.
"""

import asyncio
import datetime
import decimal
import os

import aio_pika
import aiormq
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message
from aio_pika import exceptions as aio_exceptions

from tests.interop.conftest import first_difference, logged_errors, unique_names

STEP_TIMEOUT = 10.0  # seconds any one awaited broker event may take
TEST_TIMEOUT = 25.0  # seconds a whole scenario may take
TEN_MIB = 10 * 1024 * 1024
UTC = datetime.timezone.utc

unique = unique_names("aio-pika")


def run(scenario):
    """Run the coroutine function C{scenario} to completion on a new event loop, within TEST_TIMEOUT."""

    async def bounded():
        try:
            return await asyncio.wait_for(scenario(), TEST_TIMEOUT)
        except asyncio.TimeoutError:
            raise AssertionError(f"the scenario did not finish within {TEST_TIMEOUT} s") from None

    return asyncio.run(bounded())


async def step(awaitable, what, seconds=STEP_TIMEOUT):
    """Await C{awaitable}, failing with an AssertionError naming C{what} after C{seconds}."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what}: nothing within {seconds} s") from None


async def connect(broker, robust=False):
    """A connection to C{broker}, plain or robust."""
    opener = aio_pika.connect_robust if robust else aio_pika.connect
    return await step(opener(broker.amqp_url), "connecting (AMQP handshake)")


async def queue_counts(channel, name):
    """(ready messages, consumers) of queue C{name} by a passive declare on C{channel}; also a barrier.

    It goes through the underlying aiormq channel: a robust channel answers a
    passive declare of a queue it knows from its cache, without asking the broker.
    """
    underlay = await step(channel.get_underlay_channel(), "the channel to open")
    declare_ok = await step(underlay.queue_declare(name, passive=True), f"passive queue.declare of {name}")
    return declare_ok.message_count, declare_ok.consumer_count


async def ready_count(channel, name):
    """Ready messages in queue C{name}, by a passive declare on C{channel}; also a barrier."""
    return (await queue_counts(channel, name))[0]


async def drain(queue):
    """The bodies of every message C{queue} holds, taken with basic.get and no ack."""
    bodies = []
    while True:
        message = await step(queue.get(no_ack=True, fail=False), f"basic.get from {queue.name}")
        if message is None:
            return bodies
        bodies.append(message.body)


@pytest.fixture(autouse=True)
def broker_logs_no_errors(amqp_broker):
    """Each test also fails if the broker logged a traceback or an error while it ran."""
    start = len(amqp_broker.process.output)
    yield
    problems = logged_errors(amqp_broker.process, start)
    assert not problems, "the broker logged errors during the test:\n" + "\n".join(amqp_broker.process.output[start:])


def test_robust_connection_declares_binds_publishes_with_confirms_and_consumes(amqp_broker):
    async def scenario():
        connection = await connect(amqp_broker, robust=True)
        async with connection:
            channel = await step(connection.channel(), "channel.open")
            exchange = await step(channel.declare_exchange(unique("orders"), ExchangeType.DIRECT), "exchange.declare")
            queue = await step(channel.declare_queue(unique("orders-eu")), "queue.declare")
            assert queue.declaration_result.message_count == 0
            assert queue.declaration_result.consumer_count == 0
            await step(queue.bind(exchange, routing_key="eu"), "queue.bind")

            for number in range(5):
                confirmation = await step(
                    exchange.publish(Message(b"order %d" % number), routing_key="eu"), f"confirm of publish {number}"
                )
                assert isinstance(confirmation, aiormq.spec.Basic.Ack), confirmation
            assert await ready_count(channel, queue.name) == 5

            bodies = []
            async with queue.iterator(timeout=STEP_TIMEOUT) as messages:
                async for message in messages:
                    async with message.process():
                        assert (message.exchange, message.routing_key) == (exchange.name, "eu")
                        assert not message.redelivered
                        bodies.append(message.body)
                    if len(bodies) == 5:
                        break
            assert bodies == [b"order %d" % number for number in range(5)]
            # process() acked each one and the iterator cancelled its consumer.
            assert await queue_counts(channel, queue.name) == (0, 0)
        assert connection.is_closed

    run(scenario)


def test_each_exchange_type_routes_as_declared(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            exchanges = {}
            for kind in (ExchangeType.DIRECT, ExchangeType.TOPIC, ExchangeType.FANOUT, ExchangeType.HEADERS):
                exchanges[kind] = await step(
                    channel.declare_exchange(unique(kind.value), kind), f"exchange.declare of a {kind.value} exchange"
                )
            queues = {}
            for role in ("direct", "topic-eu", "topic-all", "fanout-a", "fanout-b", "headers-all", "headers-any"):
                queues[role] = await step(channel.declare_queue(unique(role)), f"queue.declare {role}")
            bindings = [
                ("direct", ExchangeType.DIRECT, "red", None),
                ("topic-eu", ExchangeType.TOPIC, "orders.eu.*", None),
                ("topic-all", ExchangeType.TOPIC, "orders.#", None),
                ("fanout-a", ExchangeType.FANOUT, "", None),
                ("fanout-b", ExchangeType.FANOUT, "ignored", None),
                ("headers-all", ExchangeType.HEADERS, "", {"x-match": "all", "format": "pdf", "kind": "report"}),
                ("headers-any", ExchangeType.HEADERS, "", {"x-match": "any", "format": "pdf", "kind": "report"}),
            ]
            for role, kind, key, arguments in bindings:
                await step(queues[role].bind(exchanges[kind], routing_key=key, arguments=arguments), f"bind {role}")

            publications = [
                (ExchangeType.DIRECT, "red", None, b"direct red"),
                (ExchangeType.DIRECT, "blue", None, b"direct blue"),
                (ExchangeType.TOPIC, "orders.eu.de", None, b"topic orders.eu.de"),
                (ExchangeType.TOPIC, "orders.us", None, b"topic orders.us"),
                (ExchangeType.TOPIC, "orders.eu", None, b"topic orders.eu"),
                (ExchangeType.TOPIC, "invoices.eu.de", None, b"topic invoices.eu.de"),
                (ExchangeType.FANOUT, "whatever", None, b"fanout"),
                (ExchangeType.HEADERS, "", {"format": "pdf", "kind": "report"}, b"headers pdf report"),
                (ExchangeType.HEADERS, "", {"format": "pdf", "kind": "log"}, b"headers pdf log"),
                (ExchangeType.HEADERS, "", {"format": "zip"}, b"headers zip"),
            ]
            for kind, key, headers, body in publications:
                confirmation = await step(
                    exchanges[kind].publish(Message(body, headers=headers), routing_key=key, mandatory=False),
                    f"confirm of {body!r}",
                )
                assert isinstance(confirmation, aiormq.spec.Basic.Ack), (body, confirmation)

            received = {role: await drain(queue) for role, queue in queues.items()}
            assert received == {
                "direct": [b"direct red"],
                "topic-eu": [b"topic orders.eu.de"],
                "topic-all": [b"topic orders.eu.de", b"topic orders.us", b"topic orders.eu"],
                "fanout-a": [b"fanout"],
                "fanout-b": [b"fanout"],
                "headers-all": [b"headers pdf report"],
                "headers-any": [b"headers pdf report", b"headers pdf log"],
            }

    run(scenario)


def test_exchange_bind_routes_through_to_the_destination_exchange_until_unbound(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            source = await step(channel.declare_exchange(unique("events"), ExchangeType.TOPIC), "exchange.declare")
            destination = await step(channel.declare_exchange(unique("audit"), ExchangeType.FANOUT),
                                     "exchange.declare")
            queue = await step(channel.declare_queue(unique("audit-log")), "queue.declare")
            await step(queue.bind(destination), "queue.bind")
            await step(destination.bind(source, routing_key="orders.#"), "exchange.bind")

            await step(source.publish(Message(b"order"), routing_key="orders.new"), "confirm of a bound publish")
            await step(source.publish(Message(b"invoice"), routing_key="invoices.new"), "confirm of another")
            await step(destination.unbind(source, routing_key="orders.#"), "exchange.unbind")
            await step(source.publish(Message(b"after unbind"), routing_key="orders.new"), "confirm after unbind")
            assert await drain(queue) == [b"order"]

    run(scenario)


def test_get_reports_message_count_and_empty_queue(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            queue = await step(channel.declare_queue(unique("get")), "queue.declare")
            assert await step(queue.get(fail=False), "basic.get-empty") is None
            with pytest.raises(aio_exceptions.QueueEmpty):
                await step(queue.get(), "basic.get-empty")

            for body in (b"one", b"two", b"three"):
                await step(channel.default_exchange.publish(Message(body), routing_key=queue.name), "publish confirm")
            first = await step(queue.get(), "basic.get-ok")
            assert (first.body, first.message_count, first.redelivered) == (b"one", 2, False)
            assert (first.exchange, first.routing_key) == ("", queue.name)
            await first.ack()
            second = await step(queue.get(no_ack=True), "basic.get-ok with no_ack")
            assert (second.body, second.message_count) == (b"two", 1)
            assert second.delivery_tag > first.delivery_tag
            assert await ready_count(channel, queue.name) == 1

    run(scenario)


def test_reject_and_nack_with_requeue_redeliver_with_redelivered_set(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            queue = await step(channel.declare_queue(unique("requeue")), "queue.declare")
            await step(channel.default_exchange.publish(Message(b"retry me"), routing_key=queue.name), "publish")

            first = await step(queue.get(), "basic.get-ok")
            assert not first.redelivered
            await first.reject(requeue=True)
            second = await step(queue.get(), "basic.get-ok after basic.reject(requeue=True)")
            assert (second.body, second.redelivered) == (b"retry me", True)
            await second.nack(requeue=True)

            async with queue.iterator(timeout=STEP_TIMEOUT) as messages:
                async for third in messages:
                    break
                assert (third.body, third.redelivered) == (b"retry me", True)
                # process(requeue=True) rejects with requeue when its block raises.
                with pytest.raises(RuntimeError):
                    async with third.process(requeue=True):
                        raise RuntimeError("handler failed")
                async for fourth in messages:
                    break
                assert (fourth.body, fourth.redelivered) == (b"retry me", True)
                await fourth.nack(requeue=False)
            assert await ready_count(channel, queue.name) == 0

    run(scenario)


def test_prefetch_window_holds_exactly_qos_count_unacked(amqp_broker):
    window = 2

    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            queue = await step(channel.declare_queue(unique("prefetch")), "queue.declare")
            for number in range(window + 3):
                message = Message(b"job %d" % number)
                await step(channel.default_exchange.publish(message, routing_key=queue.name), "publish")
            qos_ok = await step(channel.set_qos(prefetch_count=window), "basic.qos")
            assert isinstance(qos_ok, aiormq.spec.Basic.QosOk)

            arrived = asyncio.Queue()
            await step(queue.consume(arrived.put), "basic.consume")
            held = [await step(arrived.get(), f"delivery {n + 1} of the window") for n in range(window)]
            assert [message.body for message in held] == [b"job 0", b"job 1"]
            # The ready count proves the broker sent no more than the window.
            assert await ready_count(channel, queue.name) == 3
            assert arrived.empty(), "the broker delivered more than the prefetch window"

            await held[0].ack()
            refill = await step(arrived.get(), "delivery after acking one of the window")
            assert refill.body == b"job 2"
            assert await ready_count(channel, queue.name) == 2
            assert arrived.empty(), "one ack made room for more than one delivery"

            await refill.ack(multiple=True)
            rest = [await step(arrived.get(), "delivery after acking all") for _ in range(2)]
            assert [message.body for message in rest] == [b"job 3", b"job 4"]
            assert await ready_count(channel, queue.name) == 0

    run(scenario)


def test_global_prefetch_is_shared_by_every_consumer_of_the_channel(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            queues = [await step(channel.declare_queue(unique(f"shared-{n}")), "queue.declare") for n in (1, 2)]
            for queue in queues:
                for number in range(3):
                    await step(
                        channel.default_exchange.publish(Message(b"%s %d" % (queue.name.encode(), number)),
                                                         routing_key=queue.name),
                        "publish",
                    )
            await step(channel.set_qos(prefetch_count=2, global_=True), "basic.qos global")

            arrived = asyncio.Queue()
            for queue in queues:
                await step(queue.consume(arrived.put), "basic.consume")
            held = [await step(arrived.get(), f"delivery {n + 1} of the shared window") for n in range(2)]
            ready = [await ready_count(channel, queue.name) for queue in queues]
            assert sum(ready) == 4, f"ready per queue {ready}: the channel holds more than 2 un-acked"
            assert arrived.empty()

            await held[0].ack()
            refill = await step(arrived.get(), "delivery after acking one of the shared window")
            ready = [await ready_count(channel, queue.name) for queue in queues]
            assert sum(ready) == 3, f"ready per queue {ready}"
            assert arrived.empty()
            for message in (held[1], refill):
                await message.ack()

    run(scenario)


def test_unroutable_mandatory_publish_raises_delivery_error_with_312(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(on_return_raises=True), "channel.open")
            exchange = await step(channel.declare_exchange(unique("nowhere"), ExchangeType.DIRECT), "exchange.declare")
            with pytest.raises(aio_exceptions.DeliveryError) as caught:
                await step(exchange.publish(Message(b"lost"), routing_key="no.binding", mandatory=True), "return")
            assert isinstance(caught.value, aio_exceptions.PublishError)
            frame = caught.value.frame
            assert isinstance(frame, aiormq.spec.Basic.Return)
            assert (frame.reply_code, frame.reply_text, frame.exchange, frame.routing_key) == (
                312, "NO_ROUTE", exchange.name, "no.binding"
            )
            assert caught.value.message.body == b"lost"

            # Without on_return_raises the returned message is handed to the return callbacks.
            plain = await step(connection.channel(), "channel.open")
            returned = asyncio.get_running_loop().create_future()
            plain.return_callbacks.add(lambda _channel, message: returned.set_result(message))
            missing = unique("no-such-queue")
            result = await step(
                plain.default_exchange.publish(Message(b"to nobody", app_id="tests"), routing_key=missing),
                "return of a mandatory message",
            )
            assert isinstance(result.delivery, aiormq.spec.Basic.Return)
            assert (result.delivery.reply_code, result.delivery.routing_key) == (312, missing)
            message = await step(returned, "return callback")
            assert (message.body, message.app_id) == (b"to nobody", "tests")

            # Both channels carry on.
            queue = await step(plain.declare_queue(unique("after-return")), "queue.declare")
            for publisher in (channel, plain):
                confirmation = await step(
                    publisher.default_exchange.publish(Message(b"routable"), routing_key=queue.name), "confirm"
                )
                assert isinstance(confirmation, aiormq.spec.Basic.Ack)
            assert await ready_count(plain, queue.name) == 2

    run(scenario)


RICH_HEADERS = {
    "text": "plain and ünïcödé",
    "empty text": "",
    "small int": 7,
    "negative int": -300,
    "int32": 2_000_000_000,
    "int64": -(2**62),
    "true": True,
    "false": False,
    "float": 2.5,  # the client sends floats as 32-bit 'f' fields: only exactly representable values survive
    "bytes": bytearray(b"\x00\x01 raw \xfe\xff"),
    "decimal": decimal.Decimal("3.14159"),
    "negative decimal": decimal.Decimal("-12.50"),
    "datetime": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
    "void": None,
    "nested": {"level": 1, "inner": {"level": 2, "tags": ["a", "b"]}, "flag": False},
    "list": [1, "two", 3.5, True, None, {"k": "v"}, [bytearray(b"x"), -1], decimal.Decimal("0.5")],
    "empty list": [],
    "empty table": {},
}

ALL_PROPERTIES = dict(
    content_type="application/json",
    content_encoding="gzip",
    headers=RICH_HEADERS,
    delivery_mode=DeliveryMode.PERSISTENT,
    priority=7,
    correlation_id="correlation-1",
    reply_to="replies.here",
    expiration=60,
    message_id="message-1",
    timestamp=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
    type="order.created",
    user_id="guest",
    app_id="interop-tests",
)


def typed(value):
    """C{value} with each scalar paired with its type name, so that 1, True and 1.0 compare unequal.
    A bytearray counts as bytes: that is how the client decodes a byte array field."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, bytearray):
        value = bytes(value)
    return type(value).__name__, value


def assert_all_properties(message):
    received = {name: getattr(message, name) for name in ALL_PROPERTIES}
    assert received == ALL_PROPERTIES
    assert typed(message.headers) == typed(RICH_HEADERS)


def test_every_property_and_header_type_round_trips(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            queue = await step(channel.declare_queue(unique("properties")), "queue.declare")
            for copy in range(2):
                confirmation = await step(
                    channel.default_exchange.publish(Message(b"{}", **ALL_PROPERTIES), routing_key=queue.name),
                    f"confirm of copy {copy}",
                )
                assert isinstance(confirmation, aiormq.spec.Basic.Ack), confirmation

            got = await step(queue.get(no_ack=True), "basic.get-ok")
            assert got.body == b"{}"
            assert_all_properties(got)

            # A headers exchange has to read every field of the table to route.
            exchange = await step(channel.declare_exchange(unique("typed"), ExchangeType.HEADERS), "exchange.declare")
            routed = await step(channel.declare_queue(unique("typed-headers")), "queue.declare")
            await step(
                routed.bind(exchange, arguments={"x-match": "all", "text": "plain and ünïcödé", "small int": 7}),
                "queue.bind",
            )
            confirmation = await step(exchange.publish(Message(b"{}", **ALL_PROPERTIES), routing_key=""), "confirm")
            assert isinstance(confirmation, aiormq.spec.Basic.Ack), confirmation
            through_exchange = await step(routed.get(no_ack=True), "basic.get-ok via the headers exchange")
            assert_all_properties(through_exchange)

            async with queue.iterator(timeout=STEP_TIMEOUT) as messages:
                async for delivered in messages:
                    async with delivered.process():
                        assert_all_properties(delivered)
                    break

    run(scenario)


def test_ten_mebibyte_body_round_trips_byte_exact(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            queue = await step(channel.declare_queue(unique("large")), "queue.declare")
            body = os.urandom(TEN_MIB)
            await step(channel.default_exchange.publish(Message(body), routing_key=queue.name), "confirm of 10 MiB")
            await step(channel.default_exchange.publish(Message(body[::-1]), routing_key=queue.name), "confirm")

            got = await step(queue.get(), "basic.get-ok of 10 MiB")
            assert got.body == body, f"basic.get body differs: {first_difference(body, got.body)}"
            await got.ack()
            async with queue.iterator(timeout=STEP_TIMEOUT) as messages:
                async for delivered in messages:
                    async with delivered.process():
                        assert delivered.body == body[::-1], (
                            f"delivered body differs: {first_difference(body[::-1], delivered.body)}"
                        )
                    break
            assert await ready_count(channel, queue.name) == 0

    run(scenario)


def test_passive_declare_of_missing_queue_closes_only_that_channel_with_404(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            doomed = await step(connection.channel(), "channel.open")
            survivor = await step(connection.channel(), "channel.open")
            queue = await step(survivor.declare_queue(unique("survivor")), "queue.declare")
            missing = unique("missing")

            with pytest.raises(aio_exceptions.ChannelNotFoundEntity) as caught:  # reply code 404
                await step(doomed.declare_queue(missing, passive=True), "channel.close for a missing queue")
            assert missing in str(caught.value)
            assert doomed.is_closed
            assert not connection.is_closed

            confirmation = await step(
                survivor.default_exchange.publish(Message(b"alive"), routing_key=queue.name), "confirm"
            )
            assert isinstance(confirmation, aiormq.spec.Basic.Ack)
            assert (await step(queue.get(no_ack=True), "basic.get-ok")).body == b"alive"
            replacement = await step(connection.channel(), "channel.open after a channel error")
            assert await ready_count(replacement, queue.name) == 0

    run(scenario)


def test_purge_and_delete_report_ready_message_counts(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            channel = await step(connection.channel(), "channel.open")
            queue = await step(channel.declare_queue(unique("purge")), "queue.declare")
            for number in range(4):
                await step(channel.default_exchange.publish(Message(b"%d" % number), routing_key=queue.name), "publish")
            purged = await step(queue.purge(), "queue.purge")
            assert isinstance(purged, aiormq.spec.Queue.PurgeOk)
            assert purged.message_count == 4
            assert await ready_count(channel, queue.name) == 0

            for number in range(3):
                await step(channel.default_exchange.publish(Message(b"%d" % number), routing_key=queue.name), "publish")
            held = await step(queue.get(), "basic.get-ok")  # delivered and un-acked: not ready any more
            assert held.body == b"0"
            deleted = await step(queue.delete(if_unused=False, if_empty=False), "queue.delete")
            assert isinstance(deleted, aiormq.spec.Queue.DeleteOk)
            assert deleted.message_count == 2

            probe = await step(connection.channel(), "channel.open")
            with pytest.raises(aio_exceptions.ChannelNotFoundEntity):
                await step(probe.declare_queue(queue.name, passive=True), "passive declare of a deleted queue")

    run(scenario)


def test_transactions_commit_and_roll_back_publishes_and_acks(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as connection:
            observer = await step(connection.channel(), "channel.open")
            queue = await step(observer.declare_queue(unique("tx")), "queue.declare")
            channel = await step(connection.channel(publisher_confirms=False), "channel.open")
            with pytest.raises(RuntimeError):
                (await step(connection.channel(), "channel.open")).transaction()  # not with confirms on

            transaction = channel.transaction()
            assert isinstance(await step(transaction.select(), "tx.select"), aiormq.spec.Tx.SelectOk)
            await channel.default_exchange.publish(Message(b"rolled back"), routing_key=queue.name)
            assert await ready_count(observer, queue.name) == 0
            assert isinstance(await step(transaction.rollback(), "tx.rollback"), aiormq.spec.Tx.RollbackOk)
            assert await ready_count(observer, queue.name) == 0

            await channel.default_exchange.publish(Message(b"first"), routing_key=queue.name)
            await channel.default_exchange.publish(Message(b"second"), routing_key=queue.name)
            assert await ready_count(observer, queue.name) == 0
            assert isinstance(await step(transaction.commit(), "tx.commit"), aiormq.spec.Tx.CommitOk)
            assert await ready_count(observer, queue.name) == 2

            tx_queue = await step(channel.get_queue(queue.name), "passive queue.declare")
            first = await step(tx_queue.get(), "basic.get-ok")
            await first.ack()
            await step(transaction.commit(), "tx.commit of an ack")
            second = await step(tx_queue.get(), "basic.get-ok")
            await second.ack()
            await step(transaction.rollback(), "tx.rollback of an ack")
            assert [first.body, second.body] == [b"first", b"second"]
            # The rolled-back ack left "second" un-acked, so closing the channel requeues it.
            await step(channel.close(), "channel.close")
            assert await ready_count(observer, queue.name) == 1
            again = await step(queue.get(no_ack=True), "basic.get-ok")
            assert (again.body, again.redelivered) == (b"second", True)

            # The context manager commits on a clean exit.
            other = await step(connection.channel(publisher_confirms=False), "channel.open")
            async with other.transaction():
                await other.default_exchange.publish(Message(b"in a block"), routing_key=queue.name)
                assert await ready_count(observer, queue.name) == 0
            assert await ready_count(observer, queue.name) == 1

    run(scenario)
