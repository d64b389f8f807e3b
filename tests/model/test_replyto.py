"""Direct reply-to in the protocol-free channel: replies held while their consumer cannot take
them (channel.flow, a slow reader) and within a limit, virtual hosts kept apart, transactions
and confirms, and reply names of any shape."""

import pytest

from brokerd.errors import NotFound, PreconditionFailed
from brokerd.model.replyto import HELD_REPLY_BYTES, REPLY_PREFIX, REPLY_QUEUE
from brokerd.session.connection import Connection
from tests.support.broker import make_broker, open_channel, properties


@pytest.fixture
def broker():
    return make_broker()[0]


def requester(broker, connection=None):
    """A channel with a reply consumer; returns (channel, peer, consumer tag, its reply name)."""
    channel, peer = open_channel(broker, connection=connection)
    tag = channel.basic_consume(REPLY_QUEUE, no_ack=True)
    channel.queue_declare("requests")
    channel.basic_publish("", "requests", properties(reply_to=REPLY_QUEUE), b"?")
    _, _, request, _ = channel.basic_get("requests", no_ack=True)
    return channel, peer, tag, request.properties.reply_to


def reply(channel, name, body, **options):
    channel.basic_publish("", name, properties(), body, **options)


def test_replies_wait_while_the_channel_flow_is_off_and_come_in_order(broker):
    channel, peer, tag, name = requester(broker)
    server, _ = open_channel(broker)
    channel.flow(False)
    for body in (b"1", b"2"):
        reply(server, name, body)
    assert peer.deliveries == []
    channel.flow(True)
    reply(server, name, b"3")
    assert [(consumer, redelivered, message.body) for consumer, _, redelivered, message in peer.deliveries] == [
        (tag, False, b"1"), (tag, False, b"2"), (tag, False, b"3")]
    assert len({delivery_tag for _, delivery_tag, _, _ in peer.deliveries}) == 3
    assert channel.unacked_count == 0


def test_replies_wait_for_a_slow_reader_up_to_a_limit(broker):
    channel, peer, tag, name = requester(broker)
    server, _ = open_channel(broker)
    channel.connection.pause_deliveries()
    big = b"x" * (HELD_REPLY_BYTES // 2 + 1)
    for body in (big, big, b"small"):  # the second would pass the limit: dropped
        reply(server, name, body)
    assert peer.deliveries == []
    assert broker.watermark.queued_bytes == len(big) + len(b"small")  # held replies count as memory in use
    channel.connection.resume_deliveries()
    assert [len(message.body) for _, _, _, message in peer.deliveries] == [len(big), len(b"small")]
    assert broker.watermark.queued_bytes == 0


def test_replies_held_for_a_channel_are_released_when_it_closes(broker):
    channel, peer, tag, name = requester(broker)
    server, _ = open_channel(broker)
    channel.flow(False)
    reply(server, name, b"held")
    assert broker.watermark.queued_bytes == len(b"held")
    channel.connection.close_channel(channel.id)
    assert broker.watermark.queued_bytes == 0
    reply(server, name, b"after")
    assert peer.deliveries == []


def test_a_reply_name_works_only_in_its_virtual_host(broker):
    channel, peer, tag, name = requester(broker)
    broker.add_vhost("other")
    stranger, _ = open_channel(broker, connection=Connection(broker, "other"))
    reply(stranger, name, b"from elsewhere")
    with pytest.raises(NotFound):
        stranger.queue_declare(name, passive=True)
    assert peer.deliveries == []


def test_a_reply_in_a_transaction_goes_at_commit_and_a_request_is_addressed_at_publish(broker):
    channel, peer, tag, name = requester(broker)
    server, _ = open_channel(broker)
    server.tx_select()
    reply(server, name, b"committed")
    assert peer.deliveries == []
    server.tx_commit()
    assert [message.body for _, _, _, message in peer.deliveries] == [b"committed"]
    other, _ = open_channel(broker)
    other.tx_select()
    with pytest.raises(PreconditionFailed, match="fast reply consumer does not exist"):
        other.basic_publish("", "requests", properties(reply_to=REPLY_QUEUE), b"?")


def test_replies_are_confirmed_at_once_and_returned_to_a_mandatory_publisher(broker):
    channel, peer, tag, name = requester(broker)
    server, server_peer = open_channel(broker)
    server.confirm_select()
    reply(server, name, b"plain")
    reply(server, name, b"mandatory", mandatory=True)
    broker.clock.advance(0)
    assert server_peer.confirms == [(2, True, True)]  # both acked at once, in one frame
    assert [(code, text, message.body) for code, text, message in server_peer.returns] == [
        (312, "NO_ROUTE", b"mandatory")]
    assert [message.body for _, _, _, message in peer.deliveries] == [b"plain", b"mandatory"]


@pytest.mark.parametrize("suffix", ["", ".", "x", "\x00", "\u00e9" * 100, "a" * 209])
def test_reply_names_of_any_shape_name_no_consumer(broker, suffix):
    channel, peer, tag, name = requester(broker)
    server, server_peer = open_channel(broker)
    for routing_key in (name + suffix, REPLY_PREFIX + suffix):
        if routing_key == name:
            continue
        reply(server, routing_key, b"nobody", mandatory=True)
        with pytest.raises(NotFound):
            server.queue_declare(routing_key, passive=True)
        server, server_peer = open_channel(broker)
    assert peer.deliveries == []
