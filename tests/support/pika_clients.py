"""Helpers the test_pika_* modules share: waiting on pika's event loop, queue
counts, taking messages, broker-closed channels, and typed header comparison."""

import datetime
import decimal
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

QUIET = 0.3  # how long "nothing more arrives" is watched for
MiB = 1024 * 1024


def pump(connection, until, what, timeout=5.0):
    """Runs pika's event loop until C{until()} is true; fails after C{timeout} seconds."""
    deadline = time.monotonic() + timeout
    while not until():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        connection.process_data_events(time_limit=min(0.05, remaining))


def settle(connection):
    """Gives the broker a moment to send anything more it would send."""
    connection.process_data_events(time_limit=QUIET)


def message_count(channel, queue):
    return channel.queue_declare(queue, passive=True).method.message_count


def consumer_count(channel, queue):
    return channel.queue_declare(queue, passive=True).method.consumer_count


def get_bodies(channel, queue):
    """Takes (auto-ack) every message ready in C{queue}; returns their bodies in order."""
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def closed_by_broker(function, *args, **kwargs):
    """Calls C{function}; returns the ChannelClosedByBroker it must raise."""
    with pytest.raises(ChannelClosedByBroker) as raised:
        function(*args, **kwargs)
    return raised.value


def close_reasons(channel):
    """A list that receives the reason C{channel} closes for, once it does."""
    reasons = []
    channel._impl.add_on_close_callback(lambda _channel, reason: reasons.append(reason))
    return reasons


def collector():
    received = []

    def on_message(channel, method, properties, body):
        received.append((method, properties, body))

    return received, on_message


def fill(channel, queue, bodies):
    channel.queue_declare(queue)
    for body in bodies:
        channel.basic_publish("", queue, body)


def take(channel, queue, count):
    """basic.get (manual ack) C{count} messages; returns their GetOk methods and bodies."""
    taken = []
    for _ in range(count):
        method, _, body = channel.basic_get(queue)
        assert method is not None, f"queue {queue} ran dry after {len(taken)} messages"
        taken.append((method, body))
    return taken


def redelivery_state(channel, queue):
    """Takes everything ready in C{queue}: a list of (body, redelivered)."""
    state = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return state
        state.append((body, method.redelivered))


# -- header values, compared with their types


HEADERS = {
    "string": "text with ünïcödé",
    "empty string": "",
    "bytes": b"\x00\x01\xfe\xffbinary",
    "small int": 42,
    "zero": 0,
    "negative int": -7,
    "int32 max": 2**31 - 1,
    "int32 min": -(2**31),
    "large int": 2**40 + 3,
    "large negative int": -(2**62),
    "true": True,
    "false": False,
    "decimal": decimal.Decimal("3.14"),
    "negative decimal": decimal.Decimal("-0.005"),
    "whole decimal": decimal.Decimal("12"),
    "datetime": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc),
    "nested": {"inner": "value", "number": 1, "deeper": {"list": [1, "two"], "flag": False}},
    "empty table": {},
    "list": [1, "two", b"three", True, None, -(2**40), decimal.Decimal("1.5"), {"key": "value"}, [2, [3]]],
    "empty list": [],
    "none": None,
}


def typed(value):
    """C{value} with the type of every part spelled out, so that 1 == True or 1 == 1.0 do not pass."""
    if isinstance(value, dict):
        return ("dict", {key: typed(item) for key, item in value.items()})
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    if type(value) is pika.compat.long:
        return ("int", int(value))  # pika reads every 64-bit 'l' integer as its int subclass "long"
    return (type(value).__name__, value)


def type_differences(received, sent, path="headers"):
    """Where C{received} differs from C{sent} in value or type, one line per place."""
    if isinstance(sent, dict) and isinstance(received, dict):
        problems = [f"{path}: missing {key!r}" for key in sent if key not in received]
        problems += [f"{path}: unexpected {key!r}" for key in received if key not in sent]
        for key in sent:
            if key in received:
                problems += type_differences(received[key], sent[key], f"{path}[{key!r}]")
        return problems
    if isinstance(sent, list) and isinstance(received, list) and len(sent) == len(received):
        problems = []
        for index, (got, expected) in enumerate(zip(received, sent)):
            problems += type_differences(got, expected, f"{path}[{index}]")
        return problems
    if typed(received) != typed(sent):
        return [f"{path}: sent {sent!r} ({type(sent).__name__}), received {received!r} ({type(received).__name__})"]
    return []


def wait_for_body(channel, queue, timeout=20.0):
    """The body of the first message to arrive in C{queue}, acked (a delayed one is routed at the
    broker's first ticks), or None if none comes within C{timeout} seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, _properties, body = channel.basic_get(queue)
        if method is not None:
            channel.basic_ack(method.delivery_tag)
            return body
        channel.connection.sleep(0.05)  # pika's own wait: it keeps the connection served meanwhile
    return None
