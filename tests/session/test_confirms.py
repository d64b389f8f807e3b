"""Publisher confirms: numbering, per-turn batching, waiting for store syncs, order, nacks and close."""

import pytest

from tests.support.broker import HandSyncedStore, make_broker, open_channel, properties


@pytest.fixture
def hand_synced():
    """(store, clock, confirm-mode channel, peer) with a durable queue "durable" and a transient "transient"."""
    store = HandSyncedStore()
    broker, clock = make_broker(store)
    channel, peer = open_channel(broker)
    channel.queue_declare("durable", durable=True)
    channel.queue_declare("transient")
    channel.confirm_select()
    return store, clock, channel, peer


def publish(channel, queue, persistent=False, exchange=""):
    channel.basic_publish(exchange, queue, properties(persistent), b"body")


def test_single_publish_is_confirmed_at_the_end_of_the_turn():
    broker, clock = make_broker()
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.confirm_select()
    publish(channel, "q")
    assert peer.confirms == []
    clock.advance(0)
    assert peer.confirms == [(1, False, True)]


def test_publishes_of_one_turn_are_confirmed_by_one_multiple_ack():
    broker, clock = make_broker()
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.confirm_select()
    for _ in range(5):
        publish(channel, "q")
    clock.advance(0)
    assert peer.confirms == [(5, True, True)]
    publish(channel, "q")
    clock.advance(0)
    assert peer.confirms == [(5, True, True), (6, False, True)]


def test_numbering_starts_at_one_on_select_and_select_again_changes_nothing():
    broker, clock = make_broker()
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q")  # before confirm mode: not numbered
    clock.advance(0)
    assert peer.confirms == []
    channel.confirm_select()
    publish(channel, "q")
    publish(channel, "q")
    channel.confirm_select()
    publish(channel, "q")
    clock.advance(0)
    assert peer.confirms == [(3, True, True)]


def test_each_channel_numbers_its_own_publishes():
    broker, clock = make_broker()
    first, first_peer = open_channel(broker)
    second, second_peer = open_channel(broker, channel_id=2, connection=first.connection)
    first.queue_declare("q")
    first.confirm_select()
    second.confirm_select()
    publish(first, "q")
    publish(second, "q")
    publish(second, "q")
    clock.advance(0)
    assert first_peer.confirms == [(1, False, True)]
    assert second_peer.confirms == [(2, True, True)]


def test_persistent_message_to_a_memory_store_is_confirmed_in_the_same_turn():
    broker, clock = make_broker()
    channel, peer = open_channel(broker)
    channel.queue_declare("q", durable=True)
    channel.confirm_select()
    publish(channel, "q", persistent=True)
    clock.advance(0)
    assert peer.confirms == [(1, False, True)]


def test_unroutable_messages_are_confirmed_and_mandatory_ones_returned_first(hand_synced):
    store, clock, channel, peer = hand_synced
    channel.basic_publish("amq.direct", "nobody", properties(persistent=True), b"m", mandatory=True)
    channel.basic_publish("amq.direct", "nobody", properties(), b"m")
    assert [code for code, _, _ in peer.returns] == [312]
    assert peer.confirms == []
    clock.advance(0)
    assert peer.confirms == [(2, True, True)]
    assert store.syncs == []


@pytest.mark.parametrize(
    "queue, persistent", [("transient", True), ("transient", False), ("durable", False)], ids=str
)
def test_messages_the_store_does_not_hold_are_confirmed_without_a_sync(hand_synced, queue, persistent):
    store, clock, channel, peer = hand_synced
    publish(channel, queue, persistent)
    clock.advance(0)
    assert peer.confirms == [(1, False, True)]
    assert store.syncs == []


def test_persistent_message_to_durable_queue_waits_for_the_sync(hand_synced):
    store, clock, channel, peer = hand_synced
    publish(channel, "durable", persistent=True)
    clock.advance(0)
    assert peer.confirms == []
    assert len(store.syncs) == 1
    store.syncs[0].callback(None)
    assert peer.confirms == [(1, False, True)]


def test_persistent_message_to_durable_and_transient_queues_waits_for_the_sync(hand_synced):
    store, clock, channel, peer = hand_synced
    channel.queue_bind("durable", "amq.fanout")
    channel.queue_bind("transient", "amq.fanout")
    publish(channel, "", persistent=True, exchange="amq.fanout")
    clock.advance(0)
    assert peer.confirms == []
    store.syncs[0].callback(None)
    assert peer.confirms == [(1, False, True)]


def test_one_sync_covers_every_persistent_publish_of_a_turn(hand_synced):
    store, clock, channel, peer = hand_synced
    for _ in range(3):
        publish(channel, "durable", persistent=True)
    clock.advance(0)
    assert len(store.syncs) == 1
    store.syncs[0].callback(None)
    assert peer.confirms == [(3, True, True)]


def test_transient_publish_after_a_pending_persistent_one_waits_for_it(hand_synced):
    store, clock, channel, peer = hand_synced
    publish(channel, "durable", persistent=True)
    publish(channel, "transient")
    clock.advance(0)
    publish(channel, "transient")  # a later turn
    clock.advance(0)
    assert peer.confirms == []
    store.syncs[0].callback(None)
    assert peer.confirms == [(3, True, True)]


def test_confirms_already_sent_are_not_repeated(hand_synced):
    store, clock, channel, peer = hand_synced
    publish(channel, "transient")
    clock.advance(0)
    publish(channel, "durable", persistent=True)
    publish(channel, "transient")
    clock.advance(0)
    assert peer.confirms == [(1, False, True)]
    store.syncs[0].callback(None)
    assert peer.confirms == [(1, False, True), (3, True, True)]


def test_confirms_go_out_in_sequence_order_whatever_order_syncs_finish(hand_synced):
    store, clock, channel, peer = hand_synced
    publish(channel, "durable", persistent=True)
    clock.advance(0)
    publish(channel, "durable", persistent=True)
    clock.advance(0)
    first_sync, second_sync = store.syncs
    second_sync.callback(None)
    assert peer.confirms == []
    first_sync.callback(None)
    assert peer.confirms == [(2, True, True)]


def test_failing_sync_nacks_what_it_covered(hand_synced):
    store, clock, channel, peer = hand_synced
    publish(channel, "transient")
    publish(channel, "durable", persistent=True)
    publish(channel, "durable", persistent=True)
    publish(channel, "transient")
    clock.advance(0)
    assert peer.confirms == [(1, False, True)]
    store.syncs[0].errback(OSError("disk full"))
    assert peer.confirms == [(1, False, True), (2, False, False), (3, False, False), (4, False, True)]


def test_failing_sync_nacks_only_its_own_publishes(hand_synced):
    store, clock, channel, peer = hand_synced
    publish(channel, "durable", persistent=True)
    clock.advance(0)
    publish(channel, "durable", persistent=True)
    clock.advance(0)
    store.syncs[1].callback(None)
    store.syncs[0].errback(OSError("disk full"))
    assert peer.confirms == [(1, False, False), (2, False, True)]


def test_closing_the_channel_discards_pending_confirms(hand_synced):
    store, clock, channel, peer = hand_synced
    publish(channel, "durable", persistent=True)
    clock.advance(0)
    publish(channel, "transient")
    channel.connection.close_channel(channel.id)
    clock.advance(0)
    store.syncs[0].callback(None)
    clock.advance(0)
    assert peer.confirms == []


def test_closing_the_channel_before_the_turn_ends_sends_nothing():
    broker, clock = make_broker()
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.confirm_select()
    publish(channel, "q")
    channel.connection.close()
    clock.advance(0)
    assert peer.confirms == []
