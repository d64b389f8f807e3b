"""One client cannot stall the others: each connection holds at most its share of the memory
watermark on its way in.

Each test starts a broker with a 4 MiB watermark (so a connection's share is 1 MiB and its
limit 2 MiB, the defaults' quarter and half), has one client hold memory the broker cannot
hand on (a transaction it never commits, bodies it never finishes, a native frame it never
completes) and, while it does, a well-behaved client publishes with confirms and consumes
with pika: its round trips stay under a second and it is never blocked. The abuser alone is
blocked (connection.blocked, for an AMQP client), then closed with 530 NOT_ALLOWED naming
its limit, and the broker serves everyone again.
"""

import struct
import threading
import time
import uuid

import pika
import pytest
from pamqp import commands, frame
from pamqp import header as pamqp_header

from brokerd.proto.native_pb2 import Envelope
from tests.support.client_broker import TRACEBACK_MARKS, logged_errors, start_broker
from tests.support.rawamqp import RawAmqp, raw_frame
from tests.support.rawnative import RawNative

pytestmark = pytest.mark.long_module(seconds=30)  # started early (tests/conftest.py)

MiB = 1024 * 1024
WATERMARK = 4 * MiB
SHARE, LIMIT = WATERMARK // 4, WATERMARK // 2  # the defaults: 0.25 and 0.5 of the watermark
ROUND_TRIP_SECONDS = 1.0  # what the canary's publish-confirm and consume may each take at most
BLOCKED_LINE = r"above its 1048576-byte share of memory: blocking it"
LIMIT_WORDS = ("NOT_ALLOWED", f"above its limit of {LIMIT} bytes", "connection memory limit")


@pytest.fixture
def broker(tmp_path):
    running = start_broker(tmp_path, "--backend", "memory", "--memory-high-watermark", "4M")
    yield running
    running.process.stop()
    failures = logged_errors(running.process, 0, TRACEBACK_MARKS)
    assert not failures, "the broker logged failures:\n" + "\n".join(failures)


class Canary:
    """A pika client that publishes with confirms and consumes its message back, timing both,
    and notes whether it was ever told it is blocked."""

    def __init__(self, running):
        parameters = pika.ConnectionParameters(
            host=running.host, port=running.amqp_port, credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10,
        )
        self.connection = pika.BlockingConnection(parameters)
        self.blocked = []
        self.connection.add_on_connection_blocked_callback(lambda *args: self.blocked.append(args))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.queue = self.channel.queue_declare("", exclusive=True).method.queue

    def round_trip(self):
        """(seconds to the publish's confirm, seconds from basic.consume to the delivery)."""
        body = f"canary {uuid.uuid4().hex}".encode()
        started = time.monotonic()
        self.channel.basic_publish("", self.queue, body, mandatory=True)  # raises unless confirmed
        confirmed = time.monotonic()
        received = []
        tag = self.channel.basic_consume(
            self.queue, lambda channel, method, properties, got: received.append(got), auto_ack=True
        )
        deadline = confirmed + 10
        while not received and time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.05)
        consumed = time.monotonic()
        self.channel.basic_cancel(tag)
        assert received == [body], "the canary's message did not come back"
        return confirmed - started, consumed - confirmed

    def assert_served(self, rounds=3):
        for _ in range(rounds):
            confirm, consume = self.round_trip()
            assert confirm < ROUND_TRIP_SECONDS, f"the canary's publish took {confirm:.2f} s to be confirmed"
            assert consume < ROUND_TRIP_SECONDS, f"the canary's consume took {consume:.2f} s to deliver"
        assert not self.blocked, f"the canary was blocked: {self.blocked}"

    def close(self):
        self.connection.close()


class Pusher(threading.Thread):
    """Sends C{data} over a duplicate of C{sock} (its own timeout) until all went or the broker
    closed; the test reads the original meanwhile."""

    def __init__(self, sock, data):
        super().__init__(daemon=True)
        self.sock = sock.dup()
        self.data = data
        self.error = None

    def run(self):
        self.sock.settimeout(30)
        try:
            self.sock.sendall(self.data)
        except OSError as error:
            self.error = error
        finally:
            self.sock.close()


def unfinished_content(channel, body_size, sent, frame_max=131072, routing_key="nowhere"):
    """basic.publish and a content header announcing C{body_size} bytes on C{channel}, then
    body frames carrying only C{sent} of them."""
    data = [
        frame.marshal(commands.Basic.Publish(routing_key=routing_key), channel),
        frame.marshal(pamqp_header.ContentHeader(0, body_size, commands.Basic.Properties()), channel),
    ]
    largest = frame_max - 8
    for offset in range(0, sent, largest):
        data.append(raw_frame(3, channel, b"b" * min(largest, sent - offset)))
    return b"".join(data)


