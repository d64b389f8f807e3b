"""AMQP 0-9-1 errors against a real broker subprocess, as pika and a raw socket client see them.

Each case checks the reply code, that the reply text names the problem, and
whether the channel or the whole connection closed (as the spec and RabbitMQ
do), then that a bystander connection opened before the error still does a
full publish / get round trip. Cases pika cannot express (bad frames, wrong
headers, heartbeats) use L{RawClient}, which speaks frames built and read by
pamqp over a plain socket; every wait on it has a deadline.
"""

import contextlib
import socket
import struct
import time
import uuid

import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from tests.interop.conftest import start_broker

TIMEOUT = 5.0  # the longest any single wait on the broker may take
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY = 1, 2, 3


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- a raw AMQP client


class ConnectionClosed(Exception):
    """The broker closed the socket."""


def raw_frame(frame_type, channel, payload, end=b"\xce"):
    """A frame built by hand, for frames pamqp would refuse to write."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end


class RawClient:
    """
    An AMQP 0-9-1 client on a plain socket: frames are marshalled and read by
    pamqp, every read has a deadline.

    @ivar received: every frame read so far, as C{(channel, frame)}.
    """

    def __init__(self, port, timeout=TIMEOUT):
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        self.received = []
        self.sent_at = time.monotonic()
        self.tune = None

    def close(self):
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)
        self.sent_at = time.monotonic()

    def send_method(self, channel, method):
        self.send(pamqp_frame.marshal(method, channel))

    def send_content(self, channel, body, properties=None, frame_max=4096):
        properties = properties or commands.Basic.Properties()
        header = pamqp_header.ContentHeader(weight=0, body_size=len(body), properties=properties)
        frames = [pamqp_frame.marshal(header, channel)]
        largest = frame_max - 8
        for offset in range(0, len(body), largest):
            frames.append(pamqp_frame.marshal(pamqp_body.ContentBody(body[offset : offset + largest]), channel))
        self.send(b"".join(frames))

    def _deadline(self, timeout):
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing from the broker in time; frames so far: {self.received}")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError(f"nothing from the broker in time; frames so far: {self.received}") from None
        except ConnectionResetError:
            data = b""
        if not data:
            raise ConnectionClosed(f"the broker closed the socket; frames so far: {self.received}")
        self.buffer += data

    def read_frame(self, deadline):
        """The next C{(channel, frame)}, waiting for its bytes until C{deadline} (a monotonic time)."""
        while True:
            if len(self.buffer) >= 7:
                if self.buffer.startswith(b"AMQP"):
                    raise AssertionError(f"protocol header from the broker mid-connection: {self.buffer[:8]!r}")
                (size,) = struct.unpack_from(">I", self.buffer, 3)
                if len(self.buffer) >= size + 8:
                    consumed, channel, value = pamqp_frame.unmarshal(self.buffer[: size + 8])
                    self.buffer = self.buffer[consumed:]
                    self.received.append((channel, value))
                    return channel, value
            self._fill(deadline)

    def wait_for(self, *wanted, timeout=None):
        """
        The first C{(channel, frame)} that is an instance of one of C{wanted},
        skipping others; a connection.close that was not wanted fails the test.
        """
        deadline = self._deadline(timeout)
        while True:
            channel, value = self.read_frame(deadline)
            if isinstance(value, wanted):
                return channel, value
            if isinstance(value, commands.Connection.Close):
                raise AssertionError(
                    f"the broker closed the connection: {value.reply_code} {value.reply_text!r}"
                    f" while {[cls.name for cls in wanted]} was expected"
                )

    def wait_closed(self, timeout=None):
        """Reads (and keeps) frames until the broker closes the socket; fails after C{timeout}."""
        deadline = self._deadline(timeout)
        try:
            while True:
                self.read_frame(deadline)
        except ConnectionClosed:
            return time.monotonic()

    def raw_bytes_until_closed(self, timeout=None):
        """Every byte the broker sends, unparsed, until it closes the socket; fails after C{timeout}."""
        deadline = self._deadline(timeout)
        try:
            while True:
                self._fill(deadline)
        except ConnectionClosed:
            return self.buffer

    def handshake(self, username="guest", password="guest", mechanism="PLAIN", response=None, frame_max=0,
                  heartbeat=0):
        """Protocol header, start-ok, tune-ok and open; returns the connection.tune the broker sent."""
        self.send(AMQP_HEADER)
        _, start = self.wait_for(commands.Connection.Start)
        assert mechanism in start.mechanisms.split()
        if response is None:
            response = f"\0{username}\0{password}"
        self.send_method(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "raw test client", "capabilities": {"consumer_cancel_notify": True}},
                mechanism=mechanism,
                response=response,
                locale="en_US",
            ),
        )
        _, tune = self.wait_for(commands.Connection.Tune)
        self.tune = tune
        self.send_method(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=frame_max or tune.frame_max, heartbeat=heartbeat
            ),
        )
        self.send_method(0, commands.Connection.Open(virtual_host="/"))
        self.wait_for(commands.Connection.OpenOk)
        return tune

    def open_channel(self, channel):
        self.send_method(channel, commands.Channel.Open())
        self.wait_for(commands.Channel.OpenOk)

    def expect_channel_close(self, channel, reply_code, *words):
        """Waits for channel.close on C{channel} (no connection.close), checks it and answers close-ok."""
        got_channel, close = self.wait_for(commands.Channel.Close)
        assert (got_channel, close.reply_code) == (channel, reply_code), close.reply_text
        for word in words:
            assert word in close.reply_text
        self.send_method(channel, commands.Channel.CloseOk())
        return close

    def expect_connection_close(self, reply_code, *words):
        """
        Waits for connection.close (a channel.close fails the test), checks it,
        answers close-ok and waits for the broker to drop the socket.
        """
        channel, close = self.wait_for(commands.Connection.Close, commands.Channel.Close)
        assert isinstance(close, commands.Connection.Close), (
            f"expected connection.close {reply_code}, got channel.close on channel {channel}:"
            f" {close.reply_code} {close.reply_text!r}"
        )
        assert channel == 0
        assert close.reply_code == reply_code, close.reply_text
        for word in words:
            assert word in close.reply_text
        self.send_method(0, commands.Connection.CloseOk())
        self.wait_closed()
        return close

    def round_trip(self, channel, queue):
        """Declare C{queue}, publish to it and basic.get the message back, on this raw connection."""
        self.send_method(channel, commands.Queue.Declare(queue=queue))
        self.wait_for(commands.Queue.DeclareOk)
        body = f"raw round trip {uuid.uuid4().hex}".encode()
        self.send_method(channel, commands.Basic.Publish(exchange="", routing_key=queue))
        self.send_content(channel, body)
        self.send_method(channel, commands.Basic.Get(queue=queue, no_ack=True))
        _, reply = self.wait_for(commands.Basic.GetOk, commands.Basic.GetEmpty)
        assert isinstance(reply, commands.Basic.GetOk)
        self.wait_for(pamqp_header.ContentHeader)
        _, content = self.wait_for(pamqp_body.ContentBody)
        assert content.value == body


@contextlib.contextmanager
def raw_client(broker, **handshake):
    """A RawClient that has done the handshake (pass C{handshake=None} to skip it)."""
    client = RawClient(broker.amqp_port)
    try:
        if handshake.pop("handshake", True):
            client.handshake(**handshake)
        yield client
    finally:
        client.close()


# -- pika helpers


def pika_parameters(broker, username="guest", password="guest", **options):
    return pika.ConnectionParameters(
        host=broker.host,
        port=broker.amqp_port,
        credentials=pika.PlainCredentials(username, password),
        connection_attempts=1,
        socket_timeout=TIMEOUT,
        blocked_connection_timeout=TIMEOUT,
        **options,
    )


@contextlib.contextmanager
def pika_connection(broker, username="guest", password="guest"):
    connection = pika.BlockingConnection(pika_parameters(broker, username, password))
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def pika_round_trip(connection):
    """Declare a queue, publish to it and get the message back, on a new channel of C{connection}."""
    channel = connection.channel()
    queue = unique("round-trip")
    channel.queue_declare(queue, auto_delete=False)
    body = f"round trip {uuid.uuid4().hex}".encode()
    channel.basic_publish("", queue, body, pika.BasicProperties(content_type="text/plain"))
    method, properties, received = channel.basic_get(queue, auto_ack=True)
    assert method is not None, f"basic.get on {queue} found nothing after a publish"
    assert received == body
    assert properties.content_type == "text/plain"
    channel.queue_delete(queue)
    channel.close()


@contextlib.contextmanager
def bystander(broker, username="guest", password="guest"):
    """
    A pika connection opened before the error under test; on leaving, it must
    still be open and do a full publish / get round trip.
    """
    with pika_connection(broker, username, password) as connection:
        pika_round_trip(connection)
        yield connection
        assert connection.is_open, "the bystander connection was closed by another connection's error"
        pika_round_trip(connection)


# -- brokers

_brokers = []


@pytest.fixture(scope="module")
def broker(amqp_broker):
    _brokers.append(amqp_broker)
    return amqp_broker


@pytest.fixture(scope="module")
def users_broker(tmp_path_factory):
    """A broker whose only user is alice/secret."""
    directory = tmp_path_factory.mktemp("users-broker")
    users = directory / "users"
    users.write_text("alice:secret\n")
    running = start_broker(directory, "--users", str(users))
    _brokers.append(running)
    yield running
    running.process.stop()


@pytest.fixture(scope="module")
def small_messages_broker(tmp_path_factory):
    """A broker that accepts message bodies up to 1 KiB."""
    running = start_broker(tmp_path_factory.mktemp("small-broker"), "--max-message-size", "1K")
    _brokers.append(running)
    yield running
    running.process.stop()


@pytest.fixture(autouse=True)
def no_broker_tracebacks():
    """Fails a test during which any broker logged a traceback or an unhandled error."""
    seen = {id(running): len(running.process.output) for running in _brokers}
    yield
    for running in _brokers:
        new = running.process.output[seen.get(id(running), 0) :]
        bad = [line for line in new if "Traceback" in line or "Unhandled" in line]
        assert not bad, "the broker logged a failure:\n" + "\n".join(new)


# -- state conflicts: channel errors


def test_redeclaring_a_queue_with_other_attributes_closes_the_channel_with_406(broker):
    queue = unique("conflict")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=False)

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.queue_declare(queue, durable=True)

        assert raised.value.reply_code == 406
        assert "PRECONDITION_FAILED" in raised.value.reply_text
        assert queue in raised.value.reply_text and "durable" in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        pika_round_trip(connection)
        connection.channel().queue_delete(queue)


def test_redeclaring_an_exchange_with_another_type_closes_the_channel_with_406(broker):
    exchange = unique("conflict-ex")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "direct")

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.exchange_declare(exchange, "fanout")

        assert raised.value.reply_code == 406
        assert "PRECONDITION_FAILED" in raised.value.reply_text
        assert exchange in raised.value.reply_text and "type" in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        pika_round_trip(connection)
        connection.channel().exchange_delete(exchange)


def test_publishing_to_a_missing_exchange_closes_the_channel_with_404(broker):
    exchange = unique("missing-ex")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.basic_publish(exchange, "anything", b"lost")

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.queue_declare("", exclusive=True)  # any synchronous call shows the close

        assert raised.value.reply_code == 404
        assert "NOT_FOUND" in raised.value.reply_text and exchange in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        pika_round_trip(connection)


EXCLUSIVE_QUEUE_USES = {
    "basic.consume": lambda channel, queue: channel.basic_consume(queue, lambda *args: None),
    "queue.declare": lambda channel, queue: channel.queue_declare(queue, exclusive=True),
    "passive queue.declare": lambda channel, queue: channel.queue_declare(queue, passive=True),
    "basic.get": lambda channel, queue: channel.basic_get(queue),
}


@pytest.mark.parametrize("use", EXCLUSIVE_QUEUE_USES)
def test_another_connections_exclusive_queue_is_locked_with_405(broker, use):
    queue = unique("exclusive")
    with bystander(broker), pika_connection(broker) as owner, pika_connection(broker) as other:
        owner_channel = owner.channel()
        owner_channel.queue_declare(queue, exclusive=True)
        channel = other.channel()

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            EXCLUSIVE_QUEUE_USES[use](channel, queue)

        assert raised.value.reply_code == 405
        assert "RESOURCE_LOCKED" in raised.value.reply_text and queue in raised.value.reply_text
        assert channel.is_closed and other.is_open and owner.is_open
        pika_round_trip(other)
        owner_channel.basic_publish("", queue, b"still mine")
        method, _, body = owner_channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"still mine"


# -- authentication

LOGIN_REFUSED = (pika.exceptions.ProbableAuthenticationError, pika.exceptions.AuthenticationError)


def test_a_wrong_password_is_refused_through_pika(broker):
    with bystander(broker):
        with pytest.raises(LOGIN_REFUSED) as raised:
            pika.BlockingConnection(pika_parameters(broker, "guest", "wrong"))

        assert "403" in str(raised.value) and "ACCESS_REFUSED" in str(raised.value)


def test_a_wrong_password_gets_connection_close_403_then_the_socket_closes(broker):
    with bystander(broker), raw_client(broker, handshake=False) as client:
        client.send(AMQP_HEADER)
        client.wait_for(commands.Connection.Start)
        client.send_method(
            0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0guest\0wrong")
        )

        _, close = client.wait_for(commands.Connection.Close, commands.Connection.Tune)

        assert isinstance(close, commands.Connection.Close)
        assert close.reply_code == 403
        assert "ACCESS_REFUSED" in close.reply_text and "PLAIN" in close.reply_text
        assert "wrong" not in close.reply_text  # never the password
        client.send_method(0, commands.Connection.CloseOk())
        client.wait_closed(timeout=2)


def test_an_unknown_mechanism_is_refused_with_403(broker):
    with bystander(broker), raw_client(broker, handshake=False) as client:
        client.send(AMQP_HEADER)
        client.wait_for(commands.Connection.Start)
        client.send_method(
            0, commands.Connection.StartOk(client_properties={}, mechanism="EXTERNAL", response="")
        )

        client.expect_connection_close(403, "ACCESS_REFUSED")


def test_a_users_file_lets_its_users_in(users_broker):
    with pika_connection(users_broker, "alice", "secret") as connection:
        pika_round_trip(connection)


def test_a_users_file_shuts_guest_out(users_broker):
    with bystander(users_broker, "alice", "secret"):
        with pytest.raises(LOGIN_REFUSED) as raised:
            pika.BlockingConnection(pika_parameters(users_broker, "guest", "guest"))

        assert "403" in str(raised.value) and "ACCESS_REFUSED" in str(raised.value)


def test_a_users_file_refuses_a_wrong_password(users_broker):
    with bystander(users_broker, "alice", "secret"), raw_client(users_broker, handshake=False) as client:
        client.send(AMQP_HEADER)
        client.wait_for(commands.Connection.Start)
        client.send_method(
            0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0alice\0guess")
        )

        client.expect_connection_close(403, "ACCESS_REFUSED")


def amqplain_response(login, password):
    """An AMQPLAIN response: a field table's entries without its 4-byte length.

    pamqp writes a long string from str as UTF-8; these entries are ASCII, so
    the str holds exactly the response bytes.
    """
    return pamqp_encode.field_table({"LOGIN": login, "PASSWORD": password})[4:].decode("ascii")


def test_amqplain_logs_in(users_broker):
    with raw_client(users_broker, mechanism="AMQPLAIN", response=amqplain_response("alice", "secret")) as client:
        client.open_channel(1)
        client.round_trip(1, unique("amqplain"))


def test_amqplain_with_a_wrong_password_is_refused_with_403(users_broker):
    with bystander(users_broker, "alice", "secret"), raw_client(users_broker, handshake=False) as client:
        client.send(AMQP_HEADER)
        client.wait_for(commands.Connection.Start)
        client.send_method(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="AMQPLAIN", response=amqplain_response("alice", "nope")
            ),
        )

        client.expect_connection_close(403, "ACCESS_REFUSED", "AMQPLAIN")


# -- the protocol header


@pytest.mark.parametrize(
    "header",
    [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x0a", b"AMQP\x00\x01\x00\x00", b"GET / HTTP/1.1\r\n\r\n"],
    ids=["0-9-0", "0-10", "1-0", "http"],
)
def test_a_wrong_protocol_header_is_answered_with_the_supported_one_then_closed(broker, header):
    with bystander(broker), raw_client(broker, handshake=False) as client:
        client.send(header)

        assert client.raw_bytes_until_closed() == AMQP_HEADER


# -- framing errors: connection errors


def test_a_frame_larger_than_the_negotiated_frame_max_closes_the_connection_with_501(broker):
    queue = unique("frame-max")
    with bystander(broker) as other, raw_client(broker, frame_max=4096) as client:
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=queue))
        client.wait_for(commands.Queue.DeclareOk)
        # A body frame of exactly frame_max is allowed...
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send_content(1, b"a" * (4096 - 8), frame_max=4096)
        client.send_method(1, commands.Queue.Declare(queue=queue, passive=True))
        _, declare_ok = client.wait_for(commands.Queue.DeclareOk)
        assert declare_ok.message_count == 1
        # ...one byte more is not.
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send_content(1, b"b" * (4096 - 7), frame_max=8192)

        close = client.expect_connection_close(501, "FRAME_ERROR", "4097", "4096")

        assert "frame_max" in close.reply_text
        assert other.channel().queue_delete(queue).method.message_count == 1


def test_a_body_frame_without_a_content_header_closes_the_connection_with_505(broker):
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.send(raw_frame(FRAME_BODY, 1, b"no header came first"))

        close = client.expect_connection_close(505, "UNEXPECTED_FRAME", "content header")

        assert "channel 1" in close.reply_text


def test_a_body_frame_after_publish_without_a_content_header_closes_the_connection_with_505(broker):
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
        client.send(raw_frame(FRAME_BODY, 1, b"the header is missing"))

        client.expect_connection_close(505, "UNEXPECTED_FRAME", "content header")


def test_a_method_frame_where_a_content_header_belongs_closes_the_connection_with_505(broker):
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
        client.send_method(1, commands.Queue.Declare(queue=unique("interloper")))

        close = client.expect_connection_close(505, "UNEXPECTED_FRAME", "content header")

        assert "queue.declare" in close.reply_text.lower()


@pytest.mark.parametrize("channel", [0, 1])
def test_an_unknown_method_closes_the_connection_with_540(broker, channel):
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.send(raw_frame(FRAME_METHOD, channel, struct.pack(">HH", 99, 7) + b"\x00\x00"))

        close = client.expect_connection_close(540, "NOT_IMPLEMENTED")

        assert "99" in close.reply_text and "7" in close.reply_text


@pytest.mark.parametrize(
    "method",
    [commands.Queue.Declare(queue="never-declared"), commands.Basic.Publish(exchange="", routing_key="x")],
    ids=["queue.declare", "basic.publish"],
)
def test_a_method_on_a_channel_that_was_never_opened_closes_the_connection_with_504(broker, method):
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.send_method(3, method)

        close = client.expect_connection_close(504, "CHANNEL_ERROR", "channel.open")

        assert "3" in close.reply_text


def test_opening_a_channel_twice_closes_the_connection_with_504(broker):
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Channel.Open())

        close = client.expect_connection_close(504, "CHANNEL_ERROR")

        assert "channel.open" in close.reply_text.lower()
        assert (close.class_id, close.method_id) == (20, 10)


def test_a_wrong_frame_end_byte_closes_the_connection_with_501(broker):
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        frame = pamqp_frame.marshal(commands.Queue.Declare(queue=unique("bad-end")), 1)
        client.send(frame[:-1] + b"\x00")

        client.expect_connection_close(501, "FRAME_ERROR", "frame end")


# -- message size: a channel error


def test_a_body_over_max_message_size_closes_the_channel_with_406(small_messages_broker):
    broker = small_messages_broker
    queue = unique("big")
    with bystander(broker), pika_connection(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.basic_publish("", queue, b"x" * 1024)  # exactly the limit is fine
        assert channel.queue_declare(queue, passive=True).method.message_count == 1

        channel.basic_publish("", queue, b"y" * 2000)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.queue_declare(queue, passive=True)

        assert raised.value.reply_code == 406
        assert "PRECONDITION_FAILED" in raised.value.reply_text
        assert "2000" in raised.value.reply_text and "1024" in raised.value.reply_text
        assert channel.is_closed and connection.is_open
        other_channel = connection.channel()
        assert other_channel.queue_declare(queue, passive=True).method.message_count == 1
        pika_round_trip(connection)
        other_channel.queue_delete(queue)


def test_a_raw_body_over_max_message_size_closes_only_its_channel(small_messages_broker):
    broker = small_messages_broker
    queue = unique("big-raw")
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        client.open_channel(2)
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send_content(1, b"z" * 5000)

        close = client.expect_channel_close(1, 406, "PRECONDITION_FAILED", "5000", "1024")

        assert (close.class_id, close.method_id) == (60, 40)
        client.round_trip(2, queue)


# -- heartbeats


def test_a_silent_client_is_dropped_after_missed_heartbeats(broker):
    interval = 1
    with bystander(broker), raw_client(broker, heartbeat=interval) as client:
        silent_since = client.sent_at

        client.wait_for(pamqp_heartbeat.Heartbeat, timeout=2 * interval)
        assert time.monotonic() - silent_since <= 2 * interval
        closed_at = client.wait_closed(timeout=2 * interval + 2.0)

        assert closed_at - silent_since >= interval, "dropped before a heartbeat interval passed"
        assert closed_at - silent_since <= 2 * interval + 2.0
        assert sum(isinstance(value, pamqp_heartbeat.Heartbeat) for _, value in client.received) >= 1
        assert "missed heartbeats" in broker.process.wait_for_output("missed heartbeats", timeout=TIMEOUT)


def test_a_client_that_sends_heartbeats_is_kept(broker):
    interval = 1
    with raw_client(broker, heartbeat=interval) as client:
        started = time.monotonic()
        while time.monotonic() - started < 3 * interval:
            client.wait_for(pamqp_heartbeat.Heartbeat, timeout=2 * interval)
            client.send(pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0))

        client.open_channel(1)
        client.round_trip(1, unique("heartbeats"))


# -- malformed content-header properties

MALFORMED_PROPERTIES = {
    # content_type flag, then a short string longer than the frame
    "string past the end": struct.pack(">H", 0x8000) + b"\xc8abc",
    # content_type flag, then bytes that are not UTF-8
    "invalid UTF-8": struct.pack(">H", 0x8000) + b"\x02\xff\xfe",
    # headers flag, then a table with a value of unknown type
    "unknown field type": struct.pack(">H", 0x2000) + struct.pack(">I", 3) + b"\x01kZ",
    # delivery_mode flag and nothing after it
    "missing delivery mode": struct.pack(">H", 0x1000),
}


@pytest.mark.parametrize("properties", MALFORMED_PROPERTIES)
def test_malformed_content_header_properties_are_refused(broker, properties):
    queue = unique("malformed")
    with bystander(broker) as other, raw_client(broker) as client:
        other.channel().queue_declare(queue)
        client.open_channel(1)
        body = b"payload"
        header_payload = struct.pack(">HHQ", 60, 0, len(body)) + MALFORMED_PROPERTIES[properties]
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send(raw_frame(FRAME_HEADER, 1, header_payload) + raw_frame(FRAME_BODY, 1, body))
        client.send_method(1, commands.Queue.Declare(queue=queue, passive=True))  # answered only if accepted

        channel, reply = client.wait_for(commands.Connection.Close, commands.Channel.Close, commands.Queue.DeclareOk)

        assert not isinstance(reply, commands.Queue.DeclareOk), (
            f"the broker accepted a message with malformed properties {MALFORMED_PROPERTIES[properties]!r}"
            f" (queue now holds {reply.message_count})"
        )
        if isinstance(reply, commands.Connection.Close):
            assert reply.reply_code == 502, reply.reply_text
            assert "SYNTAX_ERROR" in reply.reply_text
            client.send_method(0, commands.Connection.CloseOk())
            client.wait_closed()
        else:
            assert (channel, reply.reply_code) == (1, 406), reply.reply_text
        assert "propert" in reply.reply_text  # names the content header properties
        check = other.channel()
        assert check.queue_declare(queue, passive=True).method.message_count == 0
        check.queue_delete(queue)
