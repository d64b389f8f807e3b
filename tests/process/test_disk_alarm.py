"""The disk alarm on a real small file system: a broker whose data directory is on a tmpfs of
a few megabytes, and pika clients.

A publisher that fills the disk gets nacks, then connection.blocked ("low on disk"); the
health check answers 503 with RabbitMQ's body; consumers drain meanwhile; once a filler file
on the same file system is deleted the publisher is unblocked and its publishes are
confirmed; no message whose publish was nacked is ever delivered, before or after a
restart, even one made with the disk still full; and the log says so in a line or two, never
a traceback per message. The limit crossed by the measured free space blocks publishers the
same way.
"""

import time
import urllib.request

import pika
import pytest

from brokerd.testing import BrokerProcess, poll_until
from tests.support.httpapi import Api
from tests.support.small_disk import free_bytes, small_filesystem, write_filler

BODY_SIZE = 64 * 1024
WAIT = 20.0
QUEUE = "disk-filling"


def connect(process):
    host, port = process.wait_address("AMQP")
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, port, connection_attempts=1, socket_timeout=10, blocked_connection_timeout=None))


def body(number):
    return b"%08d" % number + b"m" * (BODY_SIZE - 8)


def events_until(connection, found, what, timeout=WAIT):
    """Let pika read until C{found()} is true (the callbacks it runs record what came)."""
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        connection.process_data_events(time_limit=0.1)


def drain(connection, queue=QUEUE):
    """Every message of C{queue}, got and acked one by one: their numbers."""
    channel = connection.channel()
    numbers = []
    while True:
        method, _, content = channel.basic_get(queue, auto_ack=False)
        if method is None:
            return numbers
        numbers.append(int(content[:8]))
        channel.basic_ack(method.delivery_tag)


def api_of(process):
    return Api(process.wait_listening("HTTP API"))


def alarm_health(api):
    status, answer, _ = api.request("GET", "/api/health/checks/alarms")
    return status, answer


def publish_until_nacked(channel, nacks=2):
    """
    Confirmed publishes of numbered bodies until C{nacks} are nacked, or fewer once the broker
    has blocked the connection (a publish after that would not be read until space comes
    back): (acked, nacked) numbers, at least one nacked.
    """
    acked, nacked, blocked = set(), set(), []
    channel.connection.add_on_connection_blocked_callback(lambda *_: blocked.append(True))
    number = 0
    while len(nacked) < nacks:
        channel.connection.process_data_events(time_limit=0)  # pika tells of connection.blocked here
        if nacked and blocked:
            break
        number += 1
        assert number < 200, "the disk never filled"
        try:
            channel.basic_publish("", QUEUE, body(number), pika.BasicProperties(delivery_mode=2))
            acked.add(number)
        except pika.exceptions.NackError:
            nacked.add(number)
    return acked, nacked


@pytest.mark.parametrize("backend", ["chunked", "filelog", "sqlite"])
def test_a_publisher_filling_the_disk_is_nacked_blocked_and_resumes_once_space_is_freed(tmp_path, backend):
    # The filler leaves about 2.5 MiB for the store, and freeing it leaves room to spare: a
    # store that filled its last bytes (SQLite's WAL grew meanwhile) needs more than it
    # lost to commit again.
    with small_filesystem(tmp_path / "disk", "8m") as disk:
        filler = disk / "filler"
        write_filler(filler, 5632 * 1024)
        # A limit of one byte: the alarm comes from the store's full disk, after nacks.
        broker = BrokerProcess(["--backend", backend, "--data-dir", str(disk / "data"), "--native", "none",
                                "--disk-free-limit", "1"], cwd=tmp_path)
        try:
            publisher = connect(broker)
            blocked, unblocked = [], []
            publisher.add_on_connection_blocked_callback(lambda _, frame: blocked.append(frame.method.reason))
            publisher.add_on_connection_unblocked_callback(lambda _, frame: unblocked.append(True))
            confirmed = publisher.channel()
            confirmed.queue_declare(QUEUE, durable=True)
            confirmed.confirm_delivery()
            unconfirmed = publisher.channel()  # opened now: a blocked connection is not read
            acked, nacked = publish_until_nacked(confirmed)
            number = max(acked | nacked)
            assert acked

            # The next publish stalls: the broker stopped reading, and said why.
            number += 1
            unconfirmed.basic_publish("", QUEUE, body(number), pika.BasicProperties(delivery_mode=2))
            late = number
            events_until(publisher, lambda: blocked, "connection.blocked")
            assert blocked == ["low on disk"]
            api = api_of(broker)
            assert alarm_health(api) == (503, {
                "status": "failed", "reason": "There are alarms in effect in the cluster",
                "alarms": [{"resource": "disk space", "node": api.get("/api/overview")["node"]}],
            })
            node = api.get("/api/nodes")[0]
            assert node["disk_free_alarm"] is True and node["disk_free_limit"] == 1
            assert isinstance(node["disk_free"], int) and node["disk_free"] < 1 << 20

            # Consumers go on while publishers are held; nothing nacked reaches them.
            consumer = connect(broker)
            drained = drain(consumer)
            assert set(drained) <= acked, f"nacked messages delivered: {sorted(set(drained) - acked)}"
            assert set(drained) == acked
            assert not unblocked

            # Space comes back: the publisher is unblocked, its held publish goes through, a new one is confirmed.
            filler.unlink()
            events_until(publisher, lambda: unblocked, "connection.unblocked")
            number += 1
            confirmed.basic_publish("", QUEUE, body(number), pika.BasicProperties(delivery_mode=2))
            acked.add(number)
            poll_until(lambda: alarm_health(api)[0] == 200 or None, WAIT, "the alarm to clear")
            assert sorted(drain(consumer)) == [late, number]
            number += 1
            kept = number  # confirmed after the episode, left in the queue: it must survive the restart
            confirmed.basic_publish("", QUEUE, body(kept), pika.BasicProperties(delivery_mode=2))
            acked.add(kept)
            consumer.close()
            publisher.close()

            # One line when the commits start failing, one when they succeed again: never one per message.
            before_restart = list(broker.output)
            failed = sum("a commit failed" in line for line in before_restart)
            recovered_runs = sum("commits succeed again" in line for line in before_restart)
            assert 1 <= failed <= recovered_runs + 1 <= 3, "\n".join(before_restart)
            assert not any("Traceback" in line for line in before_restart)

            # A restart brings back nothing that was nacked (acks made while the disk was full may be lost,
            # so consumed messages may come again: that is a redelivery, not a nacked message).
            status = broker.restart()
            assert status == 0, "\n".join(before_restart[-30:])
            consumer = connect(broker)
            recovered = drain(consumer)
            consumer.close()
            assert not set(recovered) & nacked, f"nacked messages came back: {sorted(set(recovered) & nacked)}"
            assert set(recovered) <= acked | {late}
            assert kept in recovered
        finally:
            broker.kill()
        lines = broker.output
        assert not any("Traceback" in line for line in lines)


