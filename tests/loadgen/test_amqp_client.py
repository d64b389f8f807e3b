"""The pipelining AMQP client the benchmarks, crash tests and the validation workload drive brokers with
(L{brokerd.loadgen.amqp_client}): its decoding of deliveries cut at any read boundary, and a round trip through a
real broker of everything the workload relies on (exchanges, message-id, headers, priority, bodies spanning
several frames, multiple confirms, nack with requeue, reject, login, a broker going away)."""

import socket

import pytest
from pamqp import commands

from brokerd.loadgen.amqp_client import BrokerGone, Connection, Loop
from brokerd.loadgen.amqp_codec import (
    BASIC_DELIVER,
    CONTENT_HEAD,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    LONG_LONG,
    METHOD_INDEX,
    BenchmarkError,
    PublishFramer,
    encode_properties,
    frame,
    message_properties,
    publish_frames,
    short_string,
)
from brokerd.testing import BrokerProcess


def deliver_frames(channel, consumer_tag, delivery_tag, redelivered, properties, body, frame_max):
    """What a broker writes for one delivery: basic.deliver, the content header and body frames."""
    arguments = (short_string(consumer_tag) + LONG_LONG.pack(delivery_tag) + bytes((int(redelivered),))
                 + short_string("ex") + short_string("key"))
    pieces = [frame(FRAME_METHOD, channel, METHOD_INDEX.pack(BASIC_DELIVER) + arguments),
              frame(FRAME_HEADER, channel, CONTENT_HEAD.pack(60, 0, len(body)) + properties)]
    largest = frame_max - 8
    pieces += [frame(FRAME_BODY, channel, body[at: at + largest]) for at in range(0, len(body), largest)]
    return b"".join(pieces)


SENT = [
    # channel, consumer tag, delivery tag, redelivered, message-id, headers, body
    (1, "c-1", 1, False, "p0-000000001", None, b"short"),
    (1, "c-2", 2, True, "p0-000000002", {"x-delivery-count": 2, "colour": "red"}, bytes(range(256)) * 3),
    (2, "c-3", 1, False, None, None, b""),
    (1, "c-1", 3, False, "p1-000000000", {"n": 1}, b"x" * 300),
]
FRAME_MAX = 128  # small, so the longer bodies span several body frames


@pytest.fixture
def fake_broker():
    """A real loopback socket pair: the test writes what a broker would, a Connection reads it."""
    listener = socket.create_server(("127.0.0.1", 0))
    loop = Loop()
    connection = Connection(loop, "127.0.0.1", listener.getsockname()[1], "client-under-test")
    server, _ = listener.accept()
    listener.close()
    yield loop, connection, server
    server.close()
    connection.shut()


@pytest.mark.parametrize("chunk", [1, 7, 19, 64, 1000, 1 << 20])
def test_deliveries_cut_at_any_read_boundary_arrive_whole_and_in_order(fake_broker, chunk):
    loop, connection, server = fake_broker
    received = []
    connection.on_delivery = received.append
    stream = b"".join(
        deliver_frames(channel, tag, number, redelivered, encode_properties(2, None, identifier, headers), body,
                       FRAME_MAX)
        for channel, tag, number, redelivered, identifier, headers, body in SENT)
    for at in range(0, len(stream), chunk):
        server.sendall(stream[at: at + chunk])
        loop.turn(1.0)  # one read, of about this chunk: the frames arrive cut where the chunks end
    loop.run_until(lambda: len(received) == len(SENT), lambda: f"{len(received)} of {len(SENT)} deliveries")
    got = [(d.channel, d.consumer_tag, d.delivery_tag, d.redelivered, *message_properties(d.properties), d.body)
           for d in received]
    assert got == [(channel, tag, number, redelivered, identifier, headers or {}, body)
                   for channel, tag, number, redelivered, identifier, headers, body in SENT]


def test_a_damaged_frame_end_fails_with_a_reason(fake_broker):
    loop, connection, server = fake_broker
    connection.on_delivery = lambda delivery: None
    damaged = bytearray(deliver_frames(1, "c", 1, False, encode_properties(2), b"body", FRAME_MAX))
    damaged[-1] = 0
    server.sendall(damaged)
    with pytest.raises(BenchmarkError, match="frame end byte"):
        loop.run_until(lambda: False, lambda: "reading")


def test_a_broker_that_hangs_up_is_reported_as_gone(fake_broker):
    loop, connection, server = fake_broker
    server.close()
    with pytest.raises(BrokerGone, match="closed the connection"):
        loop.run_until(lambda: False, lambda: "reading")


