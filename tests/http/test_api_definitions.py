"""The HTTP management API's /api/definitions and /api/policies on real brokers over real HTTP:
a RabbitMQ 3.10 export imports (its users log in with their old passwords over AMQP, routing
follows its exchange-to-exchange binding), export -> import into a fresh broker gives the same
definitions, and a policy set over HTTP caps a queue."""

from brokerd.testing import BrokerProcess
from tests.support.access import comparable, rabbitmq_definitions
from tests.support.httpapi import Api, amqp, api, broker  # noqa: F401 (api, broker: the module's fixtures)


def start(directory):
    return BrokerProcess(["--backend=memory", "--native", "none"], cwd=directory)


def test_a_rabbitmq_export_imports_and_its_user_routes_through_its_bindings(broker, api):
    assert api.post("/api/definitions", rabbitmq_definitions()) == (204, None)
    connection = amqp(broker, "alice", "pässwörd€", "team")  # the password RabbitMQ hashed
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("ingress", "order.new", b"routed through e2e", mandatory=True)
        assert channel.basic_get("orders.q", auto_ack=True)[2] == b"routed through e2e"
    finally:
        connection.close()
    assert api.post("/api/definitions", rabbitmq_definitions()) == (204, None)  # importing twice changes nothing


def test_an_export_imported_into_a_fresh_broker_exports_the_same(broker, api, tmp_path):
    exported = api.get("/api/definitions")
    assert {"name": "team"}.items() <= next(v for v in exported["vhosts"] if v["name"] == "team").items()
    assert [policy["name"] for policy in exported["policies"]] == ["ttl"]
    fresh = start(tmp_path)
    try:
        other = Api(fresh.wait_listening("HTTP API"))
        assert other.post("/api/definitions", exported) == (204, None)
        assert comparable(other.get("/api/definitions")) == comparable(exported)
    finally:
        fresh.stop()


def test_one_vhosts_definitions_and_refusals(api):
    team = api.get("/api/definitions/team")
    assert sorted(team) == ["bindings", "exchanges", "parameters", "policies", "queues", "rabbit_version"]
    assert {queue["name"] for queue in team["queues"]} == {"orders.q", "ttl.q"}
    assert api.request("GET", "/api/definitions/nowhere")[0] == 404
    status, body, _ = api.request("POST", "/api/definitions", {"users": "not a list"})
    assert status == 400 and body["error"] == "bad_request", body
    assert api.as_user("alice", "pässwörd€").request("GET", "/api/definitions")[0] == 401  # administrators only


def test_a_policy_set_over_http_caps_a_queue_and_goes_when_deleted(broker, api):
    policy = {"pattern": "^capped\\.", "definition": {"max-length": 2}, "priority": 1, "apply-to": "queues"}
    assert api.put("/api/policies/%2F/cap", policy) == (201, None)
    assert api.get("/api/policies/%2F/cap") == {"vhost": "/", "name": "cap", **policy}
    assert "cap" in [entry["name"] for entry in api.get("/api/policies")]
    connection = amqp(broker)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("capped.q")
        for number in range(5):
            channel.basic_publish("", "capped.q", b"%d" % number)
        assert api.get("/api/queues/%2F/capped.q")["messages"] == 2
        assert [(queue["policy"], queue["messages"]) for queue in api.get("/api/queues/%2F")
                if queue["name"] == "capped.q"] == [("cap", 2)]  # the listing names the policy applied
        assert api.delete("/api/policies/%2F/cap") == (204, None)
        assert api.request("GET", "/api/policies/%2F/cap")[0] == 404
        for number in range(5):
            channel.basic_publish("", "capped.q", b"%d" % number)
        assert api.get("/api/queues/%2F/capped.q")["messages"] == 7
        assert [queue["policy"] for queue in api.get("/api/queues/%2F") if queue["name"] == "capped.q"] == [None]
    finally:
        connection.close()
    status, body, _ = api.request("PUT", "/api/policies/%2F/bad", {**policy, "apply-to": "foo"})
    assert status == 400 and "apply-to 'foo' unrecognised" in body["reason"], body
