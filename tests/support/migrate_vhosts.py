"""A broker whose vhosts have stores of their own, filled through a real broker for the
migration tests: C{/} on the broker's C{--backend}, vhosts made with C{brokerd-admin add-vhost
--backend}, messages published with pika (some acked, one returned unacked, one transient, one
delayed), and what a pika client is served from each vhost afterwards."""

import pika

from tests.support.admin_cli import admin, http_url
from tests.support.client_broker import start_broker
from tests.support.pika_clients import wait_for_body

DIRECT = "mig.direct"
DELAYED = "mig.delayed"
QUEUES = ("jobs", "prio", "copy")  # copy is bound beside jobs: one message stored for both
LATER = "later"
DELAY_MS = 1500
BIG = 200_000  # one body larger than a chunk's read cache line and sqlite's page


def connection_to(running, vhost):
    return pika.BlockingConnection(pika.ConnectionParameters(
        running.host, running.amqp_port, vhost, pika.PlainCredentials("guest", "guest")))


def start_with_api(tmp_path, backend, data_dir):
    """A broker on C{backend} and C{data_dir} with its management API: C{(running, url)}."""
    running = start_broker(tmp_path, "--backend", backend, "--data-dir", str(data_dir),
                           "--http", "tcp:0:interface=127.0.0.1")
    return running, http_url(running.process)


def add_vhost(url, name, backend):
    """C{brokerd-admin add-vhost NAME --backend BACKEND}, and every permission on it for guest."""
    for command in (("add-vhost", name, "--backend", backend),
                    ("set-permissions", "--vhost", name, "guest", ".*", ".*", ".*")):
        status, _, errors = admin(url, *command)
        assert status == 0, errors


def sent_bodies(vhost):
    """The persistent bodies published to jobs (and copy) in C{vhost}, in order."""
    tag = vhost.strip("/") or "default"
    return [f"{tag}-{number}".encode() for number in range(6)] + [tag.encode() * (BIG // len(tag))]


def fill(running, vhost):
    """
    Declare the set's topology in C{vhost} and publish into it: persistent messages with
    properties to jobs and copy, three priorities to prio, one transient message, one delayed
    message; then ack jobs' first message and return its second unacked (redelivered, with a
    delivery count).
    """
    connection = connection_to(running, vhost)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(DIRECT, "direct", durable=True)
        channel.exchange_declare(DELAYED, "x-delayed-message", durable=True,
                                 arguments={"x-delayed-type": "direct"})
        channel.queue_declare("jobs", durable=True)
        channel.queue_declare("copy", durable=True)
        channel.queue_declare("prio", durable=True, arguments={"x-max-priority": 9})
        channel.queue_declare(LATER, durable=True)
        channel.queue_bind("jobs", DIRECT, "work")
        channel.queue_bind("copy", DIRECT, "work")
        channel.queue_bind(LATER, DELAYED, LATER)
        for number, body in enumerate(sent_bodies(vhost)):
            channel.basic_publish(DIRECT, "work", body, pika.BasicProperties(
                delivery_mode=2, message_id=f"m{number}", correlation_id=vhost, content_type="text/plain",
                headers={"vhost": vhost, "n": number}, app_id="migrate-test", type="job", timestamp=1_700_000_000,
                expiration="3600000" if number == 3 else None))
        channel.basic_publish(DIRECT, "work", b"transient", pika.BasicProperties(delivery_mode=1))
        for body, priority in ((b"low", 1), (b"high", 8), (b"mid", 5)):
            channel.basic_publish("", "prio", body, pika.BasicProperties(delivery_mode=2, priority=priority))
        channel.basic_publish(DELAYED, LATER, b"delayed " + vhost.encode(), pika.BasicProperties(
            delivery_mode=2, headers={"x-delay": DELAY_MS}))
        first, _, _ = channel.basic_get("jobs")
        channel.basic_ack(first.delivery_tag)
        second, _, _ = channel.basic_get("jobs")
        channel.basic_nack(second.delivery_tag, requeue=True)
    finally:
        connection.close()


def declare_only(running, vhost):
    """Topology and no message in C{vhost}: an exchange, a durable queue bound to it."""
    connection = connection_to(running, vhost)
    try:
        channel = connection.channel()
        channel.exchange_declare(DIRECT, "direct", durable=True)
        channel.queue_declare("idle", durable=True, arguments={"x-max-length": 10})
        channel.queue_bind("idle", DIRECT, "idle")
    finally:
        connection.close()


def drain(channel, queue):
    """Every message of C{queue}, acked: C{(body, redelivered, properties)} in delivery order."""
    got = []
    while True:
        method, properties, body = channel.basic_get(queue)
        if method is None:
            return got
        got.append((body, method.redelivered, dict(vars(properties))))
        channel.basic_ack(method.delivery_tag)


def served(running, vhost):
    """What C{vhost} serves: each queue of the set drained, the delayed message awaited."""
    connection = connection_to(running, vhost)
    try:
        channel = connection.channel()
        found = {queue: drain(channel, queue) for queue in QUEUES}
        found[LATER] = wait_for_body(channel, LATER)
        return found
    finally:
        connection.close()


def served_idle(running, vhost):
    """C{vhost} of L{declare_only}: its queue (declared passively, its message count) and whether a
    message published to its exchange reaches it."""
    connection = connection_to(running, vhost)
    try:
        channel = connection.channel()
        count = channel.queue_declare("idle", passive=True).method.message_count
        channel.basic_publish(DIRECT, "idle", b"routed")
        return count, [body for body, _, _ in drain(channel, "idle")]
    finally:
        connection.close()
