"""Prometheus beyond the queue depths: C{/metrics/detailed} with RabbitMQ's C{family} and C{vhost} query
parameters, channel and connection families per object and for the node, queue bytes, and one node name in the
metrics and the management API (a real broker, pika clients, the exposition parsed by prometheus_client).

What each family holds and its names are RabbitMQ 3.10.8's, as its /metrics/detailed answered
(C{rabbitmq_detailed_} families, C{rabbitmq_cluster_vhost_status}, build and identity info always given, unknown
families ignored, C{vhost=} narrowing the queue families only).
"""

import socket
import time
import urllib.request

import pika
import pytest

from tests.support.httpapi import Api, amqp, module_broker
from tests.support.metrics import scrape, value


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory, "--prometheus", "tcp:0:interface=127.0.0.1")


@pytest.fixture(scope="module")
def api(broker):
    return Api(broker.wait_listening("HTTP API"))


def test_the_metrics_and_the_management_api_name_the_node_alike(broker, api):
    node = api.get("/api/overview")["node"]
    assert node == f"brokerd@{socket.gethostname().split('.')[0]}" == api.get("/api/overview")["cluster_name"]
    assert [entry["name"] for entry in api.get("/api/nodes")] == [node]
    samples = scrape(broker, "/metrics")
    [(labels, identity)] = samples["rabbitmq_identity_info"]
    assert (labels["rabbitmq_node"], labels["rabbitmq_cluster"], identity) == (node, node, 1)
    [(labels, build)] = samples["rabbitmq_build_info"]
    assert (labels["rabbitmq_version"], labels["product_name"], build) == ("3.10.8", "brokerd", 1)


def test_detailed_gives_the_families_asked_for_and_narrows_queues_to_the_vhosts_given(broker, api):
    assert api.request("PUT", "/api/vhosts/metrics-other")[0] in (201, 204)
    assert api.request("PUT", "/api/permissions/metrics-other/guest",
                       {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    connection = amqp(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("detailed.here")
    for number in range(3):
        channel.basic_publish("", "detailed.here", b"x" * 10)
    assert channel.basic_get("detailed.here")[0] is not None  # one un-acked, of 10 bytes
    elsewhere = amqp(broker, vhost="metrics-other")
    elsewhere.channel().queue_declare("detailed.elsewhere")

    bare = scrape(broker, "/metrics/detailed")
    assert set(bare) == {"rabbitmq_build_info", "rabbitmq_identity_info"}

    queues = scrape(broker, "/metrics/detailed?family=queue_coarse_metrics&family=queue_metrics&family=no_such"
                            "&vhost=%2F")
    here = {"vhost": "/", "queue": "detailed.here"}
    assert value(queues, "rabbitmq_detailed_queue_messages_ready", **here) == 2
    assert value(queues, "rabbitmq_detailed_queue_messages_unacked", **here) == 1
    assert value(queues, "rabbitmq_detailed_queue_messages", **here) == 3
    assert value(queues, "rabbitmq_detailed_queue_messages_ready_bytes", **here) == 20
    assert value(queues, "rabbitmq_detailed_queue_messages_unacked_bytes", **here) == 10
    assert value(queues, "rabbitmq_detailed_queue_messages_bytes", **here) == 30
    assert {labels["vhost"] for labels, _ in queues["rabbitmq_detailed_queue_messages_ready"]} == {"/"}
    assert not any(name.startswith("rabbitmq_detailed_channel") for name in queues)
    every = scrape(broker, "/metrics/detailed?family=queue_coarse_metrics")
    assert value(every, "rabbitmq_detailed_queue_messages", vhost="metrics-other", queue="detailed.elsewhere") == 0
    unknown = scrape(broker, "/metrics/detailed?family=queue_coarse_metrics&vhost=no-such-vhost")
    assert "rabbitmq_detailed_queue_messages" not in unknown

    listed = api.get("/api/channels")
    name = next(entry["name"] for entry in listed if entry["vhost"] == "/")
    per_channel = scrape(broker, "/metrics/detailed?family=channel_queue_metrics&family=channel_exchange_metrics"
                                 "&family=channel_metrics&family=connection_churn_metrics&family=vhost_status")
    mine = {"vhost": "/", "channel": name}
    assert value(per_channel, "rabbitmq_detailed_channel_get_ack_total", **mine) == 1
    assert value(per_channel, "rabbitmq_detailed_channel_messages_published_total", **mine) == 3
    assert value(per_channel, "rabbitmq_detailed_channel_messages_confirmed_total", **mine) == 3
    assert value(per_channel, "rabbitmq_detailed_channel_messages_unacked", **mine) == 1
    assert value(per_channel, "rabbitmq_detailed_queues_created_total") >= 2
    assert value(per_channel, "rabbitmq_detailed_channels_opened_total") >= 2
    assert value(per_channel, "rabbitmq_cluster_vhost_status", vhost="metrics-other") == 1
    connection.close()
    elsewhere.close()
    assert api.request("DELETE", "/api/vhosts/metrics-other")[0] == 204


def test_channel_counters_of_the_node_keep_what_closed_channels_counted(broker):
    connection = amqp(broker)
    channel = connection.channel()
    channel.queue_declare("detailed.kept")
    before = scrape(broker, "/metrics")
    for number in range(4):
        channel.basic_publish("", "detailed.kept", b"kept %d" % number)
    channel.basic_consume("detailed.kept", lambda ch, method, properties, body: None, auto_ack=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and value(scrape(broker, "/metrics"), "rabbitmq_channel_messages_delivered_total"
                                                ) - value(before, "rabbitmq_channel_messages_delivered_total") < 4:
        connection.process_data_events(time_limit=0.05)  # until the broker has delivered the four
    per_object = scrape(broker, "/metrics/per-object")
    assert any(labels.get("channel", "").endswith("(1)") and sample == 4
               for labels, sample in per_object["rabbitmq_channel_messages_published_total"])
    connection.close()
    after = scrape(broker, "/metrics")
    for name in ("rabbitmq_channel_messages_published_total", "rabbitmq_channel_messages_delivered_total"):
        assert value(after, name) - value(before, name) == 4, name
    assert value(after, "rabbitmq_channels_closed_total") - value(before, "rabbitmq_channels_closed_total") >= 1
    assert value(after, "rabbitmq_process_open_fds") > 0
    assert value(after, "rabbitmq_process_max_fds") >= value(after, "rabbitmq_process_open_fds")


def test_connections_list_the_name_their_client_gave(broker, api):
    host, port = broker.wait_address("AMQP")
    named = pika.ConnectionParameters(host, port, client_properties={"connection_name": "orders <worker> 1"})
    numbered = pika.ConnectionParameters(host, port, client_properties={"connection_name": 42})
    with pika.BlockingConnection(named), pika.BlockingConnection(numbered), amqp(broker):
        listed = api.get("/api/connections")
        provided = sorted(entry.get("user_provided_name", "(none)") for entry in listed)
        assert provided == ["(none)", "(none)", "orders <worker> 1"]  # as RabbitMQ: a string only
        name = next(entry["name"] for entry in listed if "user_provided_name" in entry)
        assert api.get(f"/api/connections/{urllib.request.quote(name, safe='')}")["user_provided_name"] == (
            "orders <worker> 1")
        columns = api.get("/api/connections?columns=name,user_provided_name")
        assert {"name": name, "user_provided_name": "orders <worker> 1"} in columns
