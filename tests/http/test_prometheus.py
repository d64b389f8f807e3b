"""Prometheus metrics (--prometheus): a real broker, pika clients, and the
exposition fetched over HTTP and parsed with prometheus_client's own parser;
and the commit-time histogram the durable stores keep for it."""

import urllib.error

import pika
import pytest
from twisted.internet import task
from zope.interface.verify import verifyObject

import brokerd
from brokerd.http.nodename import node_name
from brokerd.interfaces import ITimedCommits
from brokerd.storage import registry
from brokerd.storage.durability import CommitTimes
from brokerd.testing import BrokerProcess
from tests.support.metrics import scrape, value


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(["--backend", "chunked", "--native", "none",
                             "--prometheus", "tcp:0:interface=127.0.0.1"], cwd=tmp_path_factory.mktemp("broker"))
    try:
        process.wait_listening("Prometheus metrics")
        yield process
    finally:
        process.stop()


def connect(broker, user="guest", password="guest"):
    host, port = broker.wait_address("AMQP")
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, port, credentials=pika.PlainCredentials(user, password), connection_attempts=1, socket_timeout=10))


def test_queue_depths_connections_and_message_totals(broker):
    before = scrape(broker)
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("metrics.jobs")
    for number in range(5):
        channel.basic_publish("", "metrics.jobs", f"job {number}".encode())
    channel.basic_publish("", "metrics.nowhere", b"dropped")
    channel.basic_qos(prefetch_count=2)
    deliveries = []
    tag = channel.basic_consume("metrics.jobs", lambda ch, method, properties, body: deliveries.append(method))
    connection.process_data_events(time_limit=0)
    while len(deliveries) < 2:
        connection.process_data_events(time_limit=1)
    channel.basic_ack(deliveries[0].delivery_tag)
    getter = connection.channel()
    method, _, _ = getter.basic_get("metrics.jobs")  # a basic.get delivery, not acked: unacked too
    assert method is not None
    while len(deliveries) < 3:  # the ack made room for one more delivery
        connection.process_data_events(time_limit=1)

    per_object = scrape(broker, "/metrics/per-object")
    queue = {"vhost": "/", "queue": "metrics.jobs"}
    assert value(per_object, "rabbitmq_queue_messages_ready", **queue) == 1  # 5 - 3 delivered - 1 got
    assert value(per_object, "rabbitmq_queue_messages_unacked", **queue) == 3  # 2 consumer deliveries, 1 get
    assert value(per_object, "rabbitmq_queue_messages", **queue) == 4
    assert value(per_object, "rabbitmq_queue_consumers", **queue) == 1

    aggregated = scrape(broker)
    assert value(aggregated, "rabbitmq_queue_messages_ready") == 1
    assert value(aggregated, "rabbitmq_queue_messages_unacked") == 3
    assert "rabbitmq_queue_messages_ready" not in {name for name, samples in aggregated.items()
                                                   if any(labels for labels, _ in samples)}
    assert value(aggregated, "rabbitmq_queues") >= 1
    assert value(aggregated, "rabbitmq_connections") == 1
    assert value(aggregated, "rabbitmq_channels") == 2
    assert value(aggregated, "rabbitmq_consumers") == 1
    amqp = {"protocol": "amqp091"}

    def grew(name):
        old = dict((tuple(labels.items()), v) for labels, v in before.get(name, [])).get(tuple(amqp.items()), 0)
        return value(aggregated, name, **amqp) - old

    assert grew("rabbitmq_global_messages_received_total") == 6
    assert grew("rabbitmq_global_messages_received_confirm_total") == 6
    assert grew("rabbitmq_global_messages_confirmed_total") == 6
    assert grew("rabbitmq_global_messages_routed_total") == 5
    assert grew("rabbitmq_global_messages_unroutable_dropped_total") == 1
    assert grew("rabbitmq_global_messages_unroutable_returned_total") == 0
    assert grew("rabbitmq_global_messages_delivered_total") == 4
    assert grew("rabbitmq_global_messages_acknowledged_total") == 1
    assert value(aggregated, "rabbitmq_connections_opened_total") >= 1

    channel.basic_cancel(tag)  # its deliveries stay un-acked, and counted
    cancelled = scrape(broker, "/metrics/per-object")
    assert value(cancelled, "rabbitmq_queue_messages_unacked", **queue) == 3
    assert value(cancelled, "rabbitmq_queue_consumers", **queue) == 0
    returner = connection.channel()
    returner.basic_publish("", "metrics.nowhere", b"returned", mandatory=True)
    connection.process_data_events(time_limit=0)
    open_totals = scrape(broker)
    assert value(open_totals, "rabbitmq_global_messages_unroutable_returned_total", **amqp) == value(
        aggregated, "rabbitmq_global_messages_unroutable_returned_total", **amqp) + 1
    connection.close()  # its counts stay in the totals; its deliveries go back to the queue
    after = scrape(broker)
    assert value(after, "rabbitmq_connections") == 0
    for name in ("received", "delivered", "acknowledged", "unroutable_returned"):
        total = f"rabbitmq_global_messages_{name}_total"
        assert value(after, total, **amqp) == value(open_totals, total, **amqp), total
    assert value(after, "rabbitmq_connections_closed_total") >= 1
    assert value(scrape(broker, "/metrics/per-object"), "rabbitmq_queue_messages_ready", **queue) == 4


