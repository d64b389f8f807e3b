"""RabbitMQ's own rabbitmqadmin against brokerd's runtime parameters and vhost limits: list parameters and
vhost_limits, declare and delete a parameter and a vhost limit, on a real broker."""

import json
import subprocess
import sys

import pytest

from tests.support.httpapi import RABBITMQADMIN, broker  # noqa: F401 (broker: the module's fixture)

pytestmark = pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin (RabbitMQ's) is not installed here")


@pytest.fixture(scope="module")
def admin(broker):
    _, port = broker.wait_address("HTTP API")

    def run(*args):
        finished = subprocess.run([sys.executable, RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port),
                                   "-u", "guest", "-p", "guest", *args], capture_output=True, text=True, timeout=30)
        return finished.returncode, finished.stdout, finished.stderr

    return run


def listing(admin, kind):
    status, out, errors = admin("-f", "raw_json", "list", kind)
    assert status == 0, errors
    return json.loads(out)


def test_declare_list_and_delete_a_parameter(admin):
    assert admin("declare", "parameter", "component=vhost-limits", "name=limits", 'value={"max-queues": 9}')[:2] == (
        0, "parameter declared\n")
    assert listing(admin, "parameters") == [
        {"value": {"max-queues": 9}, "vhost": "/", "component": "vhost-limits", "name": "limits"}]
    assert listing(admin, "vhost_limits") == [{"vhost": "/", "value": {"max-queues": 9}}]
    status, _, errors = admin("declare", "parameter", "component=shovel", "name=s", "value={}")
    assert status != 0 and "component shovel not found" in errors
    assert admin("delete", "parameter", "component=vhost-limits", "name=limits")[:2] == (0, "parameter deleted\n")
    assert listing(admin, "parameters") == []


def test_declare_and_delete_a_vhost_limit(admin):
    assert admin("declare", "vhost_limit", "vhost=/", "name=max-connections", "value=100")[:2] == (
        0, "vhost_limit declared\n")
    assert listing(admin, "vhost_limits") == [{"vhost": "/", "value": {"max-connections": 100}}]
    assert admin("delete", "vhost_limit", "vhost=/", "name=max-connections")[:2] == (0, "vhost_limit deleted\n")
    assert listing(admin, "vhost_limits") == []
