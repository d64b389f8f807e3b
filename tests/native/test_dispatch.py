"""How the native server dispatches envelopes, driven over a StringTransport and a task.Clock:
which error answers a request that is not the client's to send, comes before hello or names
a channel that is not open, and what happens to a channel's frames once the broker closed it."""

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from brokerd.native.server import NativeServerFactory
from brokerd.proto.native_pb2 import Envelope
from tests.support.broker import decode_frames, encode_frame, make_broker, native_hello


class Served:
    """A native server protocol on a StringTransport, and what it answered."""

    def __init__(self, channel_max=None, hello=True):
        broker, self.clock = make_broker()
        factory = NativeServerFactory(broker, **({} if channel_max is None else {"channel_max": channel_max}))
        self.protocol = factory.buildProtocol(None)
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        self.protocol.makeConnection(self.transport)
        if hello:
            self.protocol.dataReceived(native_hello())
            assert [answer.WhichOneof("payload") for answer in self.answers()] == ["hello_ok"]

    def send(self, *envelopes):
        self.protocol.dataReceived(b"".join(encode_frame(envelope) for envelope in envelopes))

    def answers(self):
        """The envelopes sent since the last call."""
        self.clock.advance(0)
        answers = decode_frames(self.transport.value())
        self.transport.clear()
        return answers

    def connection_close(self):
        """The connection_close the server answered with, as (reply code, reply text)."""
        (close,) = self.answers()
        assert close.WhichOneof("payload") == "connection_close"
        assert self.transport.disconnecting
        return close.connection_close.reply_code, close.connection_close.reply_text


def request(kind, channel=1, correlation_id=7, **fields):
    envelope = Envelope(channel=channel, correlation_id=correlation_id)
    payload = getattr(envelope, kind)
    payload.SetInParent()
    for name, value in fields.items():
        setattr(payload, name, value)
    return envelope


def test_a_frame_without_a_request_closes_the_connection_with_540():
    served = Served()
    served.send(Envelope(channel=1))
    assert served.connection_close() == (540, "NOT_IMPLEMENTED - frame carries no request this broker knows")


def test_what_only_the_server_sends_closes_the_connection_with_503():
    served = Served()
    served.send(request("basic_deliver"))
    assert served.connection_close() == (503, "COMMAND_INVALID - basic_deliver is sent by the server, not the client")


def test_a_channel_request_before_hello_closes_the_connection_with_505():
    served = Served(hello=False)
    served.send(request("queue_declare", queue="q"))
    assert served.connection_close() == (505, "UNEXPECTED_FRAME - expected hello as the first frame, got queue_declare")


def test_a_second_hello_closes_the_connection_with_503():
    served = Served()
    served.protocol.dataReceived(native_hello())
    assert served.connection_close() == (503, "COMMAND_INVALID - hello was already received on this connection")


def test_channel_0_cannot_be_opened():
    served = Served()
    served.send(request("channel_open", channel=0))
    assert served.connection_close() == (
        504, "CHANNEL_ERROR - channel 0 is the connection itself and cannot be opened"
    )


def test_a_request_on_a_channel_that_is_not_open_closes_the_connection_with_504():
    for kind, fields in [("queue_declare", {"queue": "q"}), ("basic_ack", {"delivery_tag": 1}),
                         ("management_request", {"command": "list_users"})]:
        served = Served()
        served.send(request(kind, channel=3, **fields))
        assert served.connection_close() == (504, "CHANNEL_ERROR - channel 3 is not open"), kind


def test_an_unknown_exchange_type_is_refused_before_the_channel_is_looked_up():
    served = Served()
    served.send(request("exchange_declare", channel=3, exchange="x", type=99))
    assert served.connection_close() == (503, "COMMAND_INVALID - unknown exchange type number 99")


def test_closing_a_channel_that_is_not_open_is_answered_with_close_ok():
    served = Served()
    served.send(request("channel_close", channel=5))
    (answer,) = served.answers()
    assert (answer.channel, answer.correlation_id, answer.WhichOneof("payload")) == (5, 7, "channel_close_ok")
    assert not served.transport.disconnecting


def test_a_closed_channels_frames_are_dropped_until_close_ok_and_it_counts_against_channel_max_meanwhile():
    served = Served(channel_max=1)
    served.send(request("channel_open"), request("queue_declare", correlation_id=8, queue="missing", passive=True))
    ok, close = served.answers()
    assert ok.WhichOneof("payload") == "ok"
    assert (close.channel, close.correlation_id, close.channel_close.reply_code) == (1, 8, 404)
    served.send(request("queue_declare", queue="q"), request("channel_open"))  # dropped
    assert served.answers() == []
    served.send(request("channel_open", channel=2))
    assert served.connection_close() == (
        530, "NOT_ALLOWED - number of channels opened (1) has reached the channel_max (1)"
    )


def test_after_close_ok_a_closed_channel_may_be_opened_again():
    served = Served(channel_max=1)
    served.send(request("channel_open"), request("queue_declare", queue="missing", passive=True))
    served.answers()
    served.send(request("channel_close_ok"), request("channel_open"), request("queue_declare", queue="q"))
    kinds = [answer.WhichOneof("payload") for answer in served.answers()]
    assert kinds == ["ok", "queue_declare_ok"]


def test_a_client_closing_a_channel_the_broker_closed_gets_close_ok():
    served = Served()
    served.send(request("channel_open"), request("queue_declare", queue="missing", passive=True))
    served.answers()
    served.send(request("channel_close"), request("channel_open"))
    kinds = [answer.WhichOneof("payload") for answer in served.answers()]
    assert kinds == ["channel_close_ok", "ok"]
