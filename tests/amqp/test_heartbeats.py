"""AMQP heartbeats on a driven clock over a StringTransport: the broker sends one
every half interval while it has nothing else to write, keeps a client that sends
its own, drops one that stays silent for more than two intervals (logging why),
and does neither when the client negotiated heartbeats off."""

from pamqp import commands, frame, heartbeat
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from zope.interface.verify import verifyObject

from brokerd.amqp.handshake import IFrameReader
from brokerd.amqp.server import AmqpServerFactory
from brokerd.interfaces import IChannelPeer
from tests.support.broker import amqp_frames_in, amqp_server_past_start_ok, make_broker

HEARTBEAT = 4  # seconds, as the client's tune-ok sets it
CLIENT_HEARTBEAT = HEARTBEAT_FRAME = frame.marshal(heartbeat.Heartbeat(), 0)


def idle(clock, seconds):
    """Let C{seconds} pass in steps of half a heartbeat interval, as a reactor would run the checks."""
    clock.pump([HEARTBEAT / 2] * int(seconds / (HEARTBEAT / 2)))


def heartbeats_in(data):
    return sum(isinstance(value, heartbeat.Heartbeat) for value in amqp_frames_in(data))


def open_connection(heartbeat_interval=HEARTBEAT, broker_offers=60):
    """A logged-in connection with channel 1 open and everything it was sent so far cleared."""
    broker, clock = make_broker()
    factory = AmqpServerFactory(broker)
    factory.settings.heartbeat = broker_offers
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    protocol = amqp_server_past_start_ok(factory, clock, transport)
    tune, = [value for value in amqp_frames_in(transport.value()) if isinstance(value, commands.Connection.Tune)]
    assert tune.heartbeat == broker_offers
    tune_ok = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=heartbeat_interval)
    protocol.dataReceived(frame.marshal(tune_ok, 0) + frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    protocol.dataReceived(frame.marshal(commands.Channel.Open(), 1))
    clock.advance(0)
    transport.clear()
    return broker, protocol, transport, clock


def declare_answered(protocol, transport, clock, queue="still-alive"):
    """Whether queue.declare on channel 1 is answered with declare-ok."""
    transport.clear()
    protocol.dataReceived(frame.marshal(commands.Queue.Declare(queue=queue), 1))
    clock.advance(0)
    return any(isinstance(value, commands.Queue.DeclareOk) for value in amqp_frames_in(transport.value()))


class LogLines:
    """The broker's log lines while the test runs."""

    def __init__(self):
        self.lines = []
        globalLogPublisher.addObserver(self._observe)

    def _observe(self, event):
        if event.get("log_namespace", "").startswith("brokerd."):
            self.lines.append(formatEvent(event))

    def stop(self):
        globalLogPublisher.removeObserver(self._observe)


def test_the_protocol_provides_what_its_handshake_and_the_model_rely_on():
    _, protocol, _, _ = open_connection()
    assert verifyObject(IFrameReader, protocol)
    assert verifyObject(IChannelPeer, protocol._channels[1])


def test_the_broker_sends_a_heartbeat_every_half_interval_while_idle():
    _, protocol, transport, clock = open_connection()
    for half_interval in range(1, 9):
        protocol.dataReceived(CLIENT_HEARTBEAT)  # the client keeps itself alive meanwhile
        clock.advance(HEARTBEAT / 2)
        assert heartbeats_in(transport.value()) == half_interval, f"after {half_interval} half intervals"
    assert transport.value() == HEARTBEAT_FRAME * 8  # nothing but heartbeats
    assert not transport.disconnecting


def test_the_broker_sends_no_heartbeat_while_it_writes_other_frames():
    _, protocol, transport, clock = open_connection()
    for step in range(8):
        clock.advance(HEARTBEAT / 2 - 0.5)
        assert declare_answered(protocol, transport, clock, f"busy-{step}")  # a reply goes out every 1.5 s
        clock.advance(0.5)
        assert heartbeats_in(transport.value()) == 0, f"at step {step}"
    assert not transport.disconnecting


def test_a_client_that_sends_heartbeats_is_kept_through_many_intervals():
    broker, protocol, transport, clock = open_connection()
    lines = LogLines()
    try:
        for _ in range(10):
            idle(clock, HEARTBEAT)
            protocol.dataReceived(CLIENT_HEARTBEAT)
        assert not transport.disconnecting
        assert heartbeats_in(transport.value()) == 20
        assert declare_answered(protocol, transport, clock)
        assert len(broker.connections) == 1
    finally:
        lines.stop()
    assert not [line for line in lines.lines if "missed heartbeats" in line]


def test_any_frame_from_the_client_counts_as_a_sign_of_life():
    _, protocol, transport, clock = open_connection()
    for step in range(10):
        idle(clock, HEARTBEAT)
        assert declare_answered(protocol, transport, clock, f"talking-{step}")
    assert not transport.disconnecting


def test_a_client_silent_for_more_than_two_intervals_is_dropped_and_the_reason_logged():
    broker, protocol, transport, clock = open_connection()
    lines = LogLines()
    try:
        idle(clock, 2 * HEARTBEAT)  # two whole intervals of silence are still allowed
        assert not transport.disconnecting
        assert len(broker.connections) == 1
        clock.advance(HEARTBEAT / 2)  # the next check finds more than two
        assert transport.disconnecting
        assert broker.connections == set()  # the model's connection (and its channels) closed at once
        assert heartbeats_in(transport.value()) == 4  # the broker itself kept sending until then
        protocol.connectionLost(Failure(ConnectionLost()))
    finally:
        lines.stop()
    (closed,) = [line for line in lines.lines if line.startswith("closed AMQP connection")]
    assert closed.endswith(f"missed heartbeats from the client, timeout: {HEARTBEAT} s")
    assert clock.getDelayedCalls() == []  # no heartbeat check left running


def test_a_client_that_stops_sending_heartbeats_is_dropped_two_intervals_after_its_last():
    _, protocol, transport, clock = open_connection()
    for _ in range(3):
        idle(clock, HEARTBEAT)
        protocol.dataReceived(CLIENT_HEARTBEAT)
    idle(clock, 2 * HEARTBEAT)
    assert not transport.disconnecting
    clock.advance(HEARTBEAT / 2)
    assert transport.disconnecting


def test_heartbeats_negotiated_off_are_neither_sent_nor_expected():
    broker, protocol, transport, clock = open_connection(heartbeat_interval=0, broker_offers=1)
    clock.pump([1] * 30)  # thirty of the broker's offered intervals without a byte either way
    assert transport.value() == b""
    assert not transport.disconnecting
    assert declare_answered(protocol, transport, clock)
    assert len(broker.connections) == 1