def test_watermark_store_and_process_figures(broker):
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("metrics.durable", durable=True)
    channel.basic_publish("", "metrics.durable", b"kept", pika.BasicProperties(delivery_mode=2))  # confirmed: fsynced
    connection.close()
    samples = scrape(broker)
    assert value(samples, "brokerd_memory_watermark_blocked") == 0
    assert value(samples, "rabbitmq_resident_memory_limit_bytes") == 1 << 30
    assert value(samples, "rabbitmq_process_resident_memory_bytes") > 1 << 20
    store = {"backend": "chunked", "vhost": ""}
    assert value(samples, "brokerd_store_fsyncs_total", **store) >= 1
    assert value(samples, "brokerd_store_commit_seconds_count", **store) >= 1
    assert value(samples, "brokerd_store_commit_seconds_bucket", le="+Inf", **store) == value(
        samples, "brokerd_store_commit_seconds_count", **store)
    assert 0 <= value(samples, "brokerd_cache_hit_ratio", **store) <= 1
    assert "brokerd_chunk_reads_total" in samples
    node = node_name()  # brokerd@ and the host's short name, as the management API names the node
    assert value(samples, "rabbitmq_identity_info", rabbitmq_node=node, rabbitmq_cluster=node,
                 brokerd_version=brokerd.__version__) == 1


def test_a_queue_over_its_backlog_alarm_is_one_until_drained(broker):
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("metrics.alarmed", arguments={"x-backlog-alarm": 2})
    queue = {"vhost": "/", "queue": "metrics.alarmed"}
    for body in (b"1", b"2"):
        channel.basic_publish("", "metrics.alarmed", body)
    assert value(scrape(broker, "/metrics/per-object"), "brokerd_queue_backlog_alarm", **queue) == 0  # at it
    channel.basic_publish("", "metrics.alarmed", b"3")
    assert value(scrape(broker, "/metrics/per-object"), "brokerd_queue_backlog_alarm", **queue) == 1
    assert value(scrape(broker), "brokerd_queue_backlog_alarm") == 1
    channel.queue_purge("metrics.alarmed")
    assert value(scrape(broker, "/metrics/per-object"), "brokerd_queue_backlog_alarm", **queue) == 0
    assert value(scrape(broker), "brokerd_queue_backlog_alarm") == 0
    connection.close()


def test_failed_logins_are_counted_per_user(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(broker, password="wrong")
    assert value(scrape(broker), "brokerd_failed_logins_total", user="guest") >= 1


def test_unknown_paths_are_not_found(broker):
    with pytest.raises(urllib.error.HTTPError) as raised:
        scrape(broker, "/nothing")
    assert raised.value.code == 404


@pytest.mark.parametrize("backend", ["chunked", "filelog", "sqlite"])
def test_durable_stores_give_their_commit_times(backend, tmp_path):
    store = registry.make_store(backend, str(tmp_path), reactor=task.Clock())
    assert verifyObject(ITimedCommits, store)
    assert store.commit_times() is None  # not opened


def test_the_memory_store_has_no_commits_to_time(tmp_path):
    assert not ITimedCommits.providedBy(registry.make_store("memory", str(tmp_path), reactor=task.Clock()))


def test_commit_times_count_each_commit_under_its_bound():
    times = CommitTimes(bounds=(0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.5):
        times.observe(seconds)
    assert times.counts == [2, 1, 1]  # up to 1 ms (bound included), up to 10 ms, longer
    assert times.count == 4
    assert times.total_seconds == pytest.approx(0.5035)
