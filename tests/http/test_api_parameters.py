"""Runtime parameters, global parameters, vhost limits and user limits over the HTTP management API of a
real broker: RabbitMQ 3.10.8's JSON shapes, statuses and refusal texts (each checked against a RabbitMQ 3.10.8
node), cluster_name in the overview, and everything kept across a restart."""

from brokerd.testing import BrokerProcess
from tests.support.httpapi import Api, api, broker  # noqa: F401 (api, broker: the module's fixtures)

LIMITS_VALUE = {"max-connections": 3, "max-queues": 2}


def test_a_vhost_limits_parameter_in_rabbitmqs_shapes(api):
    assert api.put("/api/vhosts/params", {}) == (201, None)
    path = "/api/parameters/vhost-limits/params/limits"
    assert api.put(path, {"value": LIMITS_VALUE}) == (201, None)
    assert api.put(path, {"value": LIMITS_VALUE}) == (204, None)
    entry = {"value": LIMITS_VALUE, "vhost": "params", "component": "vhost-limits", "name": "limits"}
    assert api.get(path) == entry
    assert entry in api.get("/api/parameters")
    assert api.get("/api/parameters/vhost-limits/params") == [entry]
    assert api.get("/api/parameters/vhost-limits") == [entry]
    assert api.get("/api/parameters/nosuch") == []  # RabbitMQ lists an unknown component as empty
    assert api.get("/api/vhost-limits/params") == [{"vhost": "params", "value": LIMITS_VALUE}]
    assert {"vhost": "params", "value": LIMITS_VALUE} in api.get("/api/vhost-limits")
    assert api.delete(path) == (204, None)
    assert api.request("GET", path)[:2] == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api.delete(path)[0] == 404
    assert api.get("/api/vhost-limits/params") == []


def test_parameter_refusals_in_rabbitmqs_words(api):
    def refusal(path, body):
        status, answer, _ = api.request("PUT", path, body)
        assert status == 400 and answer["error"] == "bad_request", answer
        return answer["reason"]

    assert refusal("/api/parameters/nosuch/%2F/x", {"value": {"a": 1}}) == (
        "Validation failed\n\ncomponent nosuch not found\n")
    # brokerd runs no shovels or federation yet: refused as by a RabbitMQ without those plugins
    assert refusal("/api/parameters/shovel/%2F/x", {"value": {}}) == "Validation failed\n\ncomponent shovel not found\n"
    assert refusal("/api/parameters/policy/%2F/x", {"value": {}}) == "policies may not be set using this method"
    limits = "/api/parameters/vhost-limits/%2F/limits"
    assert refusal(limits, {"valu": 1}) == "[{key_missing,value}]"
    assert refusal(limits, {"value": {"max-connections": "a", "zz": 1, "max-queues": True, "aa": "b"}}) == (
        'Validation failed\n\nUnrecognised terms [{&lt;&lt;"aa"&gt;&gt;,&lt;&lt;"b"&gt;&gt;},{&lt;&lt;"zz"&gt;&gt;,1}]'
        ' in limits\nmax-queues should be a number, actually was true\n'
        'max-connections should be a number, actually was &lt;&lt;"a"&gt;&gt;\n')
    assert refusal(limits, {"value": {"max-connections": 1.5}}) == (
        "Validation failed\n\nmax-connections should be a number, actually was 1.5\n")
    assert refusal(limits, {"value": 5}) == "Validation failed\n\nlimits not a list 5\n"
    assert refusal(limits, {"value": [1, 2]}) == "Validation failed\n\nUnrecognised terms [1,2] in limits\n"
    status, answer, _ = api.request("PUT", "/api/parameters/vhost-limits/nowhere/limits", {"value": {}})
    assert (status, answer) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert api.request("DELETE", "/api/parameters/nosuch/%2F/x")[0] == 404
    assert api.get("/api/parameters/vhost-limits/%2F") == []  # nothing refused was kept


def test_vhost_limits_one_at_a_time(api):
    assert api.put("/api/vhosts/vlimits", {}) == (201, None)
    assert api.put("/api/vhost-limits/vlimits/max-connections", {"value": 7}) == (204, None)
    assert api.put("/api/vhost-limits/vlimits/max-queues", {"value": -1}) == (204, None)
    assert api.get("/api/vhost-limits/vlimits") == [
        {"vhost": "vlimits", "value": {"max-connections": 7, "max-queues": -1}}]
    status, answer, _ = api.request("PUT", "/api/vhost-limits/vlimits/max-connections", {"value": "x"})
    assert (status, answer["reason"]) == (
        400, 'Validation failed\n\nmax-connections should be a number, actually was <<"x">>\n')
    status, answer, _ = api.request("PUT", "/api/vhost-limits/vlimits/foo", {"value": 7})
    assert (status, answer["reason"]) == (400, 'Validation failed\n\nUnrecognised terms [{<<"foo">>,7}] in limits\n')
    assert api.request("PUT", "/api/vhost-limits/vlimits/max-queues", {})[:2] == (
        400, {"error": "bad_request", "reason": "[{key_missing,value}]"})
    assert api.request("PUT", "/api/vhost-limits/nowhere/max-queues", {"value": 1})[:2] == (
        404, {"error": "not_found", "reason": "vhost_not_found"})
    assert api.request("GET", "/api/vhost-limits/nowhere")[0] == 404
    assert api.request("GET", "/api/vhost-limits/vlimits/max-queues")[0] == 405  # as RabbitMQ: PUT and DELETE only
    assert api.delete("/api/vhost-limits/vlimits/max-queues") == (204, None)
    assert api.delete("/api/vhost-limits/vlimits/max-queues") == (204, None)  # none is no error
    assert api.get("/api/vhost-limits/vlimits") == [{"vhost": "vlimits", "value": {"max-connections": 7}}]
    assert api.delete("/api/vhost-limits/vlimits/max-connections") == (204, None)
    assert api.get("/api/vhost-limits/vlimits") == []


