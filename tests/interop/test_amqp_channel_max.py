"""channel_max bounds how many channels a connection has open, not their numbers.

As RabbitMQ 3.10 (checked on a RabbitMQ node): a connection that negotiated
channel_max 2047 may open channel 65535; opening one more channel while
channel_max are open closes the connection with 530 NOT_ALLOWED "number of
channels opened (N) has reached the negotiated channel_max (M)" naming no
method (class and method id 0); a channel closed frees its place; channel 0
is the connection and never a channel (504). The native protocol counts the
same way (--native-channel-max), whatever the numbers.
"""

import pytest
from pamqp import commands

from brokerd.proto.native_pb2 import Envelope
from tests.support.client_broker import bystander, raw_client
from tests.support.rawnative import RawNative

pytestmark = pytest.mark.usefixtures("watchdog", "no_broker_tracebacks")


def test_pika_opens_channel_65535_under_the_default_channel_max(broker, connection, name):
    assert connection._impl.params.channel_max == 2047  # what pika and brokerd negotiated
    channel = connection.channel(channel_number=65535)
    assert channel.channel_number == 65535
    queue = channel.queue_declare(name("q"), exclusive=True).method.queue
    channel.basic_publish("", queue, b"on the last channel number")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"on the last channel number"


def test_opening_one_channel_more_than_channel_max_closes_the_connection_with_530(broker):
    with bystander(broker), raw_client(broker, channel_max=2) as client:
        client.open_channel(65535)
        client.open_channel(7)
        client.send_method(9, commands.Channel.Open())
        close = client.expect_connection_close(530)
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    )
    assert (close.class_id, close.method_id) == (0, 0)


def test_a_closed_channel_frees_its_place_under_channel_max(broker):
    with raw_client(broker, channel_max=2) as client:
        client.open_channel(1)
        client.open_channel(2)
        client.send_method(2, commands.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0))
        client.wait_for(commands.Channel.CloseOk)
        client.open_channel(3000)
        client.round_trip(3000, "channel-max.after-close")
        client.send_method(3000, commands.Queue.Delete(queue="channel-max.after-close"))
        client.wait_for(commands.Queue.DeleteOk)


def test_channel_0_cannot_be_opened(broker):
    with raw_client(broker) as client:
        client.send_method(0, commands.Channel.Open())
        close = client.expect_connection_close(504)
    assert close.reply_text.startswith("CHANNEL_ERROR - unexpected method in connection state running")
    assert (close.class_id, close.method_id) == (20, 10)


def test_native_channel_numbers_above_channel_max_open(broker):
    with RawNative(broker.native_endpoint) as client:
        client.hello()
        for number in (2048, 65536, 2**32 - 1):
            client.open_channel(number)
        declare = Envelope(channel=2**32 - 1, correlation_id=10)
        declare.queue_declare.queue = ""
        declare.queue_declare.exclusive = True
        reply = client.answer(declare)
        assert reply.WhichOneof("payload") == "queue_declare_ok", reply
