"""Celery end to end against a real broker subprocess.

A real ``celery worker`` subprocess (solo pool) consumes from the broker, and
this process sends tasks and collects their results through the ``rpc://``
result backend: results travel back as messages to the caller's reply queue
(an auto-delete queue named after the caller) matched by correlation id, so a
round trip covers publishing, consuming, acknowledging and reply routing.
"""

import contextlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import threading
import time
import uuid

import pytest

pytest.importorskip("celery")

from celery import chain, group  # noqa: E402
from kombu import Connection  # noqa: E402

from tests.support.client_broker import TRACEBACK_MARKS, logged_errors  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
READY_TIMEOUT = 30.0
RESULT_TIMEOUT = 30.0

TASKS_MODULE = '''\
"""Tasks for the brokerd Celery interop test; settings come from the environment."""

import os

from celery import Celery

app = Celery("brokerd_celery_tasks", broker=os.environ["BROKERD_CELERY_BROKER_URL"], backend="rpc://")
app.conf.update(
    task_default_queue=os.environ["BROKERD_CELERY_QUEUE"],
    task_default_queue_type=os.environ.get("BROKERD_CELERY_QUEUE_TYPE", "classic"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=False,
    broker_connection_max_retries=0,
    worker_hijack_root_logger=True,
)


@app.task(name="brokerd_celery_tasks.add")
def add(x, y):
    return x + y


@app.task(name="brokerd_celery_tasks.total")
def total(numbers):
    return sum(numbers)


@app.task(name="brokerd_celery_tasks.fail")
def fail(message):
    raise ValueError(message)
'''


class Worker:
    """A ``celery worker`` subprocess whose output is collected by a thread."""

    def __init__(self, command, cwd, env):
        self.output = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for line in self.process.stdout:
            with self._changed:
                self.output.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for_line(self, text, timeout):
        """Waits until a line containing text appears; fails if the worker exits or the deadline passes."""
        deadline = time.monotonic() + timeout

        def found():
            return any(text in line for line in self.output)

        with self._changed:
            while not found():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None:
                    break
                self._changed.wait(remaining)
            if found():
                return
        state = f"exited with {self.process.returncode}" if self.process.poll() is not None else "still running"
        raise AssertionError(f"worker printed no {text!r} within {timeout} s ({state}); output:\n{self.log()}")

    def log(self):
        with self._changed:
            return "\n".join(self.output)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        self._reader.join(15)


def _import_tasks(path):
    spec = importlib.util.spec_from_file_location("brokerd_celery_tasks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def celery_worker(amqp_broker, directory, queue, queue_type="classic"):
    """
    Gives (tasks module, worker) for a solo
    worker consuming C{queue} (declared as C{queue_type}) from the module's
    broker, with the same tasks imported here; stops both afterwards.
    """
    (directory / "brokerd_celery_tasks.py").write_text(TASKS_MODULE)
    settings = {
        "BROKERD_CELERY_BROKER_URL": f"pyamqp://guest:guest@{amqp_broker.host}:{amqp_broker.amqp_port}//",
        "BROKERD_CELERY_QUEUE": queue,
        "BROKERD_CELERY_QUEUE_TYPE": queue_type,
    }
    env = dict(os.environ, **settings, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory), str(REPO), os.environ.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "celery", "-A", "brokerd_celery_tasks", "worker",
        "--pool=solo", "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-l", "info", "--hostname", f"interop-{uuid.uuid4().hex[:8]}@%h",
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        tasks = _import_tasks(directory / "brokerd_celery_tasks.py")
    worker = Worker(command, directory, env)
    try:
        worker.wait_for_line(" ready.", READY_TIMEOUT)
        yield tasks, worker
    finally:
        try:
            tasks.app.close()
        finally:
            # A solo worker that has run a task takes some 10 s to stop on SIGTERM (on RabbitMQ too);
            # nothing is checked after the tests, so it is killed.
            worker.process.kill()
            worker.stop()


@pytest.fixture(scope="module")
def celery_setup(amqp_broker, tmp_path_factory):
    """(tasks module, worker): a worker consuming from the module's broker, and the same tasks here."""
    with celery_worker(amqp_broker, tmp_path_factory.mktemp("celery"), f"celery-interop-{uuid.uuid4().hex[:12]}") as setup:
        yield setup


@pytest.fixture
def tasks(celery_setup, amqp_broker):
    """The tasks module; fails the test if the worker died or the broker logged a traceback meanwhile."""
    tasks, worker = celery_setup
    first, worker_first = len(amqp_broker.process.output), len(worker.output)
    yield tasks
    assert worker.process.poll() is None, f"the worker exited; its output:\n{worker.log()}"
    assert not logged_errors(amqp_broker.process, first, TRACEBACK_MARKS), "\n".join(amqp_broker.process.output[first:])
    errors = [
        line for line in worker.output[worker_first:]
        if ("ERROR/" in line or "CRITICAL/" in line) and "Task brokerd_celery_tasks.fail[" not in line
    ]
    assert not errors, f"the worker logged errors; its output:\n{worker.log()}"


def test_add_round_trip(tasks):
    result = tasks.add.delay(2, 3)
    assert result.get(timeout=RESULT_TIMEOUT) == 5
    assert result.successful()
    assert result.state == "SUCCESS"


def test_several_results_in_flight(tasks):
    results = [tasks.add.delay(n, n) for n in range(10)]
    assert [result.get(timeout=RESULT_TIMEOUT) for result in reversed(results)] == [2 * n for n in reversed(range(10))]


def test_chain(tasks):
    workflow = chain(tasks.add.s(1, 2), tasks.add.s(3), tasks.add.s(4))
    assert workflow.apply_async().get(timeout=RESULT_TIMEOUT) == 10


def test_group(tasks):
    result = group(tasks.add.s(n, 10) for n in range(5)).apply_async()
    assert result.get(timeout=RESULT_TIMEOUT) == [10, 11, 12, 13, 14]


def test_chain_of_a_group_into_a_task(tasks):
    # A group followed by a task is upgraded to a chord in Celery; rpc:// keeps
    # chord results with the caller, so here the group's results come back to
    # this process and are passed on explicitly.
    partials = group(tasks.add.s(n, n) for n in range(4)).apply_async().get(timeout=RESULT_TIMEOUT)
    assert tasks.total.delay(partials).get(timeout=RESULT_TIMEOUT) == 12


def test_results_come_back_through_the_callers_reply_queue(tasks, amqp_broker):
    result = tasks.add.delay(20, 22)
    assert result.get(timeout=RESULT_TIMEOUT) == 42
    reply_queue = tasks.app.backend.binding
    assert reply_queue.auto_delete
    url = f"pyamqp://guest:guest@{amqp_broker.host}:{amqp_broker.amqp_port}//"
    with Connection(url) as connection:
        name, messages, consumers = reply_queue.bind(connection.default_channel).queue_declare(passive=True)
    assert (name, messages, consumers) == (tasks.app.backend.oid, 0, 1)


def test_failing_task_raises_its_exception(tasks):
    result = tasks.fail.delay("boom from the worker")
    with pytest.raises(ValueError, match="boom from the worker"):
        result.get(timeout=RESULT_TIMEOUT)
    assert result.state == "FAILURE"
    assert result.failed()
    assert "ValueError" in result.traceback


def test_failing_task_without_propagation(tasks):
    result = tasks.fail.delay("quiet failure")
    returned = result.get(timeout=RESULT_TIMEOUT, propagate=False)
    assert isinstance(returned, ValueError)
    assert str(returned) == "quiet failure"
