"""Channel deliveries: round-robin, prefetch, ack / nack / reject, requeue order, get and recover."""

import itertools

import pytest

from brokerd.errors import PreconditionFailed
from tests.support.broker import open_channel, publish, ready


def get_all(channel, queue):
    """basic.get until empty; returns (body, redelivered) pairs, leaving them un-acked."""
    got = []
    while (result := channel.basic_get(queue)) is not None:
        _tag, redelivered, message, _left = result
        got.append((message.body, redelivered))
    return got


# -- consumers


def test_consumer_deliveries_start_on_the_next_reactor_turn(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"waiting")
    tag = channel.basic_consume("q", "c1")
    assert tag == "c1"
    assert peer.deliveries == [], "delivered before basic_consume returned (before consume-ok could be sent)"
    clock.advance(0)
    assert [(consumer, message.body) for consumer, _, _, message in peer.deliveries] == [("c1", b"waiting")]


def test_consumers_get_messages_round_robin(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q", "a")
    channel.basic_consume("q", "b")
    channel.basic_consume("q", "c")
    clock.advance(0)
    publish(channel, "q", *[b"%d" % n for n in range(6)])
    assert [(tag, message.body) for tag, _, _, message in peer.deliveries] == [
        ("a", b"0"), ("b", b"1"), ("c", b"2"), ("a", b"3"), ("b", b"4"), ("c", b"5"),
    ]


def test_delivery_tags_count_from_one_per_channel(broker, clock):
    first, first_peer = open_channel(broker)
    second, second_peer = open_channel(broker, channel_id=2, connection=first.connection)
    for channel in (first, second):
        channel.queue_declare(f"q{channel.id}")
        channel.basic_consume(f"q{channel.id}")
    clock.advance(0)
    publish(first, "q1", b"a", b"b")
    publish(first, "q2", b"c", b"d", b"e")
    assert [tag for _, tag, _, _ in first_peer.deliveries] == [1, 2]
    assert [tag for _, tag, _, _ in second_peer.deliveries] == [1, 2, 3]


def test_consumer_prefetch_limits_unacked_deliveries_and_acks_free_room(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(2)
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"1", b"2", b"3", b"4", b"5")
    assert peer.bodies() == [b"1", b"2"]
    assert ready(broker, "q") == 3
    channel.basic_ack(peer.deliveries[0][1])
    assert peer.bodies() == [b"1", b"2", b"3"]
    channel.basic_ack(peer.deliveries[2][1], multiple=True)
    assert peer.bodies() == [b"1", b"2", b"3", b"4", b"5"]


def test_consumer_prefetch_applies_to_consumers_created_after_basic_qos(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("early")
    channel.queue_declare("late")
    channel.basic_consume("early", "early")
    channel.basic_qos(1)
    channel.basic_consume("late", "late")
    clock.advance(0)
    publish(channel, "early", b"e1", b"e2", b"e3")
    publish(channel, "late", b"l1", b"l2", b"l3")
    assert [tag for tag, _, _, _ in peer.deliveries] == ["early"] * 3 + ["late"]


def test_consumer_prefetch_is_per_consumer(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(1)
    channel.basic_consume("q", "a")
    channel.basic_consume("q", "b")
    clock.advance(0)
    publish(channel, "q", b"1", b"2", b"3")
    assert [(tag, message.body) for tag, _, _, message in peer.deliveries] == [("a", b"1"), ("b", b"2")]
    channel.basic_ack(2)  # b's
    assert [(tag, message.body) for tag, _, _, message in peer.deliveries][-1] == ("b", b"3")


def test_channel_prefetch_limits_unacked_deliveries_across_consumers(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q1")
    channel.queue_declare("q2")
    channel.basic_consume("q1", "c1")
    channel.basic_consume("q2", "c2")
    channel.basic_qos(3, global_=True)
    clock.advance(0)
    publish(channel, "q1", b"a", b"b", b"c", b"d")
    publish(channel, "q2", b"w", b"x", b"y", b"z")
    assert len(peer.deliveries) == 3
    assert channel.unacked_count == 3
    channel.basic_ack(peer.deliveries[0][1])
    assert len(peer.deliveries) == 4
    assert ready(broker, "q1") + ready(broker, "q2") == 4


def test_channel_prefetch_applies_to_existing_consumers_at_once(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(1, global_=True)
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"1", b"2", b"3")
    assert peer.bodies() == [b"1"]
    channel.basic_qos(3, global_=True)
    assert peer.bodies() == [b"1", b"2", b"3"]


def test_no_ack_consumer_ignores_prefetch_and_its_messages_are_gone(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(1)
    channel.basic_qos(1, global_=True)
    channel.basic_consume("q", no_ack=True)
    clock.advance(0)
    publish(channel, "q", b"1", b"2", b"3")
    assert peer.bodies() == [b"1", b"2", b"3"]
    assert channel.unacked_count == 0
    channel.connection.close_channel(channel.id)
    assert ready(broker, "q") == 0


# -- settling


def test_ack_settles_for_good(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2")
    tag, _, _, _ = channel.basic_get("q")
    channel.basic_ack(tag)
    assert channel.unacked_count == 0
    channel.connection.close_channel(channel.id)
    assert ready(broker, "q") == 1


def test_ack_multiple_settles_up_to_the_tag(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3", b"4")
    tags = [channel.basic_get("q")[0] for _ in range(4)]
    channel.basic_ack(tags[2], multiple=True)
    assert channel.unacked_count == 1
    channel.connection.close_channel(channel.id)
    assert get_all(open_channel(broker)[0], "q") == [(b"4", True)]


def test_ack_multiple_with_tag_zero_settles_everything(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3")
    get_all(channel, "q")
    channel.basic_ack(0, multiple=True)
    assert channel.unacked_count == 0
    channel.basic_ack(0, multiple=True)  # nothing outstanding: still fine


@pytest.mark.parametrize("requeue", [True, False])
def test_nack_multiple(broker, requeue):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3")
    tags = [channel.basic_get("q")[0] for _ in range(3)]
    channel.basic_nack(tags[1], multiple=True, requeue=requeue)
    assert channel.unacked_count == 1
    assert get_all(channel, "q") == ([(b"1", True), (b"2", True)] if requeue else [])


@pytest.mark.parametrize("requeue", [True, False])
def test_nack_single(broker, requeue):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2")
    channel.basic_get("q")
    second = channel.basic_get("q")[0]
    channel.basic_nack(second, requeue=requeue)
    assert channel.unacked_count == 1
    assert get_all(channel, "q") == ([(b"2", True)] if requeue else [])


@pytest.mark.parametrize("requeue", [True, False])
def test_reject(broker, requeue):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2")
    first = channel.basic_get("q")[0]
    channel.basic_reject(first, requeue=requeue)
    assert channel.unacked_count == 0
    assert get_all(channel, "q") == ([(b"1", True), (b"2", False)] if requeue else [(b"2", False)])


def test_requeued_message_goes_to_a_consumer_marked_redelivered(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(1)
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    channel.basic_nack(peer.deliveries[0][1])
    assert [(message.body, redelivered) for _, _, redelivered, message in peer.deliveries] == [
        (b"1", False), (b"1", True)
    ]


SETTLE_OPERATIONS = {
    "ack": lambda channel, tag: channel.basic_ack(tag),
    "ack-multiple": lambda channel, tag: channel.basic_ack(tag, multiple=True),
    "nack": lambda channel, tag: channel.basic_nack(tag),
    "nack-multiple": lambda channel, tag: channel.basic_nack(tag, multiple=True, requeue=False),
    "reject": lambda channel, tag: channel.basic_reject(tag),
}


@pytest.mark.parametrize("settle", SETTLE_OPERATIONS.values(), ids=SETTLE_OPERATIONS.keys())
def test_unknown_delivery_tag_is_refused(broker, settle):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1")
    tag = channel.basic_get("q")[0]
    with pytest.raises(PreconditionFailed) as caught:
        settle(channel, tag + 41)
    assert caught.value.reply_code == 406
    assert str(tag + 41) in caught.value.text
    assert channel.unacked_count == 1


@pytest.mark.parametrize("settle", SETTLE_OPERATIONS.values(), ids=SETTLE_OPERATIONS.keys())
def test_already_acked_delivery_tag_is_refused(broker, settle):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1")
    tag = channel.basic_get("q")[0]
    channel.basic_ack(tag)
    with pytest.raises(PreconditionFailed) as caught:
        settle(channel, tag)
    assert caught.value.reply_code == 406
    assert str(tag) in caught.value.text


def test_delivery_tag_zero_without_multiple_is_refused(broker):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed) as caught:
        channel.basic_ack(0)
    assert caught.value.reply_code == 406


@pytest.mark.parametrize("order", list(itertools.permutations([0, 1, 2])), ids=str)
def test_requeued_messages_keep_their_place_in_original_order(broker, order):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3", b"4", b"5")
    tags = [channel.basic_get("q")[0] for _ in range(3)]
    for index in order:
        channel.basic_reject(tags[index], requeue=True)
    assert get_all(channel, "q") == [(b"1", True), (b"2", True), (b"3", True), (b"4", False), (b"5", False)]


def test_requeue_of_some_keeps_them_ahead_of_later_messages(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3", b"4")
    tags = [channel.basic_get("q")[0] for _ in range(3)]
    channel.basic_reject(tags[2])
    channel.basic_reject(tags[0])
    assert get_all(channel, "q") == [(b"1", True), (b"3", True), (b"4", False)]


# -- basic.get


def test_basic_get_on_an_empty_queue_returns_none(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    assert channel.basic_get("q") is None


def test_basic_get_returns_the_head_and_what_is_left(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3")
    tag, redelivered, message, left = channel.basic_get("q")
    assert (tag, redelivered, message.body, left) == (1, False, b"1", 2)
    assert channel.basic_get("q")[3] == 1
    assert channel.basic_get("q")[3] == 0
    assert channel.unacked_count == 3


def test_basic_get_no_ack_takes_the_message_for_good(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1")
    tag, _, message, left = channel.basic_get("q", no_ack=True)
    assert (message.body, left) == (b"1", 0)
    assert channel.unacked_count == 0
    with pytest.raises(PreconditionFailed):
        channel.basic_ack(tag)
    channel.connection.close_channel(channel.id)
    assert ready(broker, "q") == 0


# -- basic.recover


def test_recover_with_requeue_returns_every_unacked_message(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3")
    channel.basic_get("q")
    channel.basic_get("q")
    channel.basic_recover(requeue=True)
    assert channel.unacked_count == 0
    assert get_all(channel, "q") == [(b"1", True), (b"2", True), (b"3", False)]


def test_recover_with_requeue_redelivers_to_consumers(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    channel.basic_recover(requeue=True)
    assert [(message.body, redelivered) for _, _, redelivered, message in peer.deliveries] == [
        (b"1", False), (b"2", False), (b"1", True), (b"2", True)
    ]


def test_recover_without_requeue_redelivers_to_the_same_consumer(broker, clock):
    channel, peer = open_channel(broker)
    other_channel, other_peer = open_channel(broker, channel_id=2, connection=channel.connection)
    channel.queue_declare("q")
    channel.basic_consume("q", "mine")
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    other_channel.basic_consume("q", "other")  # would get them if they were requeued
    clock.advance(0)
    old_tags = [tag for _, tag, _, _ in peer.deliveries]
    channel.basic_recover(requeue=False)
    redeliveries = peer.deliveries[2:]
    assert [(consumer, message.body, redelivered) for consumer, _, redelivered, message in redeliveries] == [
        ("mine", b"1", True), ("mine", b"2", True)
    ]
    assert other_peer.deliveries == []
    new_tags = [tag for _, tag, _, _ in redeliveries]
    assert not set(new_tags) & set(old_tags)
    with pytest.raises(PreconditionFailed):
        channel.basic_ack(old_tags[0])
    channel.basic_ack(new_tags[-1], multiple=True)
    assert channel.unacked_count == 0
