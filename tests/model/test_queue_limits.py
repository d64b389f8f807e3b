"""Length limits (x-max-length, x-max-length-bytes, x-overflow) and delivery counts (x-delivery-count,
x-delivery-limit)."""

import pytest

from brokerd.errors import PreconditionFailed
from tests.support.broker import open_channel, properties, publish, ready
from tests.support.dead_letters import dead, drain, outcomes, with_dead_letters

# -- drop-head


def test_max_length_drops_the_oldest_messages(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length": 2})
    publish(channel, "q", b"1", b"2", b"3", b"4")
    assert ready(broker, "q") == 2
    assert drain(channel, "q") == [b"3", b"4"]


def test_max_length_drop_head_dead_letters_what_it_drops(broker):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-max-length": 2, "x-overflow": "drop-head"})
    publish(channel, "q", b"1", b"2", b"3", b"4")
    assert dead(channel) == [(b"1", "maxlen"), (b"2", "maxlen")]
    assert drain(channel, "q") == [b"3", b"4"]


def test_max_length_bytes_drops_the_oldest_until_the_bodies_fit(broker):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-max-length-bytes": 10})
    publish(channel, "q", b"aaaa", b"bbbb", b"cc")
    assert ready(broker, "q") == 3  # exactly 10 bytes
    publish(channel, "q", b"d")
    assert dead(channel) == [(b"aaaa", "maxlen")]
    publish(channel, "q", b"eeeeeeeee")  # 16 bytes: "bbbb" and "cc" go
    assert dead(channel) == [(b"bbbb", "maxlen"), (b"cc", "maxlen")]
    assert drain(channel, "q") == [b"d", b"eeeeeeeee"]


def test_max_length_zero_keeps_nothing_for_later(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length": 0})
    publish(channel, "q", b"dropped")
    assert ready(broker, "q") == 0
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"delivered")  # a waiting consumer takes it before it counts
    assert peer.bodies() == [b"delivered"]


def test_unacked_messages_do_not_count_towards_the_length(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length": 1})
    channel.basic_qos(2)
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"1", b"2", b"3", b"4")
    assert peer.bodies() == [b"1", b"2"]
    assert ready(broker, "q") == 1
    channel.basic_ack(peer.deliveries[0][1])
    assert peer.bodies() == [b"1", b"2", b"4"]


def test_get_unacked_messages_do_not_count_towards_the_bytes(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length-bytes": 4, "x-overflow": "reject-publish"})
    publish(channel, "q", b"1234")
    channel.basic_get("q")
    publish(channel, "q", b"5678")
    assert ready(broker, "q") == 1


# -- reject-publish


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx"])
def test_reject_publish_nacks_the_publisher_and_keeps_the_old_messages(broker, clock, overflow):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length": 2, "x-overflow": overflow})
    channel.confirm_select()
    publish(channel, "q", b"1", b"2", b"3", b"4")
    clock.advance(0)
    assert outcomes(peer) == {1: True, 2: True, 3: False, 4: False}
    assert drain(channel, "q") == [b"1", b"2"]
    publish(channel, "q", b"5")
    clock.advance(0)
    assert outcomes(peer)[5] is True
    assert drain(channel, "q") == [b"5"]


def test_reject_publish_by_bytes(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length-bytes": 5, "x-overflow": "reject-publish"})
    channel.confirm_select()
    publish(channel, "q", b"abc", b"def", b"gh", b"i")
    clock.advance(0)
    assert outcomes(peer) == {1: True, 2: False, 3: True, 4: False}
    assert drain(channel, "q") == [b"abc", b"gh"]


def test_reject_publish_does_not_dead_letter(broker):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    publish(channel, "q", b"1", b"2")
    assert dead(channel) == []
    assert drain(channel, "q") == [b"1"]


def test_reject_publish_dlx_dead_letters_the_refused_message(broker, clock):
    channel, peer = open_channel(broker)
    with_dead_letters(channel, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    channel.confirm_select()
    publish(channel, "q", b"kept", b"refused")
    clock.advance(0)
    assert outcomes(peer) == {1: True, 2: False}
    assert dead(channel) == [(b"refused", "maxlen")]
    assert drain(channel, "q") == [b"kept"]


def test_a_message_one_of_two_queues_refuses_is_nacked_but_kept_by_the_other(broker, clock):
    channel, peer = open_channel(broker)
    channel.exchange_declare("fan", "fanout")
    channel.queue_declare("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.queue_declare("open")
    channel.queue_bind("full", "fan")
    channel.queue_bind("open", "fan")
    channel.confirm_select()
    for body in (b"1", b"2"):
        channel.basic_publish("fan", "", properties(), body, mandatory=True)
    clock.advance(0)
    assert outcomes(peer) == {1: True, 2: False}
    assert peer.returns == []
    assert drain(channel, "full") == [b"1"]
    assert drain(channel, "open") == [b"1", b"2"]


def test_a_persistent_message_refused_by_a_full_durable_queue_is_not_stored(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_select()
    publish(channel, "q", b"1", b"2", persistent=True)
    clock.advance(0)
    assert outcomes(peer) == {1: True, 2: False}
    assert broker.store.stats()["messages"] == 1


def test_reject_publish_counts_only_ready_messages(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    publish(channel, "q", b"1")
    tag = channel.basic_get("q")[0]
    channel.confirm_select()
    publish(channel, "q", b"2", b"3")
    clock.advance(0)
    assert outcomes(peer) == {1: True, 2: False}
    channel.basic_nack(tag, requeue=True)  # a requeue goes back even over the limit
    assert drain(channel, "q") == [b"1", b"2"]


@pytest.mark.parametrize("name, value", [
    ("x-max-length", -1), ("x-max-length", "10"), ("x-max-length-bytes", -1), ("x-max-length-bytes", 1.5),
    ("x-overflow", "drop-tail"), ("x-overflow", 1), ("x-delivery-limit", -1), ("x-delivery-limit", "3"),
])
def test_invalid_limits_are_refused_naming_the_argument(broker, name, value):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed) as raised:
        channel.queue_declare("q", arguments={name: value})
    assert raised.value.reply_code == 406
    assert name in raised.value.text
    assert "q" not in broker.vhost("/").queues


# -- x-delivery-count


def delivery_count(message):
    return message.headers.get("x-delivery-count")


def test_each_redelivery_says_how_often_the_message_was_returned(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"m")
    seen = []
    for _ in range(4):
        tag, redelivered, message, _left = channel.basic_get("q")
        seen.append((redelivered, delivery_count(message)))
        channel.basic_nack(tag, requeue=True)
    assert seen == [(False, None), (True, 1), (True, 2), (True, 3)]


def test_delivery_count_counts_returns_by_reject_close_and_recover(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"m")
    channel.basic_consume("q")
    clock.advance(0)
    channel.basic_reject(peer.deliveries[-1][1], requeue=True)
    channel.basic_recover(requeue=True)
    channel.connection.close_channel(channel.id)
    other, other_peer = open_channel(broker)
    other.basic_consume("q")
    clock.advance(0)
    assert [delivery_count(message) for *_, message in peer.deliveries + other_peer.deliveries] == [None, 1, 2, 3]


def test_the_delivery_count_header_joins_the_users_headers(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    props = properties()
    props.headers.fields.add(name="app").value.string_value = "kept"
    channel.basic_publish("", "q", props, b"m")
    channel.basic_nack(channel.basic_get("q")[0], requeue=True)
    message = channel.basic_get("q")[2]
    assert message.headers == {"app": "kept", "x-delivery-count": 1}


def test_quorum_deliveries_count_from_zero_with_each_message_keeping_its_own_headers(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    shared = properties()
    shared.headers.fields.add(name="app").value.string_value = "shared"
    own = properties()
    own.headers.fields.add(name="app").value.string_value = "own"
    own.headers.fields.add(name="x-delivery-count").value.integer_value = 7  # the broker's count replaces it
    for props, body in ((shared, b"s1"), (own, b"o1"), (shared, b"s2"), (properties(), b"plain")):
        channel.basic_publish("", "q", props, body)
    first = [channel.basic_get("q") for _ in range(4)]
    assert [(message.body, message.headers) for _, _, message, _ in first] == [
        (b"s1", {"app": "shared", "x-delivery-count": 0}),
        (b"o1", {"app": "own", "x-delivery-count": 0}),
        (b"s2", {"app": "shared", "x-delivery-count": 0}),
        (b"plain", {"x-delivery-count": 0}),
    ]
    for tag, *_ in first[:2]:
        channel.basic_nack(tag, requeue=True)
    again = [channel.basic_get("q")[2] for _ in range(2)]
    assert [(message.body, message.headers) for message in again] == [
        (b"s1", {"app": "shared", "x-delivery-count": 1}),
        (b"o1", {"app": "own", "x-delivery-count": 1}),
    ]


# -- x-delivery-limit


def return_once(channel, how, clock):
    """Take the head of "q" and give it back by C{how}; returns the message taken, or None."""
    if how == "close":
        other, peer = open_channel(channel.connection.broker, channel_id=9)
        other.basic_qos(1)
        other.basic_consume("q")
        clock.advance(0)
        other.connection.close_channel(9)
        return peer.deliveries[0][3] if peer.deliveries else None
    result = channel.basic_get("q")
    if result is None:
        return None
    tag, _, message, _ = result
    if how == "nack":
        channel.basic_nack(tag, requeue=True)
    else:
        channel.basic_reject(tag, requeue=True)
    return message


@pytest.mark.parametrize("how", ["nack", "reject", "close"])
def test_after_more_returns_than_the_limit_the_message_is_dead_lettered(broker, clock, how):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-delivery-limit": 2})
    publish(channel, "q", b"poison", b"fine")
    counts = [delivery_count(return_once(channel, how, clock)) for _ in range(3)]
    assert counts == [None, 1, 2]
    assert ready(broker, "q") == 1
    assert dead(channel) == [(b"poison", "delivery_limit")]
    assert drain(channel, "q") == [b"fine"]


@pytest.mark.parametrize("how", ["nack", "reject", "close"])
def test_without_a_dead_letter_exchange_the_message_is_dropped(broker, clock, how):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-delivery-limit": 1})
    publish(channel, "q", b"poison")
    assert return_once(channel, how, clock).body == b"poison"
    assert ready(broker, "q") == 1
    assert return_once(channel, how, clock).body == b"poison"
    assert ready(broker, "q") == 0
    assert return_once(channel, how, clock) is None


def test_recover_without_requeue_counts_as_a_return_and_obeys_the_limit(broker, clock):
    channel, peer = open_channel(broker)
    with_dead_letters(channel, **{"x-delivery-limit": 1})
    publish(channel, "q", b"m")
    channel.basic_consume("q")
    clock.advance(0)
    channel.basic_recover(requeue=False)
    channel.basic_recover(requeue=False)
    assert [delivery_count(message) for *_, message in peer.deliveries] == [None, 1]
    assert dead(channel) == [(b"m", "delivery_limit")]


def test_delivery_limit_zero_allows_no_return(broker):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-delivery-limit": 0})
    publish(channel, "q", b"m")
    channel.basic_nack(channel.basic_get("q")[0], requeue=True)
    assert ready(broker, "q") == 0
    assert dead(channel) == [(b"m", "delivery_limit")]


def test_acking_within_the_limit_is_a_normal_ack(broker):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-delivery-limit": 1})
    publish(channel, "q", b"m")
    channel.basic_nack(channel.basic_get("q")[0], requeue=True)
    channel.basic_ack(channel.basic_get("q")[0])
    assert (ready(broker, "q"), ready(broker, "dead")) == (0, 0)


def test_nack_multiple_returns_each_message_once(broker):
    channel, _ = open_channel(broker)
    with_dead_letters(channel, **{"x-delivery-limit": 1})
    publish(channel, "q", b"1", b"2")
    tags = [channel.basic_get("q")[0] for _ in range(2)]
    channel.basic_nack(tags[-1], multiple=True, requeue=True)
    got = [channel.basic_get("q") for _ in range(2)]
    assert [delivery_count(message) for _, _, message, _ in got] == [1, 1]
    channel.basic_nack(got[-1][0], multiple=True, requeue=True)
    assert ready(broker, "q") == 0
    assert dead(channel) == [(b"1", "delivery_limit"), (b"2", "delivery_limit")]
