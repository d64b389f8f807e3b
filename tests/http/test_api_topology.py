"""The HTTP management API's queues, exchanges, bindings, messages and clients, on a real broker over real HTTP."""

import base64
import contextlib
import json
import time

import pika
import pytest
from twisted.internet.task import Clock

from backends.memory import MemoryStore
from brokerd.access.database import AccessDatabase
from brokerd.http import topology
from brokerd.http.routes import encode
from brokerd.http.server import ApiContext, ApiRequest
from brokerd.model.broker import Broker
from brokerd.model.message import Message
from brokerd.proto.messages_pb2 import BasicProperties
from tests.support.httpapi import api, broker, segment  # noqa: F401 (api, broker: the module's fixtures)


@pytest.fixture
def client(broker):
    host, port = broker.wait_address("AMQP")
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        host, port, client_properties={"connection_name": "topology-test"}, connection_attempts=1, socket_timeout=10))
    yield connection
    if connection.is_open:
        connection.close()


def test_queues_declared_over_http_take_amqp_messages_and_show_their_depths(api, client):
    assert api.put("/api/queues/%2F/depth", {"durable": False, "arguments": {"x-max-length": 10}}) == (201, None)
    assert api.put("/api/queues/%2F/depth", {"durable": False, "arguments": {"x-max-length": 10}}) == (204, None)
    channel = client.channel()
    channel.confirm_delivery()
    for number in range(3):
        channel.basic_publish("", "depth", b"m%d" % number)
    channel.basic_consume("depth", lambda *args: None)
    client.process_data_events(0.2)
    queue = api.get("/api/queues/%2F/depth")
    assert (queue["name"], queue["vhost"], queue["durable"], queue["auto_delete"], queue["exclusive"]) == \
        ("depth", "/", False, False, False)
    assert queue["arguments"] == {"x-max-length": 10}
    assert (queue["messages"], queue["messages_unacknowledged"], queue["consumers"], queue["state"]) == \
        (3, 3, 1, "running")
    stats = queue["message_stats"]
    assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (3, 3, 0)
    assert all(isinstance(stats[f"{name}_details"]["rate"], float) for name in ("publish", "deliver_get", "ack"))
    [listed] = [queue for queue in api.get("/api/queues") if queue["name"] == "depth"]
    assert (listed["messages"], listed["message_stats"]["deliver_get"]) == (3, 3)
    assert [queue["name"] for queue in api.get("/api/queues/%2F")] == sorted(q["name"] for q in api.get("/api/queues"))
    status, body = api.put("/api/queues/%2F/depth", {"durable": True})
    assert (status, body["reason"]) == (  # RabbitMQ 3.10.8's words: the bare reason
        400, "inequivalent arg 'durable' for queue 'depth' in vhost '/': received 'true' but current is 'false'")
    [consumer] = [c for c in api.get("/api/consumers") if c["queue"]["name"] == "depth"]
    assert consumer["queue"] == {"name": "depth", "vhost": "/"} and consumer["ack_required"] is True
    assert consumer["channel_details"]["number"] == channel.channel_number and consumer["consumer_tag"]
    channel.basic_ack(3, multiple=True)
    channel.queue_declare("depth", passive=True)  # a round trip: the ack was taken
    queue = api.get("/api/queues/%2F/depth")
    assert (queue["messages"], queue["message_stats"]["ack"]) == (0, 3)


