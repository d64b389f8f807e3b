"""The HTTP API and dashboard write no log line per request unless --http-access-log asks for them.

RabbitMQ's management listener logs no requests by default; an open dashboard polls the API every few seconds,
so a line per request would fill the broker's log. Each test runs a real broker and requests the dashboard's
page and /api/overview as a browser would.
"""

import urllib.request

import pytest

from tests.support.httpapi import Api, amqp, module_broker

pytestmark = pytest.mark.long_module(seconds=8)  # started early (tests/conftest.py)


@pytest.fixture(scope="module")
def quiet_broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory)


@pytest.fixture(scope="module")
def logging_broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory, "--http-access-log")


def browse(broker):
    """The dashboard's page, then the overview it polls, both answered 200."""
    api = Api(broker.wait_listening("HTTP API"))
    with urllib.request.urlopen(api.base + "/", timeout=10) as page:
        assert page.status == 200
    assert "object_totals" in api.get("/api/overview")  # get() asserts 200


def request_lines(broker):
    return [line for line in broker.output if '"GET /' in line]


def test_by_default_a_dashboard_and_api_request_writes_no_log_line(quiet_broker):
    browse(quiet_broker)
    # A line the broker writes after the requests: a request's line, had there been one, would be before it.
    amqp(quiet_broker).close()
    quiet_broker.wait_for_output("accepted AMQP connection")
    assert request_lines(quiet_broker) == []


def test_with_http_access_log_each_request_is_a_line(logging_broker):
    browse(logging_broker)
    line = logging_broker.wait_for_output(r'"GET /api/overview HTTP/1\.1" 200 ')
    assert '"127.0.0.1" - - [' in line
    logging_broker.wait_for_output(r'"GET / HTTP/1\.1" 200 ')
