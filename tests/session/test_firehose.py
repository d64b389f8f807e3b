"""The firehose in process, on a clock: the AMQP types of the copies' headers (RabbitMQ's
rabbit_trace writes integers as signed 32-bit), a copy per publish and per delivery only while
tracing is on, and no copy of a copy, so a consumer of the trace queue does not feed it."""

from brokerd.model.firehose import TRACE_EXCHANGE, start_tracing, stop_tracing
from brokerd.proto import messages_pb2
from tests.support.broker import open_channel, properties


def fields(table):
    return {field.name: field.value for field in table.fields}


def traced_channel(broker):
    channel, peer = open_channel(broker)
    channel.queue_declare("trace")
    channel.queue_bind("trace", TRACE_EXCHANGE, "#")
    channel.queue_declare("work")
    return channel, peer


def test_the_copies_headers_have_rabbitmqs_amqp_types(broker):
    channel, _ = traced_channel(broker)
    vhost = broker.vhost("/")
    assert start_tracing(vhost) and not start_tracing(vhost)
    channel.basic_publish("", "work", properties(priority=3, timestamp=2**31 + 5, content_type="t"), b"x")
    _, _, copy, _ = channel.basic_get("trace", no_ack=True)
    assert (copy.exchange, copy.routing_key, copy.body) == (TRACE_EXCHANGE, "publish.", b"x")
    headers = fields(copy.properties.headers)
    assert list(headers) == ["exchange_name", "routing_keys", "properties", "node", "vhost", "connection",
                             "channel", "user", "routed_queues"]
    assert headers["channel"].integer_kind == messages_pb2.INT32 and headers["channel"].integer_value == 1
    assert [value.string_value for value in headers["routing_keys"].array_value.values] == ["work"]
    assert [value.string_value for value in headers["routed_queues"].array_value.values] == ["work"]
    copied = fields(headers["properties"].table_value)
    assert list(copied) == ["timestamp", "priority", "content_type"]
    assert copied["priority"].integer_kind == messages_pb2.INT32
    assert copied["timestamp"].integer_kind == messages_pb2.INT64  # too late for 32 bits
    assert copied["content_type"].string_value == "t"
    channel.basic_publish("", "no-such-queue", properties(), b"y")
    channel.basic_publish("amq.topic", "nowhere", properties(), b"z")
    routed = [[value.string_value for value in fields(copy.properties.headers)["routed_queues"].array_value.values]
              for _, _, copy, _ in (channel.basic_get("trace", no_ack=True), channel.basic_get("trace", no_ack=True))]
    assert routed == [["no-such-queue"], []]  # as RabbitMQ 3.10.8: the default exchange names the key's queue


def test_deliveries_are_copied_but_copies_are_not_and_nothing_once_tracing_is_off(broker, clock):
    channel, peer = traced_channel(broker)
    vhost = broker.vhost("/")
    start_tracing(vhost)
    channel.basic_consume("trace", "firehose-reader", no_ack=True)
    channel.basic_publish("", "work", properties(), b"job")
    channel.basic_consume("work", "worker", no_ack=True)
    clock.advance(0)
    assert [(tag, message.routing_key) for tag, _, _, message in peer.deliveries] == [
        ("firehose-reader", "publish."), ("worker", "work"), ("firehose-reader", "deliver.work")]
    redelivered = fields(peer.deliveries[2][3].properties.headers)["redelivered"]
    assert (redelivered.integer_value, redelivered.integer_kind) == (0, messages_pb2.INT32)
    assert stop_tracing(vhost) and not stop_tracing(vhost)
    channel.basic_publish("", "work", properties(), b"untraced")
    clock.advance(0)
    assert [message.body for tag, _, _, message in peer.deliveries[3:]] == [b"untraced"]
