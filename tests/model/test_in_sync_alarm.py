"""A cluster leader's in-sync alarm on a task.Clock: raised while fewer nodes are in sync than
--cluster-min-isr asks for, it holds AMQP and native publishers as the memory and disk alarms do
(connection.blocked naming the count, the socket not read), lets a consumer get and ack, and
lets them go once the set is big enough again. (Real cluster processes and pika:
tests/cluster/test_cluster_flow.py.)"""

from pamqp import body, commands, frame, header
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from brokerd.amqp.server import AmqpServerFactory
from brokerd.model.in_sync_alarm import InSyncAlarm
from tests.support.broker import (
    amqp_frames_in, amqp_server_past_start_ok, make_broker, native_publisher,
)

REASON = "replication: 1 in-sync node of the 2 --cluster-min-isr asks for"
QUEUE = "orders"


def test_the_alarm_is_raised_below_the_minimum_and_clears_at_it():
    alarm = InSyncAlarm()
    assert not alarm.blocked and alarm.in_sync is None
    alarm.measured(1, 1)  # a leader alone, as asked
    assert not alarm.blocked
    alarm.measured(1, 2)
    assert alarm.blocked and alarm.reason == REASON
    resumed = []

    def kept():
        resumed.append("kept")

    def closed():
        resumed.append("closed")

    alarm.when_unblocked(kept)
    alarm.when_unblocked(closed)
    alarm.forget(closed)  # its connection went
    alarm.measured(2, 3)
    assert alarm.blocked and alarm.reason == "replication: 2 in-sync nodes of the 3 --cluster-min-isr asks for"
    assert resumed == []
    alarm.measured(3, 3)
    assert not alarm.blocked and resumed == ["kept"]
    alarm.when_unblocked(kept)  # at once when it is not raised
    assert resumed == ["kept", "kept"]


def test_a_broker_that_leads_no_cluster_never_raises_it():
    broker, _ = make_broker()
    assert isinstance(broker.in_sync_alarm, InSyncAlarm) and not broker.in_sync_alarm.blocked


def amqp_connection(broker, clock, capabilities=True):
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    properties = {"capabilities": {"connection.blocked": True}} if capabilities else {}
    protocol = amqp_server_past_start_ok(AmqpServerFactory(broker), clock, transport, client_properties=properties)
    protocol.dataReceived(frame.marshal(commands.Connection.TuneOk(channel_max=10, frame_max=131072), 0)
                          + frame.marshal(commands.Connection.Open(virtual_host="/"), 0)
                          + frame.marshal(commands.Channel.Open(), 1)
                          + frame.marshal(commands.Queue.Declare(queue=QUEUE), 1))
    clock.advance(0)
    return protocol, transport


def publish(protocol, transport, clock, text):
    transport.clear()
    content = [commands.Basic.Publish(exchange="", routing_key=QUEUE),
               header.ContentHeader(0, len(text), commands.Basic.Properties()), body.ContentBody(text)]
    protocol.dataReceived(b"".join(frame.marshal(part, 1) for part in content))
    clock.advance(0)


def notices(transport):
    return [(type(found).__name__, getattr(found, "reason", None)) for found in amqp_frames_in(transport.value())
            if isinstance(found, (commands.Connection.Blocked, commands.Connection.Unblocked))]


def test_amqp_publishers_are_blocked_with_the_in_sync_count_while_a_consumer_gets_and_acks():
    broker, clock = make_broker()
    alarm = broker.in_sync_alarm
    publisher, publisher_transport = amqp_connection(broker, clock)
    consumer, consumer_transport = amqp_connection(broker, clock)
    publish(publisher, publisher_transport, clock, b"before")

    alarm.measured(1, 2)
    publish(publisher, publisher_transport, clock, b"taken")  # read: the publish that finds the alarm raised
    assert notices(publisher_transport) == [("Blocked", REASON)]
    assert publisher_transport.producerState == "paused"
    publisher_transport.clear()
    publish(publisher, publisher_transport, clock, b"held")  # the client sent it; the broker does not read it
    queue = broker.vhost("/").queues[QUEUE]
    assert queue.message_count == 2

    consumer_transport.clear()
    consumer.dataReceived(frame.marshal(commands.Basic.Get(queue=QUEUE), 1))
    clock.advance(0)
    got = [found for found in amqp_frames_in(consumer_transport.value()) if isinstance(found, commands.Basic.GetOk)]
    assert len(got) == 1
    consumer.dataReceived(frame.marshal(commands.Basic.Ack(delivery_tag=got[0].delivery_tag), 1))
    clock.advance(0)
    assert consumer_transport.producerState == "producing" and notices(consumer_transport) == []
    assert queue.message_count == 1

    alarm.measured(2, 2)
    clock.advance(0)
    assert notices(publisher_transport) == [("Unblocked", None)]
    assert publisher_transport.producerState == "producing"
    assert queue.message_count == 2  # what it held back is read now


def test_with_the_disk_alarm_too_the_reason_names_both():
    broker, clock = make_broker()
    publisher, transport = amqp_connection(broker, clock)
    broker.disk_alarm.measured(broker.disk_alarm.limit - 1)
    broker.in_sync_alarm.measured(1, 2)
    publish(publisher, transport, clock, b"x")
    assert notices(transport) == [("Blocked", "low on disk; " + REASON)]
    broker.disk_alarm.measured(broker.disk_alarm.limit)  # the in-sync alarm still holds it: nothing said
    clock.advance(0)
    assert notices(transport) == [("Blocked", "low on disk; " + REASON)] and transport.producerState == "paused"
    transport.clear()
    broker.in_sync_alarm.measured(2, 2)
    clock.advance(0)
    assert notices(transport) == [("Unblocked", None)] and transport.producerState == "producing"


def test_a_client_without_the_capability_is_held_without_a_notice():
    broker, clock = make_broker()
    publisher, transport = amqp_connection(broker, clock, capabilities=False)
    broker.in_sync_alarm.measured(1, 2)
    publish(publisher, transport, clock, b"x")
    assert notices(transport) == [] and transport.producerState == "paused"
    broker.in_sync_alarm.measured(2, 2)
    assert notices(transport) == [] and transport.producerState == "producing"


def test_native_publishers_are_held_while_it_is_raised():
    broker, clock = make_broker()
    protocol, transport, publish_frame = native_publisher(broker, clock)
    assert transport.producerState == "producing"
    broker.in_sync_alarm.measured(1, 2)
    protocol.dataReceived(publish_frame)
    clock.advance(0)
    assert transport.producerState == "paused"
    broker.in_sync_alarm.measured(2, 2)
    assert transport.producerState == "producing"
