"""Definitions carry runtime parameters, global parameters, vhost limits and user limits in RabbitMQ 3.10's format:
an export a RabbitMQ 3.10.8 node wrote after set_vhost_limits, set_user_limits and set_global_parameter loads and
its limits hold over AMQP, brokerd's export writes them as RabbitMQ does, an export imports into a fresh broker
unchanged, and an import that would take a vhost past its max-queues is refused in RabbitMQ's words."""

import contextlib
import json

import pika.exceptions
import pytest

from brokerd.testing import BrokerProcess
from tests.support.httpapi import Api, amqp
from tests.support.paths import ROOT

RABBITMQ_EXPORT = ROOT / "tests" / "support" / "data" / "rabbitmq-3.10.8-limits-export.json"


def start(directory):
    return BrokerProcess(["--backend=memory", "--native", "none"], cwd=directory)


@pytest.fixture()
def fresh(tmp_path):
    process = start(tmp_path)
    yield process, Api(process.wait_listening("HTTP API"))
    assert process.stop() == 0


def test_a_rabbitmq_export_with_limits_and_parameters_loads_and_its_limits_hold(fresh):
    broker, api = fresh
    document = json.loads(RABBITMQ_EXPORT.read_text())
    assert api.post("/api/definitions", document) == (204, None)
    assert api.get("/api/vhost-limits") == [
        {"vhost": "i31-limits-v", "value": {"max-connections": 7, "max-queues": 20}}]
    assert api.get("/api/user-limits") == [{"user": "i31-limits-u", "value": {"max-channels": 4, "max-connections": 3}}]
    # RabbitMQ's internal_cluster_id names the cluster it came from: not taken over
    assert api.get("/api/global-parameters") == [{"name": "i31-limits-g", "value": {"x": [1, 3]}}]
    exported = api.get("/api/definitions")
    assert exported["parameters"] == document["parameters"]
    assert [user for user in exported["users"] if user["name"] == "i31-limits-u"] == document["users"]
    assert api.get("/api/definitions/i31-limits-v")["parameters"] == document["parameters"]  # vhost kept, as RabbitMQ
    connections = [amqp(broker, "i31-limits-u", "pw", "i31-limits-v") for _ in range(3)]  # RabbitMQ's hash of "pw"
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            amqp(broker, "i31-limits-u", "pw", "i31-limits-v")
        assert "user connection limit (3) is reached" in str(refused.value)
    finally:
        for connection in connections:
            connection.close()


def test_an_export_imports_into_a_fresh_broker_unchanged(fresh, tmp_path):
    _, api = fresh
    assert api.put("/api/vhosts/shop", {}) == (201, None)
    assert api.put("/api/vhost-limits/shop/max-queues", {"value": 4}) == (204, None)
    assert api.put("/api/user-limits/guest/max-connections", {"value": 50}) == (204, None)
    assert api.put("/api/global-parameters/cluster_name", {"value": "shop-cluster"}) == (201, None)
    exported = api.get("/api/definitions")
    assert exported["parameters"] == [
        {"value": {"max-queues": 4}, "vhost": "shop", "component": "vhost-limits", "name": "limits"}]
    assert exported["global_parameters"] == [{"name": "cluster_name", "value": "shop-cluster"}]
    assert [user["limits"] for user in exported["users"] if user["name"] == "guest"] == [{"max-connections": 50}]
    (tmp_path / "other").mkdir()
    other = start(tmp_path / "other")
    try:
        other_api = Api(other.wait_listening("HTTP API"))
        assert other_api.post("/api/definitions", exported) == (204, None)
        again = other_api.get("/api/definitions")
        for section in ("users", "parameters", "global_parameters"):
            assert again[section] == exported[section], section
        assert other_api.get("/api/overview")["cluster_name"] == "shop-cluster"
    finally:
        assert other.stop() == 0


def test_an_import_past_a_vhosts_max_queues_is_refused_before_anything_changes(fresh):
    broker, api = fresh
    assert api.put("/api/vhost-limits/%2F/max-queues", {"value": 1}) == (204, None)
    with contextlib.closing(amqp(broker)) as connection:
        connection.channel().queue_declare("there")
    queues = [{"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
              for name in ("there", "new1", "new2")]
    status, body, _ = api.request("POST", "/api/definitions", {"queues": queues, "global_parameters": [
        {"name": "not-kept", "value": 1}]})
    assert (status, body["reason"]) == (400, 'Adding 2 queue(s) to virtual host "/" would exceed the limit of 1'
                                             ' queue(s).\n\nThis virtual host currently has 1 queue(s) defined.'
                                             '\n\nImport aborted!')
    assert api.get("/api/global-parameters") == []


def test_a_bad_parameter_or_user_limit_refuses_the_import(fresh):
    _, api = fresh
    status, body, _ = api.request("POST", "/api/definitions", {"parameters": [
        {"value": {}, "vhost": "/", "component": "shovel", "name": "s"}]})
    assert (status, body["reason"]) == (400, "parameters: Validation failed\n\ncomponent shovel not found"
                                             " (shovel 's' in vhost '/')")
    status, body, _ = api.request("POST", "/api/definitions", {"users": [
        {"name": "u", "password": "p", "tags": [], "limits": {"max-queues": 1}}]})
    assert (status, body["reason"]) == (
        400, "users: Unrecognised terms [{<<\"max-queues\">>,1}] in user-limits (user 'u')")
    assert api.request("GET", "/api/users/u")[0] == 404
