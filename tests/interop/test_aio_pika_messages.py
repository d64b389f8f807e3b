"""aio-pika (asyncio, over aiormq) against a real ``twistd brokerd``
subprocess, past routing: every property and header type and a 10 MiB body
round trip, a channel error closes only its channel, queue.purge and
queue.delete report their counts, and transactions commit and roll back
publishes and acks.

Each test runs one coroutine against the module's broker and uses its own
queue and exchange names (L{tests.support.aio_pika_clients}).
"""

import datetime
import decimal
import os

import aiormq
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message
from aio_pika import exceptions as aio_exceptions

from tests.support.aio_pika_clients import (  # noqa: F401 (broker_logs_no_errors is an autouse fixture)
    STEP_TIMEOUT,
    broker_logs_no_errors,
    connect,
    ready_count,
    run,
    step,
    unique,
)
from tests.support.client_broker import first_difference

TEN_MIB = 10 * 1024 * 1024
UTC = datetime.timezone.utc


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
