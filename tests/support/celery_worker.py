"""A real ``celery worker`` subprocess against the test broker, with the tasks module it runs
(fixtures), for the Celery tests."""

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.support.client_broker import TRACEBACK_MARKS, logged_errors  # noqa: E402
from tests.support.paths import ROOT

REPO = ROOT

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
    name = f"celery-interop-{uuid.uuid4().hex[:12]}"
    with celery_worker(amqp_broker, tmp_path_factory.mktemp("celery"), name) as setup:
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
