"""brokerd-admin's runtime parameter, global parameter and limit commands (rabbitmqctl's set_parameter,
set_global_parameter, set_vhost_limits, set_user_limits and their clear_ commands) against one real broker over
real HTTP: the change in effect for the API and for pika, the listings, and refusals in RabbitMQ's words."""

import json

import pika.exceptions
import pytest

from tests.support.admin_cli import admin, http_url
from tests.support.httpapi import amqp, broker  # noqa: F401 (the module's fixture)


@pytest.fixture(scope="module")
def url(broker):
    return http_url(broker)


def listed(url, kind):
    status, text, errors = admin(url, "--format", "json", "list", kind)
    assert (status, errors) == (0, "")
    return json.loads(text)


def test_vhost_limits_are_set_listed_enforced_and_cleared(broker, url):
    assert admin(url, "add-vhost", "metered")[0] == 0
    assert admin(url, "set-permissions", "--vhost", "metered", "guest", ".*", ".*", ".*")[0] == 0
    assert admin(url, "set-vhost-limits", "--vhost", "metered", '{"max-connections": 0, "max-queues": 5}') == (
        0, 'Set the limits of vhost metered to {"max-connections": 0, "max-queues": 5}\n', "")
    assert listed(url, "vhost-limits") == [{"vhost": "metered", "value": {"max-connections": 0, "max-queues": 5}}]
    status, table, _ = admin(url, "list", "parameters")
    assert status == 0 and "metered  vhost-limits  limits" in table
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        amqp(broker, vhost="metered")
    assert "connection limit (0) is reached" in str(refused.value)
    assert admin(url, "set-vhost-limits", "--vhost", "metered", '{"max-connections": "x"}') == (
        1, "", 'error: HTTP 400 bad_request - Validation failed\n\nmax-connections should be a number,'
               ' actually was &lt;&lt;"x"&gt;&gt;\n\n')
    assert admin(url, "clear-vhost-limits", "--vhost", "metered") == (0, "Cleared the limits of vhost metered\n", "")
    assert admin(url, "clear-vhost-limits", "--vhost", "metered")[0] == 0  # none is no error
    amqp(broker, vhost="metered").close()
    assert listed(url, "vhost-limits") == []


def test_user_limits_are_merged_and_cleared_one_or_all(url):
    assert admin(url, "add-user", "meter", "pw")[0] == 0
    assert admin(url, "set-user-limits", "meter", '{"max-connections": 2}')[0] == 0
    assert admin(url, "set-user-limits", "meter", '{"max-channels": 8}') == (
        0, 'Set the limits of user meter to {"max-channels": 8}\n', "")
    assert listed(url, "user-limits") == [{"user": "meter", "value": {"max-channels": 8, "max-connections": 2}}]
    assert admin(url, "set-user-limits", "meter", '{"max-queues": 1}') == (
        1, "", "error: HTTP 400 bad_request - Unrecognised terms [{<<\"max-queues\">>,1}] in user-limits\n")
    assert admin(url, "clear-user-limits", "meter", "max-channels") == (
        0, "Cleared max-channels limits of user meter\n", "")
    assert listed(url, "user-limits") == [{"user": "meter", "value": {"max-connections": 2}}]
    assert admin(url, "clear-user-limits", "meter", "all")[0] == 0
    assert listed(url, "user-limits") == []


def test_parameters_and_global_parameters(url):
    assert admin(url, "set-parameter", "vhost-limits", "limits", '{"max-queues": 100}') == (
        0, "Set runtime parameter limits for component vhost-limits in vhost /\n", "")
    assert {"value": {"max-queues": 100}, "vhost": "/", "component": "vhost-limits", "name": "limits"} in listed(
        url, "parameters")
    assert admin(url, "set-parameter", "nosuch", "x", "{}") == (
        1, "", "error: HTTP 400 bad_request - Validation failed\n\ncomponent nosuch not found\n\n")
    assert admin(url, "clear-parameter", "vhost-limits", "limits")[0] == 0
    assert admin(url, "clear-parameter", "vhost-limits", "limits") == (
        1, "", "error: HTTP 404 Object Not Found - Not Found\n")
    assert admin(url, "set-global-parameter", "cluster_name", '"blue"') == (
        0, "Set global runtime parameter cluster_name\n", "")
    assert listed(url, "global-parameters") == [{"name": "cluster_name", "value": "blue"}]
    assert admin(url, "clear-global-parameter", "cluster_name")[0] == 0
    assert listed(url, "global-parameters") == []
