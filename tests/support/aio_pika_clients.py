"""What the aio-pika modules share: each test runs one coroutine with C{run}
(``asyncio.run`` under a deadline) against the module's broker (the
``amqp_broker`` fixture), every awaited broker event goes through C{step} with
a timeout, so a hang fails naming the step instead of stalling the run, and
the autouse fixture C{broker_logs_no_errors} (imported by each module) fails a
test during which the broker logged an error.
"""

import asyncio

import aio_pika
import pytest

from tests.support.client_broker import logged_errors, unique_names

STEP_TIMEOUT = 10.0  # seconds any one awaited broker event may take
TEST_TIMEOUT = 25.0  # seconds a whole scenario may take

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
