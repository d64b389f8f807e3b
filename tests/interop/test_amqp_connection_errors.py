"""Errors that close the whole AMQP connection (refused protocol headers and
logins, bad frames, unknown methods, unopened channels, missed heartbeats),
each while a bystander connection to the same broker stays unharmed."""

import struct
import time

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp import heartbeat as pamqp_heartbeat

from tests.support.client_broker import (
    bystander,
    checked_for_tracebacks,
    pika_connection,
    pika_parameters,
    pika_round_trip,
    raw_client,
    start_broker,
    unique_names,
)
from tests.support.rawamqp import FRAME_BODY, FRAME_METHOD, PROTOCOL_HEADER, TIMEOUT, raw_frame

pytestmark = pytest.mark.usefixtures("no_broker_tracebacks")

unique = unique_names("amqp-connection-errors")


@pytest.fixture(scope="module")
def users_broker(tmp_path_factory):
    """A broker whose only user is alice/secret."""
    directory = tmp_path_factory.mktemp("users-broker")
    users = directory / "users"
    users.write_text("alice:secret\n")
    running = start_broker(directory, "--users", str(users))
    with checked_for_tracebacks(running):
        yield running
    running.process.stop()


# -- the protocol header


@pytest.mark.parametrize(
    "header",
    [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x0a", b"AMQP\x00\x01\x00\x00", b"GET / HTTP/1.1\r\n\r\n"],
    ids=["0-9-0", "0-10", "1-0", "http"],
)
def test_a_wrong_protocol_header_is_answered_with_the_supported_one_then_closed(broker, header):
    with bystander(broker), raw_client(broker, handshake=False) as client:
        client.send(header)

        assert client.raw_bytes_until_closed() == PROTOCOL_HEADER


# -- authentication

LOGIN_REFUSED = (pika.exceptions.ProbableAuthenticationError, pika.exceptions.AuthenticationError)


def test_a_wrong_password_is_refused_through_pika(broker):
    with bystander(broker):
        with pytest.raises(LOGIN_REFUSED) as raised:
            pika.BlockingConnection(pika_parameters(broker, "guest", "wrong"))

        assert "403" in str(raised.value) and "ACCESS_REFUSED" in str(raised.value)


def test_a_wrong_password_gets_connection_close_403_then_the_socket_closes(broker):
    with bystander(broker), raw_client(broker, handshake=False) as client:
        client.send(PROTOCOL_HEADER)
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
        client.send(PROTOCOL_HEADER)
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
        client.send(PROTOCOL_HEADER)
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
        client.send(PROTOCOL_HEADER)
        client.wait_for(commands.Connection.Start)
        client.send_method(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="AMQPLAIN", response=amqplain_response("alice", "nope")
            ),
        )

        client.expect_connection_close(403, "ACCESS_REFUSED", "AMQPLAIN")


# -- framing errors, unknown methods, unopened channels


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
