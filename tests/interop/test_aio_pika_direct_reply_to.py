"""aio-pika against a real broker: an RPC client on RabbitMQ's direct reply-to, as aio-pika
users write it (a passive declare of ``amq.rabbitmq.reply-to``, a no-ack consumer of it, and
requests whose reply_to names it), with the server on another connection."""

import asyncio

from aio_pika import Message

from tests.support.aio_pika_clients import connect, run, step, unique

REPLY_TO = "amq.rabbitmq.reply-to"


def test_rpc_client_on_direct_reply_to(amqp_broker):
    async def scenario():
        async with await connect(amqp_broker) as server_connection, await connect(amqp_broker) as connection:
            server = await step(server_connection.channel(), "server channel.open")
            requests = await step(server.declare_queue(unique("rpc")), "queue.declare of the request queue")

            async def answer(request):
                async with request.process():
                    await server.default_exchange.publish(
                        Message(b"%d" % (int(request.body) * 2), correlation_id=request.correlation_id),
                        routing_key=request.reply_to,
                    )

            await step(requests.consume(answer), "the server's basic.consume")

            channel = await step(connection.channel(), "client channel.open")
            callback_queue = await step(channel.declare_queue(REPLY_TO, passive=True), "passive declare of reply-to")
            assert (callback_queue.declaration_result.message_count,
                    callback_queue.declaration_result.consumer_count) == (0, 1)
            loop = asyncio.get_running_loop()
            futures = {str(number): loop.create_future() for number in range(3)}

            async def on_reply(reply):
                futures[reply.correlation_id].set_result((reply.body, reply.redelivered))

            await step(callback_queue.consume(on_reply, no_ack=True), "basic.consume of reply-to")
            for number in futures:
                await step(channel.default_exchange.publish(
                    Message(number.encode(), correlation_id=number, reply_to=REPLY_TO), routing_key=requests.name,
                ), f"publish of request {number}")
            replies = await step(asyncio.gather(*futures.values()), "the replies")
            assert replies == [(b"0", False), (b"2", False), (b"4", False)]

    run(scenario)
