"""Channel lifecycle and publishing: cancel, close, purge, queue delete, flow, tags, exclusivity, returns, the store."""

import pytest

from brokerd.errors import AccessRefused, NotAllowed, NotFound
from tests.support.broker import make_broker, open_channel, properties, publish, ready


def delivered(peer):
    """(consumer tag, body, redelivered) of each delivery."""
    return [(consumer, message.body, redelivered) for consumer, _, redelivered, message in peer.deliveries]


# -- cancel


def test_cancel_stops_deliveries_and_leaves_unacked_messages_unacked(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q", "c")
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    channel.basic_cancel("c")
    publish(channel, "q", b"3")
    assert [body for _, body, _ in delivered(peer)] == [b"1", b"2"]
    assert channel.unacked_count == 2
    assert ready(broker, "q") == 1
    channel.basic_ack(peer.deliveries[0][1])
    channel.basic_nack(peer.deliveries[1][1], requeue=True)
    assert channel.unacked_count == 0
    assert ready(broker, "q") == 2


def test_cancel_of_an_unknown_tag_is_ignored(broker):
    channel, _ = open_channel(broker)
    channel.basic_cancel("never-was")


# -- purge


def test_purge_drops_ready_messages_only(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(1)
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"1", b"2", b"3")
    assert channel.queue_purge("q") == 2
    assert ready(broker, "q") == 0
    channel.basic_cancel(peer.deliveries[0][0])
    channel.basic_nack(peer.deliveries[0][1], requeue=True)
    assert ready(broker, "q") == 1


def test_purge_keeps_unacked_persistent_messages_in_the_store(broker, clock):
    channel, _ = open_channel(broker)
    store = broker.store
    channel.queue_declare("q", durable=True)
    channel.basic_qos(1)
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"delivered", b"ready", persistent=True)
    assert channel.queue_purge("q") == 1
    assert store.stats()["messages"] == 1, "purge dropped the un-acked message from the store"
    recovered, _ = make_broker(store)
    recovered.recover()
    assert recovered.vhost("/").queues["q"].message_count == 1


# -- closing


def test_closing_a_channel_requeues_its_unacked_messages_to_other_consumers(broker, clock):
    closing, closing_peer = open_channel(broker)
    staying, staying_peer = open_channel(broker)
    closing.queue_declare("q")
    closing.basic_consume("q", "closing")
    clock.advance(0)
    publish(closing, "q", b"1", b"2")
    staying.basic_consume("q", "staying")
    clock.advance(0)
    assert staying_peer.deliveries == []
    closing.connection.close_channel(closing.id)
    assert delivered(staying_peer) == [("staying", b"1", True), ("staying", b"2", True)]
    publish(staying, "q", b"3")
    assert len(closing_peer.deliveries) == 2, "a closed channel's consumer still got messages"


def test_closing_a_connection_requeues_its_unacked_messages_to_other_consumers(broker, clock):
    closing, _ = open_channel(broker)
    second_channel, _ = open_channel(broker, channel_id=2, connection=closing.connection)
    staying, staying_peer = open_channel(broker)
    closing.queue_declare("q1")
    closing.queue_declare("q2")
    closing.basic_consume("q1")
    second_channel.basic_consume("q2")
    clock.advance(0)
    publish(closing, "q1", b"a")
    publish(closing, "q2", b"b")
    staying.basic_consume("q1", "s1")
    staying.basic_consume("q2", "s2")
    clock.advance(0)
    closing.connection.close()
    assert sorted(delivered(staying_peer)) == [("s1", b"a", True), ("s2", b"b", True)]


