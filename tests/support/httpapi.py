"""What the HTTP management API's test modules share: a broker process and an HTTP client on urllib.

The fixtures C{broker} (one memory-backend broker per module, checked to stop
cleanly) and C{api} (guest's client of its HTTP API) are used by importing them.
"""

import base64
import json
import pathlib
import shutil
import sys
import urllib.error
import urllib.request
from urllib.parse import quote

import pika
import pytest

from brokerd.testing import BrokerProcess

TIMEOUT = 10
# RabbitMQ's own rabbitmqadmin: Debian's rabbitmq-server installs it; .ci/run takes it from that package otherwise.
RABBITMQADMIN = shutil.which("rabbitmqadmin") or shutil.which("rabbitmqadmin",
                                                               path=str(pathlib.Path(sys.executable).parent))


def module_broker(tmp_path_factory, *arguments):
    """A memory-backend broker for one module (a fixture's body): stopped at the end, with exit 0 and no traceback."""
    process = BrokerProcess(["--backend=memory", "--native", "none", *arguments],
                            cwd=tmp_path_factory.mktemp("broker"))
    yield process
    assert process.stop() == 0  # HTTP clients do not hold up a clean stop
    assert not any("Traceback" in line for line in process.output)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory)


@pytest.fixture(scope="module")
def api(broker):
    return Api(broker.wait_listening("HTTP API"))


def amqp(broker, user="guest", password="guest", vhost="/"):
    """A pika connection to C{broker} as C{user} on C{vhost}."""
    host, port = broker.wait_address("AMQP")
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, port, vhost, pika.PlainCredentials(user, password), connection_attempts=1, socket_timeout=10))


class Api:
    """Requests to a broker's management API as one user; answers are C{(status, JSON or None, headers)}."""

    def __init__(self, endpoint, user="guest", password="guest"):
        _, host, port = endpoint.split(":")
        self.base = f"http://{host}:{port}"
        self.user, self.password = user, password

    def as_user(self, user, password):
        api = Api("tcp:127.0.0.1:0")
        api.base, api.user, api.password = self.base, user, password
        return api

    def request(self, method, path, body=None, headers=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if self.user is not None:
            credentials = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {credentials}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                status, raw, answer_headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, raw, answer_headers = error.code, error.read(), error.headers
        return status, (json.loads(raw) if raw else None), answer_headers

    def get(self, path):
        status, body, _ = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body

    def put(self, path, body=None):
        return self.request("PUT", path, body if body is not None else {})[:2]

    def post(self, path, body=None):
        return self.request("POST", path, body if body is not None else {})[:2]

    def delete(self, path, headers=None):
        return self.request("DELETE", path, headers=headers)[:2]


def segment(name):
    """A path segment as RabbitMQ's clients write it: every reserved character encoded (C{/} is C{%2F})."""
    return quote(name, safe="")