def test_user_limits_in_rabbitmqs_shapes(api):
    assert api.put("/api/users/limited", {"password": "pw", "tags": ""}) == (201, None)
    assert api.put("/api/user-limits/limited/max-connections", {"value": 3}) == (204, None)
    assert api.put("/api/user-limits/limited/max-channels", {"value": 4}) == (204, None)
    value = {"max-channels": 4, "max-connections": 3}
    assert api.get("/api/user-limits/limited") == [{"user": "limited", "value": value}]
    assert {"user": "limited", "value": value} in api.get("/api/user-limits")
    assert api.get("/api/user-limits/guest") == []
    assert api.get("/api/users/limited")["limits"] == value
    assert api.get("/api/users/guest")["limits"] == {}
    assert api.put("/api/users/limited", {"password": "pw2", "tags": ""}) == (204, None)
    assert api.get("/api/users/limited")["limits"] == value  # a user's update keeps its limits

    def refusal(path, body):
        status, answer, _ = api.request("PUT", path, body)
        assert status == 400 and answer["error"] == "bad_request", answer
        return answer["reason"]

    assert refusal("/api/user-limits/limited/max-queues", {"value": 4}) == (
        'Unrecognised terms [{<<"max-queues">>,4}] in user-limits')
    assert refusal("/api/user-limits/limited/max-channels", {"value": "x"}) == (
        'max-channels should be a number, actually was <<"x">>')
    assert refusal("/api/user-limits/limited/max-channels", {"value": 1.5}) == (
        "max-channels should be a number, actually was 1.5")
    assert refusal("/api/user-limits/nobody/max-channels", {"value": 4}) == ["no_such_user", "nobody"]
    assert api.request("GET", "/api/user-limits/nobody")[0] == 404
    assert api.delete("/api/user-limits/limited/max-channels") == (204, None)
    assert api.get("/api/user-limits/limited") == [{"user": "limited", "value": {"max-connections": 3}}]
    assert api.as_user("limited", "pw2").request("GET", "/api/user-limits")[0] == 401


def test_global_parameters_and_the_cluster_name(broker, api):
    assert api.put("/api/global-parameters/g1", {"value": {"x": [1, 2]}}) == (201, None)
    assert api.put("/api/global-parameters/g1", {"value": {"x": [1, 3]}}) == (204, None)
    assert api.get("/api/global-parameters/g1") == {"name": "g1", "value": {"x": [1, 3]}}
    assert {"name": "g1", "value": {"x": [1, 3]}} in api.get("/api/global-parameters")
    assert api.request("PUT", "/api/global-parameters/g2", {"valu": 1})[:2] == (
        400, {"error": "bad_request", "reason": "[{key_missing,value}]"})
    node = api.get("/api/overview")["node"]
    assert api.get("/api/overview")["cluster_name"] == node
    assert api.put("/api/global-parameters/cluster_name", {"value": "east-1"}) == (201, None)
    assert api.get("/api/overview")["cluster_name"] == "east-1"
    assert api.delete("/api/global-parameters/cluster_name") == (204, None)
    assert api.get("/api/overview")["cluster_name"] == node
    assert api.delete("/api/global-parameters/cluster_name")[0] == 404
    assert api.request("GET", "/api/global-parameters/nosuch")[0] == 404
    assert api.put("/api/users/plain", {"password": "pw", "tags": "management"}) == (201, None)
    assert api.as_user("plain", "pw").request("GET", "/api/global-parameters")[0] == 401  # administrators only


def test_parameters_limits_and_global_parameters_outlive_a_restart(tmp_path):
    process = BrokerProcess(["--backend=memory", "--native", "none"], cwd=tmp_path)
    try:
        api = Api(process.wait_listening("HTTP API"))
        assert api.put("/api/vhosts/kept", {}) == (201, None)
        assert api.put("/api/vhost-limits/kept/max-queues", {"value": 5}) == (204, None)
        assert api.put("/api/user-limits/guest/max-channels", {"value": 9}) == (204, None)
        assert api.put("/api/global-parameters/cluster_name", {"value": "kept-cluster"}) == (201, None)
        process.restart()
        api = Api(process.wait_listening("HTTP API"))
        assert api.get("/api/vhost-limits") == [{"vhost": "kept", "value": {"max-queues": 5}}]
        assert api.get("/api/user-limits") == [{"user": "guest", "value": {"max-channels": 9}}]
        assert api.get("/api/overview")["cluster_name"] == "kept-cluster"
    finally:
        assert process.stop() == 0
