"""The broker's memory stays within --memory-high-watermark whatever a client holds back.

Each test starts a broker with a small watermark, has one client abuse it over a
real socket (a reply it never reads, a transaction it never commits, bodies it
never finishes, frames it never completes, channels without end), and checks
what an operator would: the broker's peak resident memory (VmHWM of its
process) stays within the watermark plus a fixed margin over its memory at
start, the abusing client is blocked, refused or left unanswered, and other
clients are still served.
"""

import contextlib
import select
import socket
import struct
import time
import uuid

import pika
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header

from brokerd.proto.native_pb2 import Envelope
from tests.support.broker import encode_frame
from tests.support.client_broker import TRACEBACK_MARKS, logged_errors, start_broker
from tests.support.rawamqp import RawAmqp, content_frames

pytestmark = pytest.mark.long_module(seconds=27)  # started early (tests/conftest.py)

MiB = 1024 * 1024
WATERMARK = 32 * MiB
# What the broker may hold above its start and the watermark: the interpreter's
# own growth, the reads being parsed and the one body being copied at a time.
MARGIN = 32 * MiB
STALL_SECONDS = 1.0  # a socket the broker neither reads nor writes for this long has been stopped


@pytest.fixture
def broker(tmp_path):
    # One connection alone may take the broker to its watermark here (a share and a limit
    # above it): these tests are of the broker-wide alarm (test_connection_share: the shares).
    running = start_broker(
        tmp_path, "--backend", "memory", "--memory-high-watermark", str(WATERMARK),
        "--connection-memory-share", "64M", "--connection-memory-limit", "128M",
    )
    running.start_rss = memory_of(running, "VmRSS")
    yield running
    running.process.stop()
    failures = logged_errors(running.process, 0, TRACEBACK_MARKS)
    assert not failures, "the broker logged failures:\n" + "\n".join(failures)


def memory_of(running, field):
    """A memory figure of the broker's process from /proc (VmRSS now, VmHWM the peak), in bytes."""
    with open(f"/proc/{running.process.process.pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc status")


def assert_peak_memory_bounded(running):
    peak = memory_of(running, "VmHWM")
    growth = peak - running.start_rss
    assert growth <= WATERMARK + MARGIN, (
        f"the broker's resident memory grew by {growth / MiB:.0f} MiB (peak {peak / MiB:.0f} MiB),"
        f" more than the {WATERMARK / MiB:.0f} MiB watermark plus {MARGIN / MiB:.0f} MiB"
    )


def pika_connection(running):
    parameters = pika.ConnectionParameters(
        host=running.host,
        port=running.amqp_port,
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
        socket_timeout=5,
        blocked_connection_timeout=10,
    )
    return contextlib.closing(pika.BlockingConnection(parameters))


def confirmed_round_trip(running):
    """A well-behaved client publishes with confirms and consumes the message back."""
    with pika_connection(running) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True).method.queue
        body = f"canary {uuid.uuid4().hex}".encode()
        channel.basic_publish("", queue, body, mandatory=True)  # raises unless confirmed
        for _, _, received in channel.consume(queue, auto_ack=True, inactivity_timeout=10):
            assert received == body, "the canary's message did not come back"
            break
        channel.cancel()


def prepare_waiting_message(running, queue, body):
    """Publish (with a confirm) one message that a consumer-only client takes later."""
    with pika_connection(running) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue)
        channel.basic_publish("", queue, body, mandatory=True)


def get_without_publishing(running, queue):
    """A client that does not publish is served while publishers are blocked: basic.get."""
    with pika_connection(running) as connection:
        _, _, body = connection.channel().basic_get(queue, auto_ack=True)
        return body


def push(sock, unit, count, read=None):
    """Send C{unit} C{count} times without blocking until the broker stops reading (no
    byte could be sent for L{STALL_SECONDS}); returns how many whole units went.
    C{read(sock)} is called whenever the socket is readable."""
    sock.setblocking(False)
    total = len(unit) * count
    sent = 0
    view = memoryview(unit)
    last_progress = time.monotonic()
    try:
        while sent < total and time.monotonic() - last_progress < STALL_SECONDS:
            readable, writable, _ = select.select([sock] if read else [], [sock], [], STALL_SECONDS)
            if readable:
                read(sock)
            if writable:
                offset = sent % len(unit)
                try:
                    sent += sock.send(view[offset : offset + 262144])
                    last_progress = time.monotonic()
                except BlockingIOError:
                    pass
    finally:
        sock.setblocking(True)
    return sent // len(unit)


