"""An AMQP connection we do not read from, driven by a task.Clock over a StringTransport:
its requests wait (no reply is made for a client that does not read), and its
heartbeats, which wait unread too, are not counted missing meanwhile."""

from pamqp import commands, frame
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from brokerd.amqp.server import AmqpServerFactory
from tests.support.broker import amqp_server_past_start_ok, make_broker


def open_connection(heartbeat=0):
    broker, clock = make_broker()
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    protocol = amqp_server_past_start_ok(AmqpServerFactory(broker), clock, transport)
    tune_ok = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=heartbeat)
    protocol.dataReceived(frame.marshal(tune_ok, 0) + frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    protocol.dataReceived(frame.marshal(commands.Channel.Open(), 1))
    clock.advance(0)
    transport.clear()
    return protocol, transport, clock


def test_requests_wait_while_the_client_does_not_read_and_are_answered_after():
    protocol, transport, clock = open_connection()
    protocol.pauseProducing()  # the transport's write buffer is full
    assert transport.producerState == "paused"  # and we stop reading from the socket
    protocol.dataReceived(frame.marshal(commands.Queue.Declare(queue="q"), 1))
    clock.advance(0)
    assert transport.value() == b""  # read before the pause took effect, but not answered
    protocol.resumeProducing()
    assert transport.producerState == "producing"
    clock.advance(0)
    assert b"q" in transport.value()  # declare-ok


def test_heartbeats_are_not_missed_while_we_do_not_read():
    protocol, transport, clock = open_connection(heartbeat=2)
    protocol.pauseProducing()
    clock.pump([1] * 10)  # five heartbeat intervals without a byte from the client
    assert not transport.disconnecting
    protocol.resumeProducing()
    clock.pump([1] * 6)  # reading again, and still nothing: the client is gone
    assert transport.disconnecting
