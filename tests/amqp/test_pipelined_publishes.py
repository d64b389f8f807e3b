"""A client that pipelines publishes to a queue it consumes from on the same connection gets each
one delivered, in order, in the turn that read them (the vhost holds deliveries while a burst of
frames is read and hands them over when it ends)."""

from pamqp import commands, frame, header, body
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from brokerd.amqp.server import AmqpServerFactory
from tests.support.broker import amqp_server_past_start_ok, make_broker


def opened(broker, clock, transport):
    protocol = amqp_server_past_start_ok(AmqpServerFactory(broker), clock, transport)
    tune_ok = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)
    protocol.dataReceived(frame.marshal(tune_ok, 0)
                          + frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    for channel in (1, 2):
        protocol.dataReceived(frame.marshal(commands.Channel.Open(), channel))
    clock.advance(0)
    return protocol


def publishes(bodies, channel=1):
    data = b""
    for content in bodies:
        data += frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), channel)
        data += frame.marshal(header.ContentHeader(0, len(content), commands.Basic.Properties()),
                              channel)
        data += frame.marshal(body.ContentBody(content), channel)
    return data


def delivered(data):
    found, offset = [], 0
    while offset < len(data):
        used, _, value = frame.unmarshal(data[offset:])
        offset += used
        if isinstance(value, commands.Basic.Deliver):
            found.append(["deliver", value.delivery_tag])
        elif isinstance(value, body.ContentBody):
            found[-1].append(value.value)
    return found


def test_a_pipelined_burst_is_delivered_in_order_in_the_turn_that_read_it():
    broker, clock = make_broker()
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    protocol = opened(broker, clock, transport)
    protocol.dataReceived(frame.marshal(commands.Queue.Declare(queue="q"), 2)
                          + frame.marshal(commands.Basic.Consume(queue="q", consumer_tag="c"), 2))
    clock.advance(0)
    transport.clear()
    bodies = [b"m%d" % n for n in range(20)]
    protocol.dataReceived(publishes(bodies))
    clock.advance(0)
    assert delivered(transport.value()) == [
        ["deliver", n + 1, content] for n, content in enumerate(bodies)]
    assert not broker.vhost("/").dispatches.holding