def test_closing_a_channel_without_other_consumers_leaves_messages_ready(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q")
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    channel.basic_get("q")
    channel.connection.close_channel(channel.id)
    got = open_channel(broker)[0].basic_get("q")
    assert (got[2].body, got[1], got[3]) == (b"1", True, 1)


# -- queue deletion


def test_deleting_a_queue_cancels_its_consumers(broker, clock):
    channel, peer = open_channel(broker)
    other, other_peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q", "mine")
    other.basic_consume("q", "theirs")
    clock.advance(0)
    publish(channel, "q", b"1")
    channel.queue_delete("q")
    assert "mine" not in channel.consumers and "theirs" not in other.consumers
    assert peer.cancelled == [], "told before queue.delete-ok could go out (RabbitMQ sends delete-ok first)"
    clock.advance(0)
    assert peer.cancelled == ["mine"]
    assert other_peer.cancelled == ["theirs"]
    channel.basic_ack(peer.deliveries[0][1])  # a late ack of the deleted queue's message is fine
    channel.basic_consume(channel.queue_declare("q")[0], "mine")  # the tag is free again


# -- flow


def test_flow_pauses_and_resumes_deliveries(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q")
    clock.advance(0)
    assert channel.flow(False) is False
    publish(channel, "q", b"1", b"2")
    clock.advance(0)
    assert peer.deliveries == []
    assert ready(broker, "q") == 2
    assert channel.flow(True) is True
    assert peer.bodies() == [b"1", b"2"]


def test_flow_pause_leaves_other_channels_served(broker, clock):
    paused, paused_peer = open_channel(broker)
    active, active_peer = open_channel(broker)
    paused.queue_declare("q")
    paused.basic_consume("q")
    active.basic_consume("q")
    clock.advance(0)
    paused.flow(False)
    publish(paused, "q", b"1", b"2")
    assert paused_peer.deliveries == []
    assert active_peer.bodies() == [b"1", b"2"]


# -- consumer tags and exclusive consumers


def test_reusing_a_consumer_tag_on_a_channel_is_not_allowed(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q1")
    channel.queue_declare("q2")
    channel.basic_consume("q1", "tag")
    with pytest.raises(NotAllowed) as caught:
        channel.basic_consume("q2", "tag")
    assert caught.value.reply_code == 530
    assert "'tag'" in caught.value.text
    open_channel(broker, channel_id=2, connection=channel.connection)[0].basic_consume("q2", "tag")
    channel.basic_cancel("tag")
    channel.basic_consume("q2", "tag")


def test_server_picked_consumer_tags_are_unique(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    tags = {channel.basic_consume("q") for _ in range(50)}
    assert len(tags) == 50 and all(tag.startswith("amq.ctag-") for tag in tags)


def test_exclusive_consumer_keeps_others_out(broker):
    channel, _ = open_channel(broker)
    other, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q", "only", exclusive=True)
    for attempt in (lambda: other.basic_consume("q"), lambda: other.basic_consume("q", exclusive=True)):
        with pytest.raises(AccessRefused) as caught:
            attempt()
        assert caught.value.reply_code == 403
        assert "'q'" in caught.value.text and "exclusive" in caught.value.text
    channel.basic_cancel("only")
    other.basic_consume("q")


def test_exclusive_consumer_cannot_join_a_queue_with_consumers(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q", "first")
    with pytest.raises(AccessRefused) as caught:
        channel.basic_consume("q", "exclusive", exclusive=True)
    assert caught.value.reply_code == 403 and "'q'" in caught.value.text
    assert "exclusive" not in channel.consumers
    channel.basic_consume("q", "second")


# -- the empty queue name


SHORTCUT_USES = {
    "passive-declare": lambda channel: channel.queue_declare("", passive=True),
    "bind": lambda channel: channel.queue_bind("", "amq.fanout"),
    "unbind": lambda channel: channel.queue_unbind("", "amq.fanout"),
    "consume": lambda channel: channel.basic_consume(""),
    "get": lambda channel: channel.basic_get(""),
    "purge": lambda channel: channel.queue_purge(""),
    "delete": lambda channel: channel.queue_delete(""),
}


@pytest.mark.parametrize("use", SHORTCUT_USES.values(), ids=SHORTCUT_USES.keys())
def test_empty_queue_name_before_any_declare_is_not_found(broker, use):
    channel, _ = open_channel(broker)
    with pytest.raises(NotFound) as caught:
        use(channel)
    assert caught.value.reply_code == 404
    assert "previously declared" in caught.value.text


def test_empty_queue_name_means_the_last_queue_declared_on_the_channel(broker, clock):
    channel, peer = open_channel(broker)
    other_channel, _ = open_channel(broker, channel_id=2, connection=channel.connection)
    channel.queue_declare("first")
    name, _, _ = channel.queue_declare("")
    other_channel.queue_declare("elsewhere")  # another channel's declares do not count
    channel.queue_bind("", "amq.fanout")
    channel.basic_publish("amq.fanout", "", properties(), b"fanned")
    assert channel.queue_declare("", passive=True) == (name, 1, 0)
    assert channel.basic_get("")[2].body == b"fanned"
    channel.basic_consume("", "c")
    clock.advance(0)
    channel.basic_publish("amq.fanout", "", properties(), b"again")
    assert delivered(peer) == [("c", b"again", False)]
    channel.basic_cancel("c")
    channel.queue_unbind("", "amq.fanout")
    channel.basic_publish("amq.fanout", "", properties(), b"lost")
    assert channel.queue_purge("") == 0
    assert channel.queue_delete("") == 0
    assert name not in broker.vhost("/").queues and "first" in broker.vhost("/").queues


# -- publishing


def test_mandatory_unroutable_message_is_returned_with_no_route(broker):
    channel, peer = open_channel(broker)
    channel.basic_publish("amq.direct", "nobody", properties(message_id="m-1"), b"body", mandatory=True)
    assert len(peer.returns) == 1
    reply_code, reply_text, message = peer.returns[0]
    assert (reply_code, reply_text) == (312, "NO_ROUTE")
    assert (message.exchange, message.routing_key, message.body) == ("amq.direct", "nobody", b"body")
    assert message.properties.message_id == "m-1"


def test_unroutable_message_without_mandatory_is_dropped_silently(broker):
    channel, peer = open_channel(broker)
    channel.basic_publish("amq.direct", "nobody", properties(), b"body")
    assert peer.returns == []


def test_routable_mandatory_message_is_not_returned(broker):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_publish("", "q", properties(), b"body", mandatory=True)
    assert peer.returns == [] and ready(broker, "q") == 1


def test_publish_to_a_missing_exchange_is_not_found(broker):
    channel, _ = open_channel(broker)
    with pytest.raises(NotFound) as caught:
        channel.basic_publish("nowhere", "k", properties(), b"body")
    assert caught.value.reply_code == 404 and "'nowhere'" in caught.value.text


def test_publish_to_an_internal_exchange_is_refused(broker):
    channel, _ = open_channel(broker)
    channel.exchange_declare("inner", "fanout", internal=True)
    channel.queue_declare("q")
    channel.queue_bind("q", "inner")
    with pytest.raises(AccessRefused) as caught:
        channel.basic_publish("inner", "", properties(), b"body")
    assert caught.value.reply_code == 403 and "'inner'" in caught.value.text
    assert ready(broker, "q") == 0


def test_persistent_message_to_durable_queue_is_stored_until_acked(broker):
    channel, _ = open_channel(broker)
    store = broker.store
    channel.queue_declare("q", durable=True)
    publish(channel, "q", b"1", b"2", persistent=True)
    assert store.stats()["messages"] == 2
    tag = channel.basic_get("q")[0]
    assert store.stats()["messages"] == 2, "delivery is not acknowledgement"
    channel.basic_ack(tag)
    assert store.stats()["messages"] == 1
    tag = channel.basic_get("q")[0]
    channel.basic_reject(tag, requeue=False)
    assert store.stats()["messages"] == 0


def test_no_ack_delivery_of_a_persistent_message_releases_it_in_the_store(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True)
    channel.basic_consume("q", no_ack=True)
    clock.advance(0)
    publish(channel, "q", b"1", persistent=True)
    assert broker.store.stats()["messages"] == 0


def test_only_persistent_messages_to_durable_queues_are_stored(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("durable", durable=True)
    channel.queue_declare("transient")
    publish(channel, "durable", b"transient message")
    publish(channel, "transient", b"persistent message", persistent=True)
    assert broker.store.stats()["messages"] == 0
    channel.queue_bind("durable", "amq.fanout")
    channel.queue_bind("transient", "amq.fanout")
    channel.basic_publish("amq.fanout", "", properties(persistent=True), b"both")
    assert broker.store.stats()["messages"] == 1
    assert broker.store.stats()["appends"] == 1


def test_requeued_persistent_message_stays_in_the_store(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True)
    publish(channel, "q", b"1", persistent=True)
    channel.basic_nack(channel.basic_get("q")[0], requeue=True)
    channel.basic_recover(requeue=True)
    assert broker.store.stats()["messages"] == 1
    assert ready(broker, "q") == 1


def test_message_stored_for_two_durable_queues_stays_until_both_ack(broker):
    channel, _ = open_channel(broker)
    for name in ("q1", "q2"):
        channel.queue_declare(name, durable=True)
        channel.queue_bind(name, "amq.fanout")
    channel.basic_publish("amq.fanout", "", properties(persistent=True), b"shared")
    assert broker.store.stats()["appends"] == 1
    channel.basic_ack(channel.basic_get("q1")[0])
    assert broker.store.stats()["messages"] == 1
    channel.basic_ack(channel.basic_get("q2")[0])
    assert broker.store.stats()["messages"] == 0