def publish_unit(queue, body, frame_max):
    """The bytes of one basic.publish with its content on channel 1."""
    method = frame.marshal(commands.Basic.Publish(routing_key=queue), 1)
    return method + content_frames(1, body, frame_max=frame_max)


class BlockedWatch:
    """Reads an abusing AMQP client's socket while it pushes, noting connection.blocked."""

    def __init__(self, client):
        self.client = client
        self.blocked = False

    def __call__(self, sock):
        for _, value in self.client.read_available():
            self.blocked = self.blocked or isinstance(value, commands.Connection.Blocked)


# -- AMQP


def test_get_replies_are_not_made_for_a_client_that_does_not_read_them(broker):
    """basic.get + reject(requeue) of a big message, repeated by a client that never reads
    its socket: the broker stops reading its requests once its replies wait, and nothing is lost."""
    body = b"g" * (4 * MiB)
    rounds = 32  # 128 MiB of replies if each were made
    client = RawAmqp(broker.host, broker.amqp_port, receive_buffer=4096)
    client.handshake()
    client.open_channel()
    client.send_method(1, commands.Queue.Declare(queue="big"))
    client.wait_for(commands.Queue.DeclareOk)
    client.send_method(1, commands.Basic.Publish(routing_key="big"))
    client.send_content(1, body, frame_max=client.tune.frame_max)
    client.send_method(1, commands.Queue.Declare(queue="big", passive=True))
    _, declared = client.wait_for(commands.Queue.DeclareOk)
    assert declared.message_count == 1

    requests = b"".join(
        frame.marshal(commands.Basic.Get(queue="big"), 1)
        + frame.marshal(commands.Basic.Reject(delivery_tag=tag, requeue=True), 1)
        for tag in range(1, rounds + 1)
    )
    client.sock.sendall(requests)

    confirmed_round_trip(broker)  # others are served meanwhile (and the broker has read the requests)
    assert_peak_memory_bounded(broker)

    # Once the client reads, every reply comes, and the message is still there.
    got = 0
    while got < rounds:
        _, value = client.read_frame()
        got += isinstance(value, commands.Basic.GetOk)
    client.send_method(1, commands.Queue.Declare(queue="big", passive=True))
    _, declared = client.wait_for(commands.Queue.DeclareOk)
    assert declared.message_count == 1
    client.close()


def test_an_uncommitted_transaction_counts_against_the_watermark(broker):
    """tx.select, then publishes without commit: the publisher is blocked near the
    watermark; when it goes, what it held is released and publishing works again."""
    prepare_waiting_message(broker, "waiting", b"for a consumer")
    client = RawAmqp(broker.host, broker.amqp_port)
    client.handshake(heartbeat=1)  # a blocked connection that goes away is noticed by its heartbeats
    client.open_channel()
    client.send_method(1, commands.Queue.Declare(queue="tx"))
    client.wait_for(commands.Queue.DeclareOk)
    client.send_method(1, commands.Tx.Select())
    client.wait_for(commands.Tx.SelectOk)

    watch = BlockedWatch(client)
    count = 128
    sent = push(client.sock, publish_unit("tx", b"t" * MiB, client.tune.frame_max), count, watch)
    assert sent < count, "the broker read every uncommitted publish: it never stopped reading"
    assert watch.blocked, "the publisher was not told connection.blocked"
    assert_peak_memory_bounded(broker)
    assert get_without_publishing(broker, "waiting") == b"for a consumer"

    client.close()
    confirmed_round_trip(broker)
    assert_peak_memory_bounded(broker)


def test_unfinished_bodies_count_against_the_watermark(broker):
    """Many channels each announce a large body and send part of it: the connection is
    blocked near the watermark, even in the middle of a body; when it goes, all is released."""
    prepare_waiting_message(broker, "waiting", b"for a consumer")
    client = RawAmqp(broker.host, broker.amqp_port)
    client.handshake(heartbeat=1)
    frame_max = client.tune.frame_max
    channels = range(1, 17)
    for channel in channels:
        client.send_method(channel, commands.Channel.Open())
        client.wait_for(commands.Channel.OpenOk)
    announced = 64 * MiB
    starts = b"".join(
        frame.marshal(commands.Basic.Publish(routing_key="nowhere"), channel)
        + frame.marshal(pamqp_header.ContentHeader(0, announced, commands.Basic.Properties()), channel)
        for channel in channels
    )
    client.sock.sendall(starts)
    piece = b"u" * (frame_max - 8)
    round_of_pieces = b"".join(frame.marshal(pamqp_body.ContentBody(piece), channel) for channel in channels)
    watch = BlockedWatch(client)
    count = (8 * MiB) // len(piece)  # 8 MiB per channel, 128 MiB in all, none finished
    sent = push(client.sock, round_of_pieces, count, watch)
    assert sent < count, "the broker read every unfinished body: it never stopped reading"
    assert watch.blocked, "the publisher was not told connection.blocked"
    assert_peak_memory_bounded(broker)
    assert get_without_publishing(broker, "waiting") == b"for a consumer"

    client.close()
    confirmed_round_trip(broker)
    assert_peak_memory_bounded(broker)


