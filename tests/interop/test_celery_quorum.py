"""Celery with quorum task queues (``task_default_queue_type = "quorum"``)
against a real broker subprocess.

Celery declares its task queue with ``x-queue-type: quorum``; its worker sees
that (``worker_detect_quorum_queues``) and sets its prefetch per consumer,
since a quorum queue refuses a consumer on a channel with a global prefetch
limit, as RabbitMQ's do.
"""

import os
import sys
import uuid

import pytest

pytest.importorskip("celery")

from kombu import Connection  # noqa: E402

from tests.interop.conftest import TRACEBACK_MARKS, logged_errors  # noqa: E402
from tests.interop.test_celery import READY_TIMEOUT, REPO, RESULT_TIMEOUT, Worker, _import_tasks  # noqa: E402

TASKS_MODULE = '''\
"""Tasks for the brokerd Celery quorum-queue test; settings come from the environment."""

import os

from celery import Celery

app = Celery("brokerd_celery_quorum_tasks", broker=os.environ["BROKERD_CELERY_BROKER_URL"], backend="rpc://")
app.conf.update(
    task_default_queue=os.environ["BROKERD_CELERY_QUEUE"],
    task_default_queue_type="quorum",
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=False,
    broker_connection_max_retries=0,
    worker_hijack_root_logger=True,
)


@app.task(name="brokerd_celery_quorum_tasks.add")
def add(x, y):
    return x + y
'''


@pytest.fixture(scope="module")
def quorum_setup(amqp_broker, tmp_path_factory):
    """(tasks module, worker, queue name): a worker consuming from a quorum queue of the module's broker."""
    directory = tmp_path_factory.mktemp("celery-quorum")
    (directory / "brokerd_celery_quorum_tasks.py").write_text(TASKS_MODULE)
    queue = f"celery-quorum-{uuid.uuid4().hex[:12]}"
    settings = {
        "BROKERD_CELERY_BROKER_URL": f"pyamqp://guest:guest@{amqp_broker.host}:{amqp_broker.amqp_port}//",
        "BROKERD_CELERY_QUEUE": queue,
    }
    env = dict(os.environ, **settings, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory), str(REPO), os.environ.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "celery", "-A", "brokerd_celery_quorum_tasks", "worker",
        "--pool=solo", "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-l", "info", "--hostname", f"quorum-{uuid.uuid4().hex[:8]}@%h",
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        tasks = _import_tasks(directory / "brokerd_celery_quorum_tasks.py")
    worker = Worker(command, directory, env)
    try:
        worker.wait_for_line(" ready.", READY_TIMEOUT)
        yield tasks, worker, queue
    finally:
        try:
            tasks.app.close()
        finally:
            # A solo worker that has run a task takes some 10 s to stop on SIGTERM (on RabbitMQ too);
            # nothing is checked after the test, so it is killed.
            worker.process.kill()
            worker.stop()


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
