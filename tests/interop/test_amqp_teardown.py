"""Tearing topology down the way client libraries do, against a real broker.

RabbitMQ 3.10's rules, checked on a RabbitMQ node: queue.unbind is idempotent
(a missing queue, exchange or binding is answered unbind-ok), the default
exchange is refused with 403 whatever the queue, another connection's
exclusive queue is refused with 405 only when the binding exists; basic.cancel
of an unknown consumer tag and the delete of a missing queue or exchange are
answered with their ok. aio-pika's RPC pattern relies on them: C{RPC.close()}
cancels its consumer (its auto-delete reply queue and, with it, the
auto-delete dead-letter exchange go) and then unbinds that queue.
"""

import asyncio

import aio_pika
import amqp
import pytest
from aio_pika.patterns import RPC
from pamqp import commands
from pika import spec

from tests.support.client_broker import logged_errors, raw_client
from tests.support.pika_clients import closed_by_broker

pytestmark = pytest.mark.usefixtures("watchdog")

STEP_TIMEOUT = 10.0  # seconds one awaited broker event may take
MiB = 1024 * 1024


# -- queue.delete


def test_deleting_a_queue_consumed_on_the_same_channel_answers_delete_ok_before_the_cancel(amqp_broker, name):
    # py-amqp (kombu's transport) raises ConsumerCancelled if a server basic.cancel for a consumer without
    # an on_cancel callback arrives while it waits for queue.delete-ok: RabbitMQ sends delete-ok first.
    connection = amqp.Connection(f"{amqp_broker.host}:{amqp_broker.amqp_port}", userid="guest", password="guest")
    connection.connect()
    try:
        channel = connection.channel()
        queue = name("consumed")
        channel.queue_declare(queue, auto_delete=False)
        tag = channel.basic_consume(queue, callback=lambda message: None)
        assert channel.queue_delete(queue) == 0
        with pytest.raises(amqp.exceptions.ConsumerCancelled):  # then the cancel, which py-amqp raises
            connection.drain_events(timeout=STEP_TIMEOUT)
        assert channel.is_open and tag not in channel.callbacks
    finally:
        connection.close()


# -- queue.unbind


def test_unbind_of_a_missing_queue_is_unbind_ok(channel, name):
    exchange = name("ex")
    channel.exchange_declare(exchange, "direct")
    assert isinstance(channel.queue_unbind(name("gone"), exchange, "k").method, spec.Queue.UnbindOk)
    channel.exchange_delete(exchange)


def test_unbind_from_a_missing_exchange_is_unbind_ok(channel, name):
    queue = channel.queue_declare(name("q")).method.queue
    assert isinstance(channel.queue_unbind(queue, name("gone"), "k").method, spec.Queue.UnbindOk)
    channel.queue_delete(queue)


def test_unbind_when_queue_and_exchange_are_both_missing_is_unbind_ok(channel, name):
    assert isinstance(channel.queue_unbind(name("gone-q"), name("gone-ex"), "k").method, spec.Queue.UnbindOk)
    assert channel.is_open


def test_unbind_of_a_binding_that_does_not_exist_is_unbind_ok_and_keeps_the_others(channel, name):
    queue = channel.queue_declare(name("q")).method.queue
    channel.queue_bind(queue, "amq.direct", "kept")
    assert isinstance(channel.queue_unbind(queue, "amq.direct", "never-bound").method, spec.Queue.UnbindOk)
    channel.basic_publish("amq.direct", "kept", b"still bound")
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"still bound"
    channel.queue_delete(queue)


def test_unbind_from_the_default_exchange_is_refused_even_for_a_missing_queue(connection, name):
    closed = closed_by_broker(connection.channel().queue_unbind, name("gone"), "", "k")
    assert closed.reply_code == 403
    assert closed.reply_text == "ACCESS_REFUSED - operation not permitted on the default exchange"


def test_unbind_of_another_connections_exclusive_queue_is_locked_only_when_bound(connect, name):
    owner = connect().channel()
    queue = owner.queue_declare(name("mine"), exclusive=True).method.queue
    owner.queue_bind(queue, "amq.direct", "bound")
    other = connect()
    # No such binding, or no such exchange: RabbitMQ answers unbind-ok without looking at the queue.
    assert isinstance(other.channel().queue_unbind(queue, "amq.direct", "unbound").method, spec.Queue.UnbindOk)
    assert isinstance(other.channel().queue_unbind(queue, name("gone"), "bound").method, spec.Queue.UnbindOk)
    closed = closed_by_broker(other.channel().queue_unbind, queue, "amq.direct", "bound")
    assert closed.reply_code == 405
    locked = (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' in vhost '/'. It could be"
              " originally declared on another connection or the exclusive property value does not match that of the"
              " original declaration.")
    assert len(locked) > 255 and closed.reply_text == locked[:252] + "..."  # cut short as RabbitMQ 3.10.8 does
    owner.basic_publish("amq.direct", "bound", b"binding kept")
    assert owner.basic_get(queue, auto_ack=True)[2] == b"binding kept"


