"""A channel's deliveries: one tag sequence for consumers and basic.get, what each consumer and the
channel hold, and the room a settlement gives back, whichever consumers held what it settles."""

import pytest

from brokerd.errors import PreconditionFailed
from tests.support.broker import open_channel, publish, ready


def consuming(broker, clock, *queues, prefetch=0, global_prefetch=0):
    """A channel with one consumer per queue (tag = queue name), under the given limits."""
    channel, peer = open_channel(broker)
    channel.basic_qos(prefetch)
    if global_prefetch:
        channel.basic_qos(global_prefetch, global_=True)
    for queue in queues:
        channel.queue_declare(queue)
        channel.basic_consume(queue, queue)
    clock.advance(0)
    return channel, peer


def held(channel):
    """Consumer tag -> how many deliveries it holds un-acked."""
    return {tag: consumer.unacked for tag, consumer in channel.consumers.items()}


def test_gets_and_consumer_deliveries_share_one_tag_sequence(broker, clock):
    channel, peer = consuming(broker, clock, "c")
    channel.queue_declare("g")
    publish(channel, "g", b"got", b"got no-ack")
    publish(channel, "c", b"delivered")
    assert channel.basic_get("g")[0] == 2  # the consumer's delivery took tag 1
    assert channel.basic_get("g", no_ack=True)[0] == 3
    assert [tag for _, tag, _, _ in peer.deliveries] == [1]
    assert list(channel.unacked_deliveries) == [1, 2]  # the no-ack get is not kept
    assert channel.messages_delivered == 3


def test_a_multiple_ack_over_interleaved_consumers_gives_each_its_own_room_back(broker, clock):
    channel, peer = consuming(broker, clock, "a", "b", prefetch=3)
    for _ in range(3):
        publish(channel, "a", b"a")
        publish(channel, "b", b"b")
    publish(channel, "a", b"a waits")
    publish(channel, "b", b"b waits")
    assert [consumer for consumer, _, _, _ in peer.deliveries] == ["a", "b"] * 3
    assert held(channel) == {"a": 3, "b": 3}
    channel.basic_ack(4, multiple=True)  # a, b, a, b: two of each
    assert held(channel) == {"a": 2, "b": 2}  # and each took the one waiting for it
    assert sorted(message.body for _, _, _, message in peer.deliveries[6:]) == [b"a waits", b"b waits"]
    channel.basic_ack(0, multiple=True)
    assert held(channel) == {"a": 0, "b": 0} and channel.unacked_count == 0


def test_a_multiple_ack_gives_the_channel_wide_limit_back_for_every_consumer(broker, clock):
    channel, _ = consuming(broker, clock, "a", "b", global_prefetch=4)
    publish(channel, "a", b"1", b"2", b"3")
    publish(channel, "b", b"4", b"5", b"6")
    assert channel.unacked_count == 4 and ready(broker, "a") + ready(broker, "b") == 2
    channel.basic_ack(2, multiple=True)  # a's first two, in one run
    assert channel.unacked_count == 4 and ready(broker, "a") + ready(broker, "b") == 0
    assert sum(held(channel).values()) == 4


def test_gets_do_not_count_against_the_channel_wide_limit(broker, clock):
    channel, peer = consuming(broker, clock, "c", global_prefetch=1)
    channel.queue_declare("g")
    publish(channel, "g", b"got")
    channel.basic_get("g")
    publish(channel, "c", b"delivered")
    assert len(peer.deliveries) == 1
    channel.basic_ack(1)  # the get's: gives no consumer room
    publish(channel, "c", b"waits")
    assert len(peer.deliveries) == 1
    channel.basic_ack(2)
    assert len(peer.deliveries) == 2


def test_a_cancelled_consumer_holds_its_share_of_the_channel_wide_limit_until_settled(broker, clock):
    channel, peer = consuming(broker, clock, "a", "b", global_prefetch=1)
    publish(channel, "a", b"held by a")
    channel.basic_cancel("a")
    publish(channel, "b", b"waits for room")
    assert len(peer.deliveries) == 1
    channel.basic_nack(1, requeue=False)
    assert [message.body for _, _, _, message in peer.deliveries] == [b"held by a", b"waits for room"]


def test_recover_without_requeue_leaves_each_consumer_holding_what_it_is_sent_again(broker, clock):
    channel, peer = consuming(broker, clock, "a", "b", prefetch=2)
    publish(channel, "a", b"a1", b"a2")
    publish(channel, "b", b"b1")
    channel.basic_recover(requeue=False)
    assert held(channel) == {"a": 2, "b": 1}
    assert [tag for _, tag, _, _ in peer.deliveries] == [1, 2, 3, 4, 5, 6]
    assert all(redelivered for _, _, redelivered, _ in peer.deliveries[3:])
    assert channel.messages_redelivered == 3


def test_a_paused_connection_holds_every_consumer_back_until_it_resumes(broker, clock):
    channel, peer = consuming(broker, clock, "c")
    channel.connection.pause_deliveries()
    publish(channel, "c", b"waits")
    assert peer.deliveries == []
    channel.connection.resume_deliveries()
    assert [message.body for _, _, _, message in peer.deliveries] == [b"waits"]


def test_a_settled_tag_cannot_be_settled_again_and_the_failed_settlement_takes_nothing(broker, clock):
    channel, _ = consuming(broker, clock, "c")
    publish(channel, "c", b"1", b"2")
    channel.basic_ack(1)
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 1"):
        channel.basic_ack(1, multiple=True)
    assert list(channel.unacked_deliveries) == [2]
    assert held(channel) == {"c": 1}
