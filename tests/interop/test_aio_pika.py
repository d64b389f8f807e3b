"""aio-pika (asyncio, over aiormq) against a real ``twistd brokerd`` subprocess:
connections, routing through each exchange type and exchange-to-exchange
bindings, basic.get, settling with requeue, prefetch windows and mandatory
returns. Message content, queue purge and delete, channel errors and
transactions are in L{tests.interop.test_aio_pika_messages}.

Each test runs one coroutine against the module's broker and uses its own
queue and exchange names (L{tests.support.aio_pika_clients}).
"""

import asyncio

import aiormq
import pytest
from aio_pika import ExchangeType, Message
from aio_pika import exceptions as aio_exceptions

from tests.support.aio_pika_clients import (  # noqa: F401 (broker_logs_no_errors is an autouse fixture)
    STEP_TIMEOUT,
    broker_logs_no_errors,
    connect,
    drain,
    queue_counts,
    ready_count,
    run,
    step,
    unique,
)


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

