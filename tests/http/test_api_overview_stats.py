"""C{/api/overview}'s message_stats are node-wide counters since start, as RabbitMQ's: what connections that
closed between two looks counted stays in them, and deliveries to consumers, with and without acks, and basic.gets
are counted apart (pika clients and RabbitMQ's own rabbitmqadmin on a real broker).

The names and what each counts are RabbitMQ 3.10.8's, as its /api/overview gave them for the same operations:
C{deliver_get} the sum of C{deliver}, C{deliver_no_ack}, C{get} and C{get_no_ack}; C{get} a basic.get to be acked
(a nacked one too); C{get_empty} a basic.get that found nothing; C{redeliver} a redelivered message, by get or
consumer; C{confirm} the confirms sent; C{drop_unroutable} and C{return_unroutable} the unroutable publishes.
"""

import json
import subprocess
import sys
import time

import pika
import pytest

from tests.support.httpapi import RABBITMQADMIN, amqp, api, broker  # noqa: F401 (api, broker: the module's fixtures)

STATS = ("publish", "confirm", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "deliver_get",
         "redeliver", "ack", "return_unroutable", "drop_unroutable")


def stats(api):
    return api.get("/api/overview")["message_stats"]


def grown(before, after):
    """How much each counter grew from C{before} to C{after}."""
    return {name: after[name] - before[name] for name in STATS}


def test_twenty_short_connections_publishing_five_each_count_a_hundred(api, broker):
    before = stats(api)
    for _ in range(20):
        connection = amqp(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("overview.short")
        for number in range(5):
            channel.basic_publish("", "overview.short", b"message %d" % number)
        connection.close()
    after = stats(api)
    assert grown(before, after)["publish"] == 100
    assert grown(before, after)["confirm"] == 100
    assert after["publish_details"]["rate"] > 0
    assert after["confirm_details"]["rate"] > 0
    assert all(isinstance(after[f"{name}_details"]["rate"], float) for name in STATS)


def test_deliveries_gets_and_acks_are_counted_apart(api, broker):
    connection = amqp(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    for queue in ("overview.work", "overview.auto", "overview.empty"):
        channel.queue_declare(queue)
    for number in range(6):
        channel.basic_publish("", "overview.work", b"work %d" % number)
    for number in range(2):
        channel.basic_publish("", "overview.auto", b"auto %d" % number)
    channel.basic_publish("", "overview.nowhere", b"dropped")
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", "overview.nowhere", b"returned", mandatory=True)
    before = stats(api)

    method, _, _ = channel.basic_get("overview.work")  # get (to be acked), then nacked back
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = channel.basic_get("overview.work")  # get, redelivered, acked
    assert method.redelivered
    channel.basic_ack(method.delivery_tag)
    assert channel.basic_get("overview.work", auto_ack=True)[0] is not None  # get_no_ack
    assert channel.basic_get("overview.empty")[0] is None  # get_empty
    delivered = []
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume("overview.work", lambda ch, method, properties, body: delivered.append(method))
    channel.basic_consume("overview.auto", lambda ch, method, properties, body: delivered.append(method),
                          auto_ack=True)
    while len(delivered) < 6:  # 4 to be acked, 2 without acks
        connection.process_data_events(time_limit=1)
    channel.basic_ack(0, multiple=True)
    expected = {
        "publish": 0, "confirm": 0, "deliver": 4, "deliver_no_ack": 2, "get": 2, "get_no_ack": 1, "get_empty": 1,
        "deliver_get": 9, "redeliver": 1, "ack": 5, "return_unroutable": 0, "drop_unroutable": 0,
    }
    deadline = time.monotonic() + 10  # the last ack reaches the broker on its own time
    while grown(before, after := stats(api)) != expected and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    connection.close()

    assert grown(before, after) == expected
    closed = stats(api)  # the closed connection's counts stay
    assert all(closed[name] >= after[name] for name in STATS)
    assert before["return_unroutable"] >= 1 and before["drop_unroutable"] >= 1


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin (RabbitMQ's) is not installed here")
def test_rabbitmqadmin_show_overview_gives_the_counters(api, broker):
    _, port = broker.wait_address("HTTP API")
    columns = ["message_stats.publish", "message_stats.deliver_get", "message_stats.get",
               "message_stats.deliver", "message_stats.ack", "message_stats.publish_details.rate"]
    finished = subprocess.run([sys.executable, RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", "guest",
                               "-p", "guest", "-f", "raw_json", "show", "overview", *columns],
                              capture_output=True, text=True, timeout=30)
    assert finished.returncode == 0, finished.stderr
    shown = json.loads(finished.stdout)[0]
    expected = stats(api)
    for name in ("publish", "deliver_get", "get", "deliver", "ack"):
        assert shown["message_stats"][name] == expected[name]
    assert shown["message_stats"]["publish"] >= 100  # this module's publishes, from connections long closed
    table = subprocess.run([sys.executable, RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", "guest",
                            "-p", "guest", "-f", "tsv", "show", "overview", *columns],
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    header, values = table.stdout.splitlines()[:2]
    row = dict(zip(header.split("\t"), values.split("\t")))
    assert int(row["message_stats.publish"]) == shown["message_stats"]["publish"]
    assert float(row["message_stats.publish_details.rate"]) >= 0