def abuse_with_raw_frames(running, data, channels=1):
    """An AMQP client sends C{data} (after opening C{channels} channels): it is blocked alone,
    the canary is served meanwhile, then it is closed at its limit. Returns the close."""
    abuser = RawAmqp(running.host, running.amqp_port)
    try:
        abuser.handshake()
        for channel in range(1, channels + 1):
            abuser.open_channel(channel)
        pusher = Pusher(abuser.sock, data)
        pusher.start()
        _, blocked = abuser.wait_for(commands.Connection.Blocked, timeout=5)
        assert blocked.reason == "connection over its memory share"
        running.process.wait_for_output(BLOCKED_LINE, timeout=5)
        canary = Canary(running)
        try:
            canary.assert_served()
            # The broker reads a blocked connection a step a second: its close-ok waits behind
            # what the pusher sent, and a loaded machine takes more than the usual 5 s.
            abuser.timeout = 15.0
            close = abuser.expect_connection_close(530, *LIMIT_WORDS)
            pusher.join(10)
            canary.assert_served(rounds=1)
        finally:
            canary.close()
        return close
    finally:
        abuser.close()


def test_a_client_that_never_finishes_a_body_is_blocked_alone_then_closed_at_its_limit(broker):
    """One message announcing 3 MiB, all of its body sent but the last byte."""
    abuse_with_raw_frames(broker, unfinished_content(1, 3 * MiB, 3 * MiB - 1))


def test_a_client_with_partial_messages_on_many_channels_is_blocked_alone_then_closed(broker):
    """24 channels, each part-way through a 200 KiB message: 4.2 MiB in all, past the watermark
    itself if nothing held the connection to its share."""
    data = b"".join(unfinished_content(channel, 200 * 1024, 180 * 1024) for channel in range(1, 25))
    abuse_with_raw_frames(broker, data, channels=24)


def test_a_transaction_never_committed_is_blocked_alone_then_closed(broker):
    """pika in tx mode publishes 64 KiB messages and never commits."""
    outcome = {}
    blocked = threading.Event()

    def publish_without_commit():
        parameters = pika.ConnectionParameters(
            host=broker.host, port=broker.amqp_port, credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=1, socket_timeout=5,
        )
        connection = pika.BlockingConnection(parameters)
        connection.add_on_connection_blocked_callback(lambda connection, method: blocked.set())
        try:
            channel = connection.channel()
            channel.tx_select()
            body = b"t" * (64 * 1024)
            for _ in range(1000):  # 64 MiB: far past the limit
                channel.basic_publish("", "nowhere", body)
                connection.process_data_events(0)  # runs the blocked callback
            outcome["error"] = None
        except pika.exceptions.AMQPError as error:
            outcome["error"] = error

    abuser = threading.Thread(target=publish_without_commit, daemon=True)
    abuser.start()
    assert blocked.wait(10), "the client holding a transaction was never told it is blocked"
    broker.process.wait_for_output(BLOCKED_LINE, timeout=5)
    canary = Canary(broker)
    try:
        canary.assert_served()
        abuser.join(15)
        assert not abuser.is_alive(), "the client holding a transaction was never closed"
        error = outcome["error"]
        assert isinstance(error, pika.exceptions.ConnectionClosedByBroker), repr(error)
        assert error.reply_code == 530
        for word in LIMIT_WORDS:
            assert word in error.reply_text
        canary.assert_served(rounds=1)
    finally:
        canary.close()


def test_a_native_client_that_never_finishes_a_frame_is_blocked_alone_then_closed(broker):
    """A native-protocol frame announcing 3 MiB, never completed."""
    with RawNative(broker.native_endpoint) as abuser:
        abuser.hello()
        pusher = Pusher(abuser.sock, struct.pack(">I", 3 * MiB) + b"n" * (3 * MiB - 1))
        pusher.start()
        broker.process.wait_for_output(BLOCKED_LINE, timeout=5)
        canary = Canary(broker)
        try:
            canary.assert_served()
            deadline = time.monotonic() + 10
            closing = abuser.read(deadline)
            while closing.WhichOneof("payload") is None:  # the empty frames that probe a paused client
                closing = abuser.read(deadline)
            assert closing.WhichOneof("payload") == "connection_close", closing
            assert closing.connection_close.reply_code == 530
            for word in LIMIT_WORDS:
                assert word in closing.connection_close.reply_text
            pusher.join(10)
            canary.assert_served(rounds=1)
        finally:
            canary.close()


def test_a_client_that_commits_past_its_share_is_unblocked_and_its_messages_delivered(broker):
    """A transaction of 1.5 MiB (past the share, under the limit) then tx.commit: the client is
    blocked, read again a step later, commits, is unblocked, and its messages are in the queue."""
    client = RawAmqp(broker.host, broker.amqp_port)
    try:
        client.handshake()
        client.open_channel()
        client.send_method(1, commands.Queue.Declare(queue="committed"))
        client.wait_for(commands.Queue.DeclareOk)
        client.send_method(1, commands.Tx.Select())
        client.wait_for(commands.Tx.SelectOk)
        body_size, count = 100 * 1024, 15
        publish = unfinished_content(1, body_size, body_size, routing_key="committed")  # finished
        pusher = Pusher(client.sock, publish * count + frame.marshal(commands.Tx.Commit(), 1))
        pusher.start()
        client.wait_for(commands.Connection.Blocked, timeout=5)
        client.wait_for(commands.Connection.Unblocked, timeout=10)  # the commit released its bodies
        client.wait_for(commands.Tx.CommitOk, timeout=5)
        pusher.join(10)
        client.send_method(1, commands.Queue.Declare(queue="committed", passive=True))
        _, declared = client.wait_for(commands.Queue.DeclareOk)
        assert declared.message_count == count
    finally:
        client.close()
