"""pika against a real broker: RabbitMQ's direct reply-to (the pseudo-queue
``amq.rabbitmq.reply-to``), as in pika's RPC tutorial, with RabbitMQ 3.10's replies:
the requester's reply_to rewritten to a name for its channel, replies delivered
straight to it from any connection, its 406s, passive declares, and replies to a
consumer that is gone or never was."""

import pika
import pytest
from pika.exceptions import UnroutableError

from tests.support.pika_clients import closed_by_broker, collector, pump, settle

pytestmark = pytest.mark.usefixtures("watchdog")

REPLY_TO = "amq.rabbitmq.reply-to"


def serve(connection, queue):
    """An RPC server on its own channel of C{connection}: answers each request on C{queue} with its body
    reversed, to its reply_to, keeping its correlation id; returns the list of reply_to names it saw."""
    channel = connection.channel()
    channel.queue_declare(queue)
    seen = []

    def on_request(channel, method, properties, body):
        seen.append(properties.reply_to)
        channel.basic_publish("", properties.reply_to, body[::-1],
                              pika.BasicProperties(correlation_id=properties.correlation_id))
        channel.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_request)
    return seen


def reply_name(connection, channel, queue="rpc"):
    """Publishes a request with reply_to amq.rabbitmq.reply-to on C{channel} to a fresh queue and
    returns the reply_to it arrives with: the name of C{channel}'s reply consumer."""
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"?", pika.BasicProperties(reply_to=REPLY_TO))
    got = []
    pump(connection, lambda: got.append(channel.basic_get(queue, auto_ack=True)) or got[-1][0] is not None,
         "the request")
    return got[-1][1].reply_to


@pytest.fixture
def requester(connect):
    """A connection and channel consuming its direct replies; returns (connection, channel, tag, replies)."""
    connection = connect()
    channel = connection.channel()
    replies, on_reply = collector()
    tag = channel.basic_consume(REPLY_TO, on_reply, auto_ack=True)
    return connection, channel, tag, replies


def test_rpc_round_trip_through_direct_reply_to(connect, requester, name):
    server_connection = connect()
    queue = name("rpc")
    seen = serve(server_connection, queue)
    connection, channel, tag, replies = requester
    for number in range(3):
        channel.basic_publish("", queue, b"request %d" % number,
                              pika.BasicProperties(reply_to=REPLY_TO, correlation_id=str(number)))

    def answered():
        server_connection.process_data_events(time_limit=0)
        return len(replies) == 3

    pump(connection, answered, "three replies")
    assert [(body, properties.correlation_id) for _, properties, body in replies] == [
        (b"0 tseuqer", "0"), (b"1 tseuqer", "1"), (b"2 tseuqer", "2")]
    assert len(set(seen)) == 1 and seen[0].startswith(REPLY_TO + ".") and len(seen[0]) > len(REPLY_TO) + 8
    assert all((method.consumer_tag, method.redelivered, method.exchange, method.routing_key)
               == (tag, False, "", seen[0]) for method, _, _ in replies)


def test_a_reply_consumer_cannot_acknowledge(channel):
    error = closed_by_broker(channel.basic_consume, REPLY_TO, lambda *_: None, auto_ack=False)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_one_reply_consumer_per_channel(connection, channel):
    channel.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True)
    error = closed_by_broker(channel.basic_consume, REPLY_TO, lambda *_: None, auto_ack=True)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - reply consumer already set")
    other = connection.channel()  # the limit is per channel
    other.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True)


def test_reply_to_without_a_reply_consumer_closes_the_channel(connection, channel, name):
    queue = name("rpc")
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"request", pika.BasicProperties(reply_to=REPLY_TO))
    error = closed_by_broker(channel.queue_declare, queue, passive=True)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")
    assert connection.channel().queue_declare(queue, passive=True).method.message_count == 0


def test_a_cancelled_reply_consumer_gets_nothing_and_its_publishes_are_refused(connect, requester, name):
    connection, channel, tag, replies = requester
    address = reply_name(connection, channel, name("rpc"))
    channel.basic_cancel(tag)
    server = connect().channel()
    server.confirm_delivery()
    server.basic_publish("", address, b"too late")  # no consumer: dropped, and confirmed at once
    settle(connection)
    assert replies == []
    channel.basic_publish("", address, b"again", pika.BasicProperties(reply_to=REPLY_TO))
    error = closed_by_broker(channel.queue_declare, REPLY_TO, passive=True)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")


def test_a_new_reply_consumer_has_a_new_name(connection, name):
    channel = connection.channel()
    tag = channel.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True)
    first = reply_name(connection, channel, name("rpc"))
    channel.basic_cancel(tag)
    channel.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True)
    assert reply_name(connection, channel, name("rpc")) != first


def test_mandatory_replies_come_back_unroutable_as_from_rabbitmq(connect, requester, name):
    """RabbitMQ's default exchange routes a reply name to no queue: a mandatory reply is delivered
    and also returned (312 NO_ROUTE); one to a gone or malformed name is only returned."""
    connection, channel, tag, replies = requester
    address = reply_name(connection, channel, name("rpc"))
    server_connection = connect()
    server = server_connection.channel()
    returned = []
    server.add_on_return_callback(lambda _channel, method, _properties, body: returned.append(
        (method.reply_code, method.reply_text, method.routing_key, body)))
    server.confirm_delivery()
    targets = [address, address + "x", REPLY_TO + ".", REPLY_TO + ".not-a-token", REPLY_TO + ".\u00e9\x00" + "z" * 200]
    for target in targets:
        with pytest.raises(UnroutableError):
            server.basic_publish("", target, b"reply", mandatory=True)
    pump(connection, lambda: replies, "the live reply")
    settle(server_connection)
    assert [body for _, _, body in replies] == [b"reply"]
    assert returned == [(312, "NO_ROUTE", target, b"reply") for target in targets]
    assert server.is_open and channel.is_open


def test_passive_declares_of_reply_names(connect, requester, name):
    connection, channel, tag, replies = requester
    address = reply_name(connection, channel, name("rpc"))
    other = connect().channel()
    for queue in (REPLY_TO, address):
        declared = other.queue_declare(queue, passive=True).method
        assert (declared.queue, declared.message_count, declared.consumer_count) == (queue, 0, 1)
    channel.basic_cancel(tag)
    for queue in (address, REPLY_TO + "X", REPLY_TO + ".nothing"):
        error = closed_by_broker(connect().channel().queue_declare, queue, passive=True)
        assert (error.reply_code, error.reply_text) == (404, f"NOT_FOUND - no queue '{queue}' in vhost '/'")


def test_closing_the_channel_ends_its_reply_consumer(connect, requester, name):
    connection, channel, tag, replies = requester
    address = reply_name(connection, channel, name("rpc"))
    channel.close()
    error = closed_by_broker(connect().channel().queue_declare, address, passive=True)
    assert error.reply_code == 404


def test_a_declared_reply_to_is_the_channels_last_queue(connection):
    """As in RabbitMQ: after declaring amq.rabbitmq.reply-to, a consume of "" makes a reply consumer,
    and a purge of "" names the pseudo-queue, which holds nothing to purge."""
    channel = connection.channel()
    channel.queue_declare(REPLY_TO, passive=True)
    assert channel.basic_consume("", lambda *_: None, auto_ack=True)
    error = closed_by_broker(channel.queue_purge, "")
    assert (error.reply_code, error.reply_text) == (404, f"NOT_FOUND - no queue '{REPLY_TO}' in vhost '/'")