@pytest.mark.parametrize("size", [0, 1, 120, 121, 500])
def test_the_framer_frames_a_publish_as_publish_frames_does(size):
    framer = PublishFramer(3, FRAME_MAX)
    properties = encode_properties(2, 1, "id", {"h": "v"})
    body = bytes(range(256))[:size] if size <= 256 else b"z" * size
    for exchange, key in [("ex", "a.b"), ("", "queue"), ("ex", "a.b")]:  # the last one from the method cache
        assert framer.frames(exchange, key, body, properties) == publish_frames(3, key, body, properties, FRAME_MAX,
                                                                                exchange)


def test_properties_cut_short_are_refused():
    encoded = encode_properties(2, 5, "an-id", {"a": 1})
    assert message_properties(encoded) == ("an-id", {"a": 1})
    with pytest.raises(BenchmarkError, match="cut short|runs past"):
        message_properties(encoded[:-3])


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(["--backend=memory", "--amqp", "tcp:0:interface=127.0.0.1", "--native", "none",
                             "--http", "none"], cwd=tmp_path_factory.mktemp("amqp-client"))
    _, port = process.wait_address("AMQP")
    yield process, port
    process.stop()


def open_connection(loop, port, name, **login):
    connection = Connection(loop, "127.0.0.1", port, name, **login)
    connection.open()
    return connection


def test_a_round_trip_through_a_broker_keeps_everything_the_workload_relies_on(broker):
    _, port = broker
    loop = Loop()
    publisher, consumer = open_connection(loop, port, "publisher"), open_connection(loop, port, "consumer")
    publisher.rpc(commands.Exchange.Declare(exchange="client.test", exchange_type="topic"),
                  commands.Exchange.DeclareOk)
    publisher.rpc(commands.Queue.Declare(queue="client.q", arguments={"x-max-priority": 5}),
                  commands.Queue.DeclareOk)
    publisher.rpc(commands.Queue.Bind(queue="client.q", exchange="client.test", routing_key="a.#"),
                  commands.Queue.BindOk)
    publisher.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
    confirmed = []
    publisher.on_confirm = lambda channel, tag, multiple, ack: confirmed.append((tag, multiple, ack))
    big = bytes(range(256)) * 1200  # 300 KiB: several frames at any frame_max
    messages = [(f"m{number}", {"k": number}, number % 3, big if number == 2 else b"body %d" % number)
                for number in range(5)]
    publisher.write(b"".join(
        publish_frames(1, "a.b", body, encode_properties(2, priority, identifier, headers), publisher.frame_max,
                       "client.test")
        for identifier, headers, priority, body in messages))
    loop.run_until(lambda: confirmed and confirmed[-1][0] == len(messages), lambda: f"confirms {confirmed}")
    assert all(ack for _, _, ack in confirmed)

    deliveries = []
    consumer.on_delivery = deliveries.append
    consumer.rpc(commands.Basic.Qos(prefetch_count=10), commands.Basic.QosOk)
    consumer.rpc(commands.Basic.Consume(queue="client.q", consumer_tag="tag-1"), commands.Basic.ConsumeOk)
    loop.run_until(lambda: len(deliveries) == len(messages), lambda: f"{len(deliveries)} delivered")
    by_id = {message_properties(d.properties)[0]: d for d in deliveries}
    for identifier, headers, _, body in messages:
        delivery = by_id[identifier]
        assert delivery.consumer_tag == "tag-1" and not delivery.redelivered
        assert delivery.body == body
        assert message_properties(delivery.properties)[1]["k"] == headers["k"]

    # nack with requeue brings one back flagged; reject drops another; a multiple ack settles the rest
    first, second = deliveries[0], deliveries[1]
    consumer.nack(first.delivery_tag, requeue=True)
    consumer.reject(second.delivery_tag, requeue=False)
    loop.run_until(lambda: len(deliveries) == len(messages) + 1, lambda: "the nacked message coming back")
    again = deliveries[-1]
    assert again.redelivered and again.body == first.body
    consumer.ack(again.delivery_tag, multiple=True)
    left = publisher.rpc(commands.Queue.Declare(queue="client.q", passive=True), commands.Queue.DeclareOk)
    assert left.message_count == 0
    publisher.close()
    consumer.close()


def test_a_wrong_password_is_refused_with_the_brokers_reason(broker):
    _, port = broker
    with pytest.raises(BenchmarkError, match="403|ACCESS_REFUSED|closed"):
        open_connection(Loop(), port, "intruder", username="guest", password="wrong")


def test_a_killed_broker_is_reported_as_gone(tmp_path):
    process = BrokerProcess(["--backend=memory", "--amqp", "tcp:0:interface=127.0.0.1", "--native", "none",
                             "--http", "none"], cwd=tmp_path)
    _, port = process.wait_address("AMQP")
    loop = Loop()
    connection = open_connection(loop, port, "doomed")
    process.kill()
    with pytest.raises(BrokerGone):
        loop.run_until(lambda: False, lambda: "waiting on a dead broker")
    with pytest.raises(BrokerGone, match="cannot connect"):
        Connection(Loop(), "127.0.0.1", port, "too-late")
    connection.shut()