def test_publish_get_purge_and_delete_over_http(api):
    api.put("/api/queues/%2F/box", {"durable": True})
    published_before = api.get("/api/overview")["message_stats"]["publish"]
    for payload in ("one", "two"):
        assert api.post("/api/exchanges/%2F/amq.default/publish", {
            "properties": {"delivery_mode": 2, "headers": {"k": "v"}, "content_type": "text/plain"},
            "routing_key": "box", "payload": payload, "payload_encoding": "string"}) == (200, {"routed": True})
    binary = base64.b64encode(b"\xff\x00").decode()
    assert api.post("/api/exchanges/%2F/amq.default/publish", {
        "properties": {}, "routing_key": "box", "payload": binary, "payload_encoding": "base64"}) == \
        (200, {"routed": True})
    assert api.post("/api/exchanges/%2F/amq.default/publish", {
        "properties": {}, "routing_key": "nowhere", "payload": "x", "payload_encoding": "string"}) == \
        (200, {"routed": False})
    assert api.get("/api/overview")["message_stats"]["publish"] == published_before + 4
    status, got = api.post("/api/queues/%2F/box/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200
    assert got == [{"payload": "one", "payload_encoding": "string", "payload_bytes": 3, "redelivered": False,
                    "exchange": "", "routing_key": "box", "message_count": 2,
                    "properties": {"delivery_mode": 2, "headers": {"k": "v"}, "content_type": "text/plain"}}]
    status, got = api.post("/api/queues/%2F/box/get", {"count": 5, "ackmode": "reject_requeue_true",
                                                      "encoding": "auto", "truncate": 2})
    assert [(m["payload"], m["payload_encoding"], m["payload_bytes"], m["redelivered"]) for m in got] == [
        ("on", "string", 3, True), ("tw", "string", 3, False), (base64.b64encode(b"\xff\x00").decode(), "base64", 2,
                                                                 False)]
    status, got = api.post("/api/queues/%2F/box/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                      "encoding": "base64"})
    assert (got[0]["payload"], got[0]["payload_encoding"]) == (base64.b64encode(b"one").decode(), "base64")
    box = api.get("/api/queues/%2F/box")
    assert (box["messages"], box["memory"]) == (2, len("two") + 2)
    assert api.delete("/api/queues/%2F/box?if-empty=true")[0] == 400
    assert api.delete("/api/queues/%2F/box/contents") == (204, None)
    assert api.get("/api/queues/%2F/box")["messages_ready"] == 0
    assert api.post("/api/queues/%2F/box/get", {"count": 1, "ackmode": "bogus", "encoding": "auto"})[0] == 400
    assert api.delete("/api/queues/%2F/box?if-empty=true") == (204, None)
    assert api.request("GET", "/api/queues/%2F/box")[0] == 404
    assert api.delete("/api/queues/%2F/box")[0] == 404


def test_exchanges_and_bindings_route_as_declared(api):
    assert api.put("/api/exchanges/%2F/logs", {"type": "topic", "durable": True}) == (201, None)
    assert api.put("/api/exchanges/%2F/fan", {"type": "fanout"}) == (201, None)
    assert api.get("/api/exchanges/%2F/logs")["type"] == "topic"
    assert {"", "amq.direct", "logs", "fan"} <= {exchange["name"] for exchange in api.get("/api/exchanges/%2F")}
    api.put("/api/queues/%2F/errors")
    status, _, headers = api.request("POST", "/api/bindings/%2F/e/logs/q/errors", {"routing_key": "*.error"})
    assert status == 201
    assert headers["Location"] == "/api/bindings/%2F/e/logs/q/errors/%252A.error"  # RabbitMQ's properties_key
    assert api.get(headers["Location"])["routing_key"] == "*.error"
    assert api.post("/api/bindings/%2F/e/fan/e/logs", {"routing_key": "", "arguments": {}})[0] == 201
    [binding] = api.get("/api/bindings/%2F/e/logs/q/errors")
    assert (binding["source"], binding["destination"], binding["destination_type"], binding["routing_key"]) == \
        ("logs", "errors", "queue", "*.error")
    [e2e] = api.get("/api/bindings/%2F/e/fan/e/logs")
    assert e2e["destination_type"] == "exchange"
    assert binding in api.get("/api/bindings/%2F") and e2e in api.get("/api/bindings")
    assert [b["source"] for b in api.get("/api/queues/%2F/errors/bindings")] == ["", "logs"]
    assert api.get("/api/exchanges/%2F/logs/bindings/source") == [binding]
    assert api.get("/api/exchanges/%2F/logs/bindings/destination") == [e2e]
    assert api.get("/api/exchanges/%2F/fan/bindings/source") == [e2e]
    assert api.post("/api/exchanges/%2F/fan/publish", {"properties": {}, "routing_key": "db.error",
                                                       "payload": "x", "payload_encoding": "string"})[1] == \
        {"routed": True}
    assert api.get("/api/queues/%2F/errors")["messages"] == 1
    assert api.delete("/api/bindings/%2F/e/logs/q/errors/" + segment(binding["properties_key"])) == (204, None)
    assert api.get("/api/bindings/%2F/e/logs/q/errors") == []
    assert api.delete("/api/bindings/%2F/e/fan/e/logs/" + segment(e2e["properties_key"])) == (204, None)
    assert api.delete("/api/exchanges/%2F/logs") == (204, None)
    assert api.request("GET", "/api/exchanges/%2F/logs")[0] == 404
    assert api.delete("/api/exchanges/%2F/fan") == (204, None)
    assert api.put("/api/exchanges/%2F/bad", {"type": "nosuch"})[0] == 400


def test_permissions_apply_as_over_amqp(api):
    api.put("/api/users/limited", {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%2F/limited", {"configure": "^mine-", "write": "^mine-", "read": "^mine-"})
    limited = api.as_user("limited", "pw")
    assert limited.put("/api/queues/%2F/mine-q") == (201, None)
    status, body = limited.put("/api/queues/%2F/theirs-q")
    assert (status, body["error"]) == (401, "not_authorised")
    assert body["reason"] == "Access refused."  # RabbitMQ 3.10.8's words; the broker's log says why
    assert limited.post("/api/exchanges/%2F/amq.default/publish", {
        "properties": {}, "routing_key": "mine-q", "payload": "x", "payload_encoding": "string"}) == (400, {
            "error": "bad_request",  # RabbitMQ 3.10.8 answers a refused publish so
            "reason": "403 ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'limited'"})
    api.put("/api/vhosts/hidden")
    assert limited.request("GET", "/api/queues/hidden")[0] == 401
    assert limited.delete("/api/queues/%2F/mine-q") == (204, None)
    api.delete("/api/vhosts/hidden")
    api.delete("/api/users/limited")


def test_connections_and_channels_are_listed_and_closed_with_a_reason(api, client):
    client.channel()
    [connection] = [c for c in api.get("/api/connections")
                    if c["client_properties"].get("connection_name") == "topology-test"]
    host, port = client._impl.params.host, client._impl.params.port
    assert (connection["user"], connection["vhost"], connection["protocol"], connection["state"]) == \
        ("guest", "/", "AMQP 0-9-1", "running")
    assert (connection["host"], connection["port"], connection["peer_host"]) == (host, port, "127.0.0.1")
    assert connection["name"] == f"127.0.0.1:{connection['peer_port']} -> {host}:{port}"
    assert connection["channels"] == 1 and connection["recv_oct"] > 0 and connection["send_oct"] > 0
    assert connection["connected_at"] > 0
    assert api.get("/api/connections/" + segment(connection["name"]))["name"] == connection["name"]
    [channel] = [c for c in api.get("/api/channels") if c["connection_details"]["name"] == connection["name"]]
    assert channel["name"] == connection["name"] + " (1)" and channel["number"] == 1
    assert api.delete("/api/connections/" + segment(connection["name"]), {"X-Reason": "go away"}) == (204, None)
    with pytest.raises(pika.exceptions.ConnectionClosed) as closed:
        client.process_data_events(5)
        client.channel()
    assert (closed.value.reply_code, closed.value.reply_text) == (320, "CONNECTION_FORCED - go away")
    assert api.request("GET", "/api/connections/" + segment(connection["name"]))[0] == 404


def test_the_queue_listing_is_the_queues_info_and_linear_in_ten_thousand_queues():
    """
    The listing's cached parts give what L{topology.queue_info} gives; 10,000 queues take well under a
    second even on a loaded machine (benchmarks.http_api measures the 100 ms bar through HTTP).
    """
    broker = Broker(MemoryStore(), Clock())
    vhost = broker.vhosts["/"]
    for number in range(10_000):
        vhost.declare_queue(f"q{number:05}", arguments={"x-max-length": number})
    vhost.publish("", Message("", "q00007", BasicProperties(), b"body"))
    api = ApiRequest(ApiContext(broker, AccessDatabase.in_memory(), None), None, "guest")
    listing = json.loads(encode(topology.list_queues(api)))
    assert listing == [json.loads(encode(topology.queue_info(api, vhost.queues[name], {})))
                       for name in sorted(vhost.queues)]
    assert (listing[7]["messages"], listing[7]["memory"]) == (1, 4)
    best = min(_timed(lambda: encode(topology.list_queues(api))) for _ in range(3))
    assert best < 1.0, f"{best * 1000:.0f} ms"


def _timed(work):
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def test_a_management_user_sees_and_closes_only_its_own_connections(broker, api, client):
    api.put("/api/users/watcher", {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%2F/watcher", {"configure": ".*", "write": ".*", "read": ".*"})
    watcher = api.as_user("watcher", "pw")
    host, port = broker.wait_address("AMQP")
    own = pika.BlockingConnection(pika.ConnectionParameters(
        host, port, credentials=pika.PlainCredentials("watcher", "pw"), connection_attempts=1, socket_timeout=10))
    try:
        own.channel()
        [mine] = watcher.get("/api/connections")
        assert mine["user"] == "watcher" and watcher.get("/api/channels")[0]["user"] == "watcher"
        assert {"guest", "watcher"} <= {connection["user"] for connection in api.get("/api/connections")}
        [guests] = [c for c in api.get("/api/connections") if c["user"] == "guest"]
        assert watcher.request("GET", "/api/connections/" + segment(guests["name"]))[0] == 401
        assert watcher.delete("/api/connections/" + segment(guests["name"]))[0] == 401
        assert watcher.delete("/api/connections/" + segment(mine["name"])) == (204, None)
        assert client.is_open
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            own.close()
        api.delete("/api/users/watcher")