# -- the other teardown steps


def test_cancel_of_an_unknown_consumer_tag_is_cancel_ok(amqp_broker):
    # pika sends no basic.cancel for a tag it does not know: a raw client does.
    with raw_client(amqp_broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Basic.Cancel(consumer_tag="never-consumed"))
        _, cancel_ok = client.wait_for(commands.Basic.CancelOk)
        assert cancel_ok.consumer_tag == "never-consumed"
        client.round_trip(1, "teardown.after-cancel")
        client.send_method(1, commands.Queue.Delete(queue="teardown.after-cancel"))
        client.wait_for(commands.Queue.DeleteOk)


def test_delete_of_a_missing_queue_is_delete_ok_with_no_messages(channel, name):
    frame = channel.queue_delete(name("gone"))
    assert isinstance(frame.method, spec.Queue.DeleteOk)
    assert frame.method.message_count == 0


def test_delete_of_a_missing_exchange_is_delete_ok(channel, name):
    assert isinstance(channel.exchange_delete(name("gone")).method, spec.Exchange.DeleteOk)


def test_channel_close_after_its_auto_delete_queue_went_is_close_ok(connection, name):
    channel = connection.channel()
    queue = channel.queue_declare(name("q"), auto_delete=True).method.queue
    tag = channel.basic_consume(queue, lambda *delivery: None)
    channel.basic_cancel(tag)  # the queue goes with its last consumer
    assert channel.queue_unbind(queue, "amq.direct", "k").method.NAME == "Queue.UnbindOk"
    channel.close()
    assert connection.is_open
    assert closed_by_broker(connection.channel().queue_declare, queue, passive=True).reply_code == 404


# -- aio-pika's RPC pattern end to end


async def _step(awaitable, what):
    try:
        return await asyncio.wait_for(awaitable, STEP_TIMEOUT)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what}: nothing within {STEP_TIMEOUT} s") from None


async def _rpc_round_trip(broker, method_name, argument):
    """Register C{method_name} (it echoes its argument's length and ends), call it, close the RPC."""
    connection = await _step(aio_pika.connect(broker.amqp_url), "connecting")
    async with connection:
        channel = await _step(connection.channel(), "channel.open")
        rpc = await _step(RPC.create(channel), "RPC.create")

        async def measure(*, payload):
            return {"length": len(payload), "ends": payload[-4:]}

        await _step(rpc.register(method_name, measure, auto_delete=True), "RPC.register")
        result = await _step(rpc.call(method_name, kwargs={"payload": argument}), "the RPC call")
        await _step(rpc.close(), "RPC.close")  # cancels the reply consumer, then unbinds its queue
        assert not channel.is_closed, "RPC.close() closed the channel"
        underlay = await _step(channel.get_underlay_channel(), "the channel")
        await _step(underlay.queue_declare(method_name, passive=True), "the method queue is still there")
    return result


def _run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 25))


def test_aio_pika_rpc_registers_calls_and_closes(amqp_broker, name):
    start = len(amqp_broker.process.output)
    result = _run(_rpc_round_trip(amqp_broker, name("rpc"), b"ping"))
    assert result == {"length": 4, "ends": b"ping"}
    assert not logged_errors(amqp_broker.process, start)


def test_aio_pika_rpc_carries_a_one_mib_argument(amqp_broker, name):
    payload = bytes(range(256)) * (MiB // 256)
    result = _run(_rpc_round_trip(amqp_broker, name("rpc-big"), payload))
    assert result == {"length": MiB, "ends": payload[-4:]}


def test_aio_pika_rpc_close_cancels_the_calls_still_waiting(amqp_broker, name):
    method_name = name("rpc-sleeper")

    async def scenario():
        connection = await _step(aio_pika.connect(amqp_broker.amqp_url), "connecting")
        async with connection:
            channel = await _step(connection.channel(), "channel.open")
            rpc = await _step(RPC.create(channel), "RPC.create")
            never, all_running = asyncio.Event(), asyncio.Event()
            running = []

            async def sleeper():
                running.append(True)
                if len(running) == 3:
                    all_running.set()
                await never.wait()

            await _step(rpc.register(method_name, sleeper, auto_delete=True), "RPC.register")
            calls = [asyncio.ensure_future(rpc.call(method_name)) for _ in range(3)]
            await _step(all_running.wait(), "the three calls to reach the method")
            await _step(rpc.close(), "RPC.close")
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            never.set()
            assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes), outcomes
            assert not channel.is_closed

    _run(scenario())
