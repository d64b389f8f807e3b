"""Connections take turns: a burst of pipelined publishes is parsed a turn's worth at a
time, the socket unread meanwhile, so that other connections are served in between;
a connection that finds nobody else at work gets longer turns (brokerd.wire.fairness).

Turns are measured on brokerd.wire.fairness.turn_clock; these tests replace it with one they
move by hand, and drive the reactor's passes with a task.Clock over StringTransports,
one pass at a time (one_pass)."""

import itertools

import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from brokerd.amqp.server import AmqpServerFactory
from brokerd.native.server import NativeServerFactory
from brokerd.proto.native_pb2 import Envelope
from brokerd.wire import fairness
from brokerd.wire.backpressure import SLOW_READER
from tests.support.broker import amqp_frames_in, amqp_server_past_start_ok, encode_frame, make_broker, native_hello


class TurnClock:
    """turn_clock's stand-in: each look at it is C{step} seconds after the one before."""

    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now


def one_pass(clock):
    """Run what is due now, as one pass of a reactor: calls made meanwhile wait for the next."""
    due = [call for call in clock.getDelayedCalls() if call.getTime() <= clock.seconds()]
    for call in due:
        if call.active():
            clock.calls.remove(call)
            call.called = True
            call.func(*call.args, **call.kw)


@pytest.fixture
def slow_frames(monkeypatch):
    """Every look at the turn clock finds the turn over: a turn is FRAMES_PER_CHECK frames."""
    monkeypatch.setattr(fairness, "turn_clock", TurnClock(step=1.0))


def amqp_connection(broker, clock):
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    protocol = amqp_server_past_start_ok(AmqpServerFactory(broker), clock, transport)
    tune_ok = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)
    protocol.dataReceived(frame.marshal(tune_ok, 0) + frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    protocol.dataReceived(frame.marshal(commands.Channel.Open(), 1))
    protocol.dataReceived(frame.marshal(commands.Queue.Declare(queue="q"), 1))
    clock.advance(0)
    transport.clear()
    return protocol, transport


def publishes(count, routing_key="q"):
    """C{count} publishes of 3 frames each (method, header, body) as one read."""
    parts = []
    for number in range(count):
        body = b"m%d" % number
        parts.append(frame.marshal(commands.Basic.Publish(routing_key=routing_key), 1))
        parts.append(frame.marshal(ContentHeader(0, len(body), commands.Basic.Properties()), 1))
        parts.append(frame.marshal(ContentBody(body), 1))
    return b"".join(parts)


def test_a_burst_is_parsed_a_turn_at_a_time_without_reading_meanwhile(slow_frames):
    broker, clock = make_broker()
    protocol, transport = amqp_connection(broker, clock)
    queue = broker.vhost("/").queues["q"]
    per_turn = fairness.FRAMES_PER_CHECK  # frames, the slow clock ending every turn at its first look

    protocol.dataReceived(publishes(100))  # 300 frames in one read
    assert queue.message_count < 100
    assert transport.producerState == "paused"  # the socket is not read while frames wait
    counts = [queue.message_count]
    while transport.producerState == "paused":
        one_pass(clock)
        counts.append(queue.message_count)
    assert counts[-1] == 100
    assert len(counts) >= 300 // per_turn  # one turn's worth per pass of the reactor
    assert all(later - earlier <= per_turn // 3 + 1 for earlier, later in itertools.pairwise(counts))
    bodies = [entry.message.body for entry in queue._ready.in_memory()]
    assert bodies == [b"m%d" % number for number in range(100)]  # nothing lost or reordered across turns


def test_another_connection_is_served_between_the_turns_of_a_burst(slow_frames):
    broker, clock = make_broker()
    publisher, publisher_transport = amqp_connection(broker, clock)
    other, other_transport = amqp_connection(broker, clock)
    queue = broker.vhost("/").queues["q"]

    publisher.dataReceived(publishes(200))
    one_pass(clock)  # the publisher's second turn
    other.dataReceived(frame.marshal(commands.Queue.Declare(queue="q", passive=True), 1))
    one_pass(clock)  # its third, and the other's reply goes out
    (declare_ok,) = amqp_frames_in(other_transport.value())
    assert isinstance(declare_ok, commands.Queue.DeclareOk)
    assert declare_ok.message_count < 200  # answered before the burst was all parsed
    while publisher_transport.producerState == "paused":
        clock.advance(0)
    assert queue.message_count == 200


def test_a_pause_for_another_reason_outlasts_the_turns(slow_frames):
    """A client that stops reading our replies mid-burst is not read when its turns are over."""
    broker, clock = make_broker()
    protocol, transport = amqp_connection(broker, clock)
    queue = broker.vhost("/").queues["q"]
    protocol.dataReceived(publishes(50))
    protocol.pauseProducing()  # the client stopped reading: SLOW_READER
    for _ in range(100):
        one_pass(clock)
    held = queue.message_count
    assert held < 50 and transport.producerState == "paused"
    protocol.resumeProducing()
    while queue.message_count < 50:
        clock.advance(0)
    clock.advance(0)
    assert transport.producerState == "producing"
    assert SLOW_READER not in protocol._flow.pauses.reasons


def test_turns_grow_while_nobody_else_is_at_work_and_shrink_when_others_are(monkeypatch):
    turn_clock = TurnClock(step=0.0)
    monkeypatch.setattr(fairness, "turn_clock", turn_clock)
    broker, clock = make_broker()
    protocol, transport = amqp_connection(broker, clock)
    taking = protocol._turns
    assert taking.seconds == fairness.TURN_SECONDS

    for _ in range(10):  # alone: each pass between two turns takes no time
        taking.end_turn()
        one_pass(clock)
    assert taking.seconds == fairness.LONGEST_TURN

    taking.end_turn()
    turn_clock.now += fairness.LONGEST_TURN  # others took a whole turn's time in the pass
    one_pass(clock)
    assert taking.seconds == fairness.TURN_SECONDS
    assert transport.producerState == "producing"


def test_a_native_burst_is_parsed_a_turn_at_a_time(slow_frames):
    broker, clock = make_broker()
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    protocol = NativeServerFactory(broker).buildProtocol(None)
    protocol.makeConnection(transport)
    channel_open, declare = Envelope(channel=1), Envelope(channel=1)
    channel_open.channel_open.SetInParent()
    declare.queue_declare.queue = "q"
    protocol.dataReceived(native_hello() + encode_frame(channel_open) + encode_frame(declare))
    while transport.producerState == "paused":
        clock.advance(0)
    queue = broker.vhost("/").queues["q"]

    burst = []
    for number in range(100):
        publish = Envelope(channel=1)
        publish.basic_publish.routing_key = "q"
        publish.basic_publish.body = b"m%d" % number
        burst.append(encode_frame(publish))
    protocol.dataReceived(b"".join(burst))
    assert queue.message_count <= fairness.FRAMES_PER_CHECK
    assert transport.producerState == "paused"
    while transport.producerState == "paused":
        clock.advance(0)
    assert queue.message_count == 100
    bodies = [entry.message.body for entry in queue._ready.in_memory()]
    assert bodies == [b"m%d" % number for number in range(100)]
