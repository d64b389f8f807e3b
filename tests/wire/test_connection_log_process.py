"""The broker's log has one line per accepted and one per closed client connection.

Each names the peer and local addresses, the user, the vhost and the client's
product and version; the closing line says why the connection ended. A client
that never logs in writes no such line (only the rate-bounded refusal lines).
"""

import re

import pika
import pytest
from pamqp import commands

from brokerd.proto.native_pb2 import Envelope
from tests.support.client_broker import amqp_broker, raw_client, watchdog  # noqa: F401 (fixtures)
from tests.support.rawnative import RawNative

pytestmark = pytest.mark.usefixtures("watchdog")


def local_port(sock):
    return sock.getsockname()[1]


def connection_lines(broker, port, timeout=10):
    """The accepted and closed lines of the connection from client port C{port}, waiting for both."""
    peer = re.escape(f"{broker.host}:{port} -> {broker.host}:")
    accepted = broker.process.wait_for_output(rf"accepted \w+ connection {peer}", timeout)
    closed = broker.process.wait_for_output(rf"closed \w+ connection {peer}", timeout)
    return accepted, closed


def test_a_pika_connection_is_logged_when_accepted_and_when_closed_with_its_client(amqp_broker):
    connection = pika.BlockingConnection(pika.URLParameters(amqp_broker.amqp_url))
    port = local_port(connection._impl._transport._sock)
    connection.channel()
    connection.close()
    accepted, closed = connection_lines(amqp_broker, port)
    where = f"{amqp_broker.host}:{port} -> {amqp_broker.host}:{amqp_broker.amqp_port}"
    client = f"client Pika Python Client Library {pika.__version__}"
    assert accepted.endswith(f"accepted AMQP connection {where}: user 'guest', vhost '/', {client}")
    assert re.search(
        rf"closed AMQP connection {re.escape(where)} \(user 'guest', vhost '/', {client}\) after \d+\.\d s:"
        r" the client closed it: 200 'Normal shutdown'$",
        closed,
    ), closed


def test_the_closing_line_gives_the_brokers_reply_when_the_broker_closed_it(amqp_broker):
    with raw_client(amqp_broker) as client:
        client.send_method(0, commands.Channel.Open())
        client.expect_connection_close(504)
        port = local_port(client.sock)
    _, closed = connection_lines(amqp_broker, port)
    assert closed.endswith(
        "s: the broker closed it: 504 CHANNEL_ERROR - unexpected method in connection state running:"
        " Channel.Open on channel 0"
    ), closed


def test_the_closing_line_says_when_the_client_dropped_the_tcp_connection(amqp_broker):
    with raw_client(amqp_broker, product="bad\nactor " + "x" * 200) as client:
        port = local_port(client.sock)
    accepted, closed = connection_lines(amqp_broker, port)
    assert accepted.endswith("client bad?actor " + "x" * 70 + "...")  # one line, at most 80 characters of it
    assert closed.endswith("the client closed the TCP connection without closing the connection first"), closed


def test_the_closing_line_says_heartbeats_were_missed(amqp_broker):
    with raw_client(amqp_broker, heartbeat=1) as client:
        port = local_port(client.sock)
        _, closed = connection_lines(amqp_broker, port)
    assert closed.endswith("missed heartbeats from the client, timeout: 1 s"), closed


def test_a_refused_login_writes_no_connection_line(amqp_broker):
    with raw_client(amqp_broker, handshake=False) as client:
        port = local_port(client.sock)
        with pytest.raises(AssertionError):
            client.handshake(password="wrong")
    refused = amqp_broker.process.wait_for_output(rf"refused AMQP client {amqp_broker.host}:{port}|refused \d+ more")
    assert refused
    lines = [line for line in amqp_broker.process.output if f"{amqp_broker.host}:{port} ->" in line]
    assert lines == []


def test_a_native_connection_is_logged_when_accepted_and_when_closed(amqp_broker):
    with RawNative(amqp_broker.native_endpoint) as client:
        client.hello()
        port = local_port(client.sock)
        close = Envelope()
        close.connection_close.reply_code = 200
        close.connection_close.reply_text = "done"
        assert client.answer(close).WhichOneof("payload") == "connection_close_ok"
    accepted, closed = connection_lines(amqp_broker, port)
    assert re.search(r"accepted native connection \S+ -> \S+: user 'guest', vhost '/', client raw native test client$",
                     accepted), accepted
    assert re.search(r"\(user 'guest', vhost '/', client raw native test client\) after \d+\.\d s:"
                     r" the client closed it: 200 'done'$", closed), closed
