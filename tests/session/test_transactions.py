"""A channel's transactions: what tx mode keeps for commit, in order, the bytes it holds meanwhile,
and how tx and confirm modes exclude each other."""

import pytest

from brokerd.errors import PreconditionFailed
from tests.support.broker import HandSyncedStore, make_broker, open_channel, publish, ready


def transactional(broker, clock, queue="q"):
    """A channel in tx mode consuming C{queue} (tag "c"), and its peer."""
    channel, peer = open_channel(broker)
    channel.queue_declare(queue)
    channel.basic_consume(queue, "c")
    clock.advance(0)
    channel.tx_select()
    return channel, peer


def bodies(peer):
    return [message.body for _, _, _, message in peer.deliveries]


def test_publishes_wait_for_commit_and_hold_their_bytes_meanwhile(broker, clock):
    channel, peer = transactional(broker, clock)
    watermark = broker.vhost("/").watermark
    publish(channel, "q", b"12345", b"678")
    assert peer.deliveries == [] and channel.messages_published == 0
    assert channel.transaction_bytes == 8 and watermark.queued_bytes == 8
    assert channel.connection.held_bytes() == 8
    channel.tx_commit()
    assert bodies(peer) == [b"12345", b"678"] and channel.messages_published == 2
    assert channel.transaction_bytes == 0
    assert watermark.queued_bytes == 8  # the queue's, now: the deliveries are un-acked


def test_commit_applies_publishes_and_settlements_in_the_order_they_came(broker, clock):
    channel, peer = transactional(broker, clock)
    publish(channel, "q", b"first")
    channel.tx_commit()
    channel.basic_reject(1, requeue=True)
    publish(channel, "q", b"second")
    assert ready(broker, "q") == 0 and channel.unacked_count == 1
    channel.tx_commit()  # the reject first: "first" goes back ahead of "second"
    assert bodies(peer) == [b"first", b"first", b"second"]
    assert [redelivered for _, _, redelivered, _ in peer.deliveries] == [False, True, False]


def test_rollback_drops_publishes_and_settlements_and_the_deliveries_stay_unacked(broker, clock):
    channel, peer = transactional(broker, clock)
    publish(channel, "q", b"kept")
    channel.tx_commit()
    publish(channel, "q", b"dropped")
    channel.basic_ack(1)
    channel.tx_rollback()
    assert channel.transaction_bytes == 0 and broker.vhost("/").watermark.queued_bytes == 4
    channel.tx_commit()  # a new, empty transaction
    assert bodies(peer) == [b"kept"] and list(channel.unacked_deliveries) == [1]
    assert channel.messages_acked == 0


def test_an_unknown_tag_is_refused_when_settled_not_at_commit(broker, clock):
    channel, _ = transactional(broker, clock)
    publish(channel, "q", b"m")
    channel.tx_commit()
    for settle in (lambda: channel.basic_ack(2), lambda: channel.basic_nack(2), lambda: channel.basic_reject(2)):
        with pytest.raises(PreconditionFailed, match="unknown delivery tag 2"):
            settle()
    channel.basic_ack(0, multiple=True)  # 0 with multiple names every un-acked delivery
    channel.tx_commit()
    assert channel.unacked_count == 0 and channel.messages_acked == 1


def test_a_settlement_failing_at_commit_drops_what_came_after_it(broker, clock):
    channel, peer = transactional(broker, clock)
    publish(channel, "q", b"m")
    channel.tx_commit()
    channel.basic_ack(1)
    channel.basic_ack(1)  # known now; settled already when its turn comes
    publish(channel, "q", b"never")
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 1"):
        channel.tx_commit()
    assert channel.transaction_bytes == 0 and broker.vhost("/").watermark.queued_bytes == 0
    channel.tx_commit()  # the transaction after it begins empty
    assert bodies(peer) == [b"m"] and channel.messages_acked == 1


def test_closing_the_channel_rolls_back_and_gives_its_bytes_back(broker, clock):
    channel, _ = transactional(broker, clock)
    publish(channel, "q", b"uncommitted")
    channel.connection.close_channel(channel.id)
    assert broker.vhost("/").watermark.queued_bytes == 0 and ready(broker, "q") == 0
    assert channel.transaction_bytes == 0


def test_tx_and_confirm_modes_exclude_each_other(broker):
    transactional_channel, _ = open_channel(broker)
    transactional_channel.tx_select()
    transactional_channel.tx_select()  # again: nothing changes
    with pytest.raises(PreconditionFailed, match="cannot switch from tx to confirm mode"):
        transactional_channel.confirm_select()
    confirming, _ = open_channel(broker, 2, transactional_channel.connection)
    confirming.confirm_select()
    with pytest.raises(PreconditionFailed, match="cannot switch from confirm to tx mode"):
        confirming.tx_select()


@pytest.mark.parametrize("end", ["tx_commit", "tx_rollback"])
def test_commit_and_rollback_need_tx_mode(broker, end):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed, match="channel is not transactional"):
        getattr(channel, end)()


def test_a_commit_that_stored_messages_is_answered_once_the_store_made_them_safe():
    store = HandSyncedStore()
    broker, clock = make_broker(store)
    channel, _ = open_channel(broker)
    channel.queue_declare("durable", durable=True)
    channel.tx_select()
    publish(channel, "durable", b"kept", persistent=True)
    committed = channel.tx_commit()
    assert ready(broker, "durable") == 1 and not committed.called
    [synced] = store.syncs
    synced.callback(None)
    assert committed.called and committed.result is None


def test_a_commit_that_stored_nothing_is_answered_at_once(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("durable", durable=True)
    channel.tx_select()
    publish(channel, "durable", b"transient")
    assert channel.tx_commit().result is None


def test_a_commit_with_a_publish_a_full_queue_refused_fails_as_rabbitmq_says_and_keeps_the_rest():
    broker, clock = make_broker(HandSyncedStore())
    channel, _ = open_channel(broker)
    channel.queue_declare("durable", durable=True,
                          arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.tx_select()
    publish(channel, "durable", b"kept", b"refused", persistent=True)
    failures = []
    channel.tx_commit().addErrback(failures.append)
    [failure] = failures
    assert failure.check(PreconditionFailed)
    assert failure.value.reply_text == "PRECONDITION_FAILED - partial tx completion"
    assert ready(broker, "durable") == 1
