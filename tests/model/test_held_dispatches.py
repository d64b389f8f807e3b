"""While a connection's burst of frames is read, a vhost holds its queues' deliveries back; at the
release each queue that got messages for a waiting consumer hands them over as one run."""

from tests.support.broker import open_channel, publish


def consuming(broker, clock, *queues):
    channel, peer = open_channel(broker)
    for queue in queues:
        channel.queue_declare(queue)
        channel.basic_consume(queue, queue)
    clock.advance(0)
    return channel, peer


def test_messages_published_while_held_reach_the_waiting_consumer_as_one_run(broker, clock):
    channel, peer = consuming(broker, clock, "q")
    held = broker.vhost("/").dispatches
    held.hold()
    publish(channel, "q", b"1", b"2", b"3")
    assert peer.deliveries == []
    held.release()
    assert peer.runs == [("q", [1, 2, 3])]
    assert [message.body for _, _, _, message in peer.deliveries] == [b"1", b"2", b"3"]


def test_queues_dispatch_in_the_order_they_got_messages_and_only_at_the_outer_release(
        broker, clock):
    channel, peer = consuming(broker, clock, "a", "b")
    held = broker.vhost("/").dispatches
    held.hold()
    held.hold()
    publish(channel, "b", b"b1")
    publish(channel, "a", b"a1", b"a2")
    publish(channel, "b", b"b2")
    held.release()
    assert peer.deliveries == [] and held.holding
    held.release()
    assert not held.holding
    assert peer.runs == [("b", [1, 2]), ("a", [3, 4])]


def test_without_a_hold_a_message_goes_to_its_consumer_at_once(broker, clock):
    channel, peer = consuming(broker, clock, "q")
    publish(channel, "q", b"now")
    assert [message.body for _, _, _, message in peer.deliveries] == [b"now"]


def test_a_queue_deleted_while_held_is_not_dispatched(broker, clock):
    channel, peer = consuming(broker, clock, "q")
    held = broker.vhost("/").dispatches
    held.hold()
    publish(channel, "q", b"gone")
    channel.queue_delete("q")
    held.release()
    assert peer.deliveries == []