@pytest.mark.parametrize("backend", ["chunked", "filelog", "sqlite"])
def test_a_broker_stopped_with_its_disk_full_brings_back_every_confirmed_message_and_no_nacked_one(
        tmp_path, backend):
    with small_filesystem(tmp_path / "disk", "4m") as disk:
        broker = BrokerProcess(["--backend", backend, "--data-dir", str(disk / "data"), "--native", "none",
                                "--disk-free-limit", "1"], cwd=tmp_path)
        try:
            publisher = connect(broker)
            channel = publisher.channel()
            channel.queue_declare(QUEUE, durable=True)
            channel.confirm_delivery()
            acked, nacked = publish_until_nacked(channel)
            # Stopped as it is: the publisher is blocked (its close would not be read), the disk full.
            broker.stop()
            assert not any("Traceback" in line for line in broker.output)
            broker.restart()  # on the disk still full
            consumer = connect(broker)
            recovered = drain(consumer)
            consumer.close()
            assert not set(recovered) & nacked, f"nacked messages came back: {sorted(set(recovered) & nacked)}"
            assert set(recovered) == acked
        finally:
            broker.kill()


def test_free_space_below_the_limit_blocks_publishers_until_it_is_back(tmp_path):
    with small_filesystem(tmp_path / "disk", "4m") as disk:
        broker = BrokerProcess(["--backend", "chunked", "--data-dir", str(disk / "data"), "--native", "none",
                                "--disk-free-limit", "2MiB", "--prometheus", "tcp:0:interface=127.0.0.1"],
                               cwd=tmp_path)
        try:
            api = api_of(broker)
            publisher = connect(broker)
            blocked, unblocked = [], []
            publisher.add_on_connection_blocked_callback(lambda _, frame: blocked.append(frame.method.reason))
            publisher.add_on_connection_unblocked_callback(lambda _, frame: unblocked.append(True))
            channel = publisher.channel()
            channel.queue_declare(QUEUE, durable=True)
            channel.confirm_delivery()
            channel.basic_publish("", QUEUE, body(1), pika.BasicProperties(delivery_mode=2))
            assert alarm_health(api)[0] == 200

            # Another writer takes the space: below 2 MiB free, the alarm is raised within a check or two.
            filler = disk / "filler"
            write_filler(filler, free_bytes(disk) - (1 << 20))
            poll_until(lambda: alarm_health(api)[0] == 503 or None, WAIT, "the disk alarm")
            node = api.get("/api/nodes")[0]
            assert (node["disk_free_alarm"], node["disk_free_limit"]) == (True, 2 << 20)
            metrics = metrics_of(broker)
            assert "rabbitmq_alarms_free_disk_space_watermark 1.0" in metrics
            assert "rabbitmq_disk_space_available_limit_bytes 2.097152e+06" in metrics
            available = [line for line in metrics.splitlines()
                         if line.startswith("rabbitmq_disk_space_available_bytes ")]
            assert len(available) == 1 and float(available[0].split()[1]) < 2 << 20

            held = publisher.channel()
            held.basic_publish("", QUEUE, body(2), pika.BasicProperties(delivery_mode=2))
            events_until(publisher, lambda: blocked, "connection.blocked")
            assert blocked == ["low on disk"]

            filler.unlink()
            events_until(publisher, lambda: unblocked, "connection.unblocked")
            channel.basic_publish("", QUEUE, body(3), pika.BasicProperties(delivery_mode=2))  # confirmed
            assert "rabbitmq_alarms_free_disk_space_watermark 0.0" in metrics_of(broker)
            consumer = connect(broker)
            assert drain(consumer) == [1, 2, 3]
            consumer.close()
            publisher.close()
            assert broker.stop() == 0
        finally:
            broker.kill()
        assert not any("Traceback" in line for line in broker.output)
        assert sum("free disk space is insufficient" in line for line in broker.output) == 1


def metrics_of(process):
    _, host, port = process.wait_listening("Prometheus metrics").split(":")
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        return response.read().decode()