# -- native protocol


class RawNative:
    """A native-protocol client on a plain socket: envelopes out, envelopes in."""

    def __init__(self, endpoint, timeout=5.0, receive_buffer=None):
        _, host, port = endpoint.split(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:  # before connecting, so that the window is sized for it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect((host, int(port)))
        self.buffer = bytearray()

    def send(self, *envelopes):
        self.sock.sendall(b"".join(encode_frame(envelope) for envelope in envelopes))

    def read(self):
        """The next envelope; ConnectionError if the broker closed the socket first."""
        buffer = self.buffer
        while True:
            if len(buffer) >= 4:
                (length,) = struct.unpack_from(">I", buffer)
                if len(buffer) >= 4 + length:
                    envelope = Envelope()
                    envelope.ParseFromString(bytes(buffer[4 : 4 + length]))
                    del buffer[: 4 + length]
                    return envelope
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the broker closed the socket")
            buffer += data

    def wait_for(self, kind, correlation_id=None):
        while True:
            envelope = self.read()
            if envelope.WhichOneof("payload") == kind and correlation_id in (None, envelope.correlation_id):
                return envelope

    def hello(self):
        envelope = Envelope()
        envelope.hello.protocol_version = 1
        envelope.hello.client_name = "raw"
        envelope.hello.username = envelope.hello.password = "guest"
        self.send(envelope)
        self.wait_for("hello_ok")

    def close(self):
        self.sock.close()


def test_native_frames_before_hello_are_small(broker):
    """Connections that announce a huge first frame and never send hello are refused at
    once (501, naming the limit), before the broker takes memory for the frame."""
    declared = 128 * MiB
    clients = [RawNative(broker.native_endpoint) for _ in range(4)]
    start = struct.pack(">I", declared) + b"h" * (4 * MiB)
    for client in clients:
        with contextlib.suppress(OSError):  # the broker may close before all of it went
            client.sock.sendall(start)
    for client in clients:
        close = client.wait_for("connection_close").connection_close
        assert close.reply_code == 501, close.reply_text
        assert f"frame of {declared} bytes is larger than the limit of 4096 bytes before hello" in close.reply_text
        client.close()
    assert_peak_memory_bounded(broker)
    confirmed_round_trip(broker)


def test_partial_native_frames_count_against_the_watermark(broker):
    """After hello, connections each send the start of a large frame and never the rest:
    the broker stops reading them near the watermark, and still serves clients that
    do not publish."""
    prepare_waiting_message(broker, "waiting", b"for a consumer")
    clients = [RawNative(broker.native_endpoint) for _ in range(4)]
    stalled = []
    for client in clients:
        client.hello()
        declared = 96 * MiB
        unit = struct.pack(">I", declared) + b"p" * (16 * MiB - 4)  # sent once: 16 MiB of the 96
        stalled.append(push(client.sock, unit, 1) < 1)
    assert any(stalled), "the broker read 64 MiB of unfinished frames: it never stopped reading"
    assert_peak_memory_bounded(broker)
    assert get_without_publishing(broker, "waiting") == b"for a consumer"
    for client in clients:
        client.close()


def test_native_channels_per_connection_are_limited(broker):
    """Opening channel after channel on one connection: past 2047 the connection is
    closed with 530 naming the limit, and the broker still serves others."""
    client = RawNative(broker.native_endpoint)
    client.hello()
    opens = []
    for channel in range(1, 2101):
        envelope = Envelope(channel=channel, correlation_id=channel)
        envelope.channel_open.SetInParent()
        opens.append(envelope)
    client.send(*opens)
    opened = 0
    while True:
        envelope = client.read()
        kind = envelope.WhichOneof("payload")
        if kind == "ok":
            opened += 1
            continue
        assert kind == "connection_close", envelope
        break
    close = envelope.connection_close
    assert opened == 2047
    assert close.reply_code == 530
    assert "number of channels opened (2047) has reached the channel_max (2047)" in close.reply_text
    client.close()
    assert_peak_memory_bounded(broker)
    confirmed_round_trip(broker)


def test_native_get_replies_are_not_made_for_a_client_that_does_not_read_them(broker):
    """The native protocol's basic_get + basic_reject(requeue) of a big message, repeated by
    a client that never reads: its requests wait until it reads, and nothing is lost."""
    client = RawNative(broker.native_endpoint, receive_buffer=4096)
    client.hello()
    opened = Envelope(channel=1, correlation_id=1)
    opened.channel_open.SetInParent()
    declare = Envelope(channel=1, correlation_id=2)
    declare.queue_declare.queue = "big"
    publish = Envelope(channel=1)
    publish.basic_publish.routing_key = "big"
    publish.basic_publish.body = b"g" * (4 * MiB)
    count = Envelope(channel=1, correlation_id=3)
    count.queue_declare.queue = "big"
    count.queue_declare.passive = True
    client.send(opened, declare, publish, count)
    assert client.wait_for("queue_declare_ok", 3).queue_declare_ok.message_count == 1

    rounds = 32
    requests = []
    for tag in range(1, rounds + 1):
        get = Envelope(channel=1, correlation_id=100 + tag)
        get.basic_get.queue = "big"
        reject = Envelope(channel=1)
        reject.basic_reject.delivery_tag = tag
        reject.basic_reject.requeue = True
        requests += [get, reject]
    client.send(*requests)

    confirmed_round_trip(broker)
    assert_peak_memory_bounded(broker)

    got = 0
    while got < rounds:
        got += client.read().WhichOneof("payload") == "basic_get_ok"
    client.send(count)
    assert client.wait_for("queue_declare_ok", 3).queue_declare_ok.message_count == 1
    client.close()


# -- clients that hang up while they are not read


def test_a_blocked_amqp_client_that_hangs_up_releases_what_it_held(broker):
    """A client without heartbeats sends the start of bodies past the watermark and goes
    away while the broker is not reading it: the broker notices the hang-up all the same,
    releases the bodies and unblocks, so other publishers are served again."""
    client = RawAmqp(broker.host, broker.amqp_port)
    client.handshake(heartbeat=0)
    client.open_channel()
    announced = 64 * MiB
    client.sock.sendall(
        frame.marshal(commands.Basic.Publish(routing_key="nowhere"), 1)
        + frame.marshal(pamqp_header.ContentHeader(0, announced, commands.Basic.Properties()), 1)
    )
    piece = frame.marshal(pamqp_body.ContentBody(b"h" * (client.tune.frame_max - 8)), 1)
    watch = BlockedWatch(client)
    count = (48 * MiB) // len(piece)
    assert push(client.sock, piece, count, watch) < count, "the broker never stopped reading the body"
    assert watch.blocked, "the publisher was not told connection.blocked"
    client.sock.close()
    confirmed_round_trip(broker)  # pika gives up after its blocked_connection_timeout
    assert_peak_memory_bounded(broker)
    assert_memory_given_back(broker)


def assert_memory_given_back(running):
    """What a gone connection held is freed, not only uncounted: once the broker has
    unblocked (the connection's bytes released), resident memory is back within the
    margin of where it started (the broker hands freed heap pages back to the system
    right after it unblocks, and says so in its log)."""
    running.process.wait_for_output(r"unblocking publishers", timeout=10)
    running.process.wait_for_output(r"freed memory given back to the system", timeout=10)
    now = memory_of(running, "VmRSS")
    assert now <= running.start_rss + MARGIN, (
        f"the broker still holds {(now - running.start_rss) / MiB:.0f} MiB after the connection went"
    )


def test_a_blocked_native_client_that_hangs_up_releases_what_it_held(broker):
    """Connections that hold the start of large frames past the watermark and then go away
    unread are noticed, their bytes released, and publishing works again."""
    clients = [RawNative(broker.native_endpoint) for _ in range(4)]
    stalled = []
    for client in clients:
        client.hello()
        stalled.append(push(client.sock, struct.pack(">I", 96 * MiB) + b"p" * (16 * MiB - 4), 1) < 1)
    assert any(stalled), "the broker read every partial frame: none hung up unread"
    for client in clients:
        client.sock.close()
    confirmed_round_trip(broker)
    assert_peak_memory_bounded(broker)
