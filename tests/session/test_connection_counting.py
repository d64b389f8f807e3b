"""Both protocol servers count on the connection every byte they read and write once it is open,
each read and each write once, and give each channel an IChannelPeer, driven by a task.Clock
over a StringTransport."""

from pamqp import commands, frame
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from zope.interface.verify import verifyObject

from brokerd.amqp.server import AmqpServerFactory
from brokerd.interfaces import IChannelPeer
from brokerd.native.server import NativeServerFactory
from brokerd.proto.native_pb2 import Envelope
from tests.support.broker import amqp_server_past_start_ok, encode_frame, make_broker, native_hello


def transport():
    return StringTransport(
        hostAddress=IPv4Address("TCP", "127.0.0.1", 5672), peerAddress=IPv4Address("TCP", "127.0.0.1", 40000)
    )


def test_amqp_server_counts_the_bytes_of_every_read_and_write_after_open():
    broker, clock = make_broker()
    wire = transport()
    protocol = amqp_server_past_start_ok(AmqpServerFactory(broker), clock, wire, {"product": "counter"})
    tune_ok = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)
    protocol.dataReceived(frame.marshal(tune_ok, 0) + frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    wire.clear()
    clock.advance(0)
    connection = protocol.connection
    assert (connection.protocol, connection.user, connection.client_properties) == (
        "AMQP 0-9-1", "guest", {"product": "counter"}
    )
    assert connection.name == "127.0.0.1:40000 -> 127.0.0.1:5672"
    assert connection.bytes_received == 0  # counted from the open on
    assert connection.bytes_sent == len(wire.value())  # connection.open-ok

    requests = frame.marshal(commands.Channel.Open(), 1) + frame.marshal(commands.Queue.Declare(queue="q"), 1)
    protocol.dataReceived(requests[:7])  # a frame split over reads counts once
    protocol.dataReceived(requests[7:])
    clock.advance(0)
    assert connection.bytes_received == len(requests)
    assert connection.bytes_sent == len(wire.value())


def test_native_server_counts_the_bytes_of_every_read_and_write_after_hello():
    broker, clock = make_broker()
    protocol = NativeServerFactory(broker).buildProtocol(None)
    wire = transport()
    protocol.makeConnection(wire)
    protocol.dataReceived(native_hello(client_name="counter"))
    clock.advance(0)
    connection = protocol.connection
    assert (connection.protocol, connection.user, connection.client_name) == ("native", "guest", "counter")
    assert connection.name == "127.0.0.1:40000 -> 127.0.0.1:5672"
    assert connection.bytes_received == 0  # counted from hello on
    assert connection.bytes_sent == len(wire.value())  # hello_ok

    requests = b""
    for channel, kind in ((1, "channel_open"), (1, "queue_declare")):
        envelope = Envelope(channel=channel, correlation_id=len(requests) + 1)
        getattr(envelope, kind).SetInParent()
        requests += encode_frame(envelope)
    protocol.dataReceived(requests[:3])
    protocol.dataReceived(requests[3:])
    clock.advance(0)
    assert connection.bytes_received == len(requests)
    assert connection.bytes_sent == len(wire.value())
    assert len(connection.channels) == 1


def test_both_servers_give_each_channel_a_peer_that_provides_ichannelpeer():
    broker, clock = make_broker()
    native = NativeServerFactory(broker).buildProtocol(None)
    native.makeConnection(transport())
    opened = Envelope(channel=1, correlation_id=1)
    opened.channel_open.SetInParent()
    native.dataReceived(native_hello() + encode_frame(opened))
    amqp = amqp_server_past_start_ok(AmqpServerFactory(broker), clock, transport())
    tune_ok = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)
    amqp.dataReceived(
        frame.marshal(tune_ok, 0) + frame.marshal(commands.Connection.Open(virtual_host="/"), 0)
        + frame.marshal(commands.Channel.Open(), 1)
    )
    for protocol in (native, amqp):
        (channel,) = protocol.connection.channels.values()
        assert verifyObject(IChannelPeer, channel.peer)
