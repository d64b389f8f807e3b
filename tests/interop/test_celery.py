"""Celery end to end against a real broker subprocess.

A real ``celery worker`` subprocess (solo pool) consumes from the broker, and
this process sends tasks and collects their results through the ``rpc://``
result backend: results travel back as messages to the caller's reply queue
(an auto-delete queue named after the caller) matched by correlation id, so a
round trip covers publishing, consuming, acknowledging and reply routing.
"""


import pytest

pytest.importorskip("celery")

from celery import chain, group  # noqa: E402
from kombu import Connection  # noqa: E402

from tests.support.celery_worker import RESULT_TIMEOUT  # noqa: E402
from tests.support.celery_worker import celery_setup, tasks  # noqa: E402, F401 (celery_setup, tasks: fixtures)


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
