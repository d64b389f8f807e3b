"""Celery with quorum task queues (``task_default_queue_type = "quorum"``)
against a real broker subprocess.

Celery declares its task queue with ``x-queue-type: quorum``; its worker sees
that (``worker_detect_quorum_queues``) and sets its prefetch per consumer,
since a quorum queue refuses a consumer on a channel with a global prefetch
limit, as RabbitMQ's do.
"""

import uuid

import pytest

pytest.importorskip("celery")

from kombu import Connection  # noqa: E402

from tests.support.celery_worker import RESULT_TIMEOUT, celery_worker  # noqa: E402
from tests.support.client_broker import TRACEBACK_MARKS, logged_errors  # noqa: E402


@pytest.fixture(scope="module")
def quorum_setup(amqp_broker, tmp_path_factory):
    """(tasks module, worker, queue name): a worker consuming from a quorum queue of the module's broker."""
    queue = f"celery-quorum-{uuid.uuid4().hex[:12]}"
    with celery_worker(amqp_broker, tmp_path_factory.mktemp("celery-quorum"), queue, "quorum") as (tasks, worker):
        yield tasks, worker, queue


def test_tasks_round_trip_through_a_quorum_queue(quorum_setup, amqp_broker):
    tasks, worker, queue = quorum_setup
    first = len(amqp_broker.process.output)
    assert tasks.add.delay(2, 3).get(timeout=RESULT_TIMEOUT) == 5
    assert [result.get(timeout=RESULT_TIMEOUT) for result in [tasks.add.delay(n, n) for n in range(5)]] == [
        0, 2, 4, 6, 8]
    assert any("Global QoS is disabled" in line for line in worker.output), worker.log()
    assert worker.process.poll() is None, f"the worker exited; its output:\n{worker.log()}"
    assert not logged_errors(amqp_broker.process, first, TRACEBACK_MARKS), "\n".join(amqp_broker.process.output[first:])
    url = f"pyamqp://guest:guest@{amqp_broker.host}:{amqp_broker.amqp_port}//"
    with Connection(url) as connection:
        # The worker's queue is a quorum queue: declaring it so is equivalent, and it has the worker as consumer.
        channel = connection.default_channel
        name, messages, consumers = channel.queue_declare(
            queue, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
    assert (name, messages, consumers) == (queue, 0, 1)
