"""The HTTP management API's login, overview, vhosts, users and permissions, on a real broker over real HTTP."""

import pika
import pytest

from brokerd.access.database import AccessDatabase
from brokerd.testing import BrokerProcess
from tests.support.addresses import non_loopback_address
from tests.support.httpapi import Api, amqp, api, broker, segment  # noqa: F401 (api, broker: the module's fixtures)


def test_the_listener_is_announced_and_listed_in_the_overview(broker, api):
    assert any("HTTP API listening on 127.0.0.1:" in line and "(--http=tcp:0:interface=127.0.0.1)" in line
               for line in broker.output)
    overview = api.get("/api/overview")
    assert overview["product_name"] == "brokerd"
    assert overview["management_version"] and overview["rabbitmq_version"] and overview["node"]
    protocols = {listener["protocol"]: listener for listener in overview["listeners"]}
    assert protocols["http"]["port"] == int(api.base.rsplit(":", 1)[1])
    assert protocols["amqp"]["port"] == broker.wait_address("AMQP")[1]
    assert protocols["amqp"]["ip_address"] == "127.0.0.1"


def test_overview_counts_queues_messages_and_clients(broker, api):
    connection = amqp(broker)
    try:
        channel = connection.channel()
        channel.queue_declare("overview-q")
        channel.confirm_delivery()
        for number in range(3):
            channel.basic_publish("", "overview-q", b"m%d" % number)
        method, _, _ = channel.basic_get("overview-q")
        overview = api.get("/api/overview")
        assert overview["queue_totals"] == {"messages": 3, "messages_ready": 2, "messages_unacknowledged": 1}
        totals = overview["object_totals"]
        assert (totals["connections"], totals["channels"], totals["queues"]) == (1, 1, 1)
        assert totals["exchanges"] == len(api.get("/api/exchanges")) > 0 and totals["consumers"] == 0
        stats = overview["message_stats"]
        assert stats["publish"] == 3 and stats["deliver_get"] == 1 and stats["ack"] == 0
        assert {"publish_details", "deliver_get_details", "ack_details", "confirm_details"} <= set(stats)
        assert isinstance(stats["publish_details"]["rate"], float)
        channel.basic_ack(method.delivery_tag)
        channel.queue_delete("overview-q")
    finally:
        connection.close()


def test_whoami_and_nodes(api):
    assert api.get("/api/whoami") == {"name": "guest", "tags": ["administrator"]}
    [node] = api.get("/api/nodes")
    assert node["type"] == "disc" and node["running"] is True
    assert node["mem_used"] > 0 and node["fd_used"] > 0 and node["uptime"] >= 0
    assert api.get("/api/nodes/" + segment(node["name"]))["name"] == node["name"]


@pytest.mark.parametrize("user, password, reason", [
    ("guest", "wrong", "Login failed"),
    ("nobody", "x", "Login failed"),
    (None, None, "Login failed"),
])
def test_a_failed_login_is_401_not_authorised(api, user, password, reason):
    status, body, headers = api.as_user(user, password).request("GET", "/api/overview")
    assert (status, body) == (401, {"error": "not_authorised", "reason": reason})
    assert headers["WWW-Authenticate"].startswith("Basic")


def test_a_user_without_a_management_tag_may_not_use_the_api(api):
    assert api.put("/api/users/plain", {"password": "pw", "tags": ""}) == (201, None)
    status, body, _ = api.as_user("plain", "pw").request("GET", "/api/whoami")
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Not management user"})


def test_unknown_paths_methods_and_bad_bodies(api):
    assert api.request("GET", "/api/nosuch")[:2] == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api.request("GET", "/api/vhosts/nosuch")[:2] == (404, {"error": "Object Not Found", "reason": "Not Found"})
    status, body, headers = api.request("POST", "/api/overview")
    assert status == 405 and body["error"] == "method_not_allowed" and "GET" in headers["Allow"]
    status, body, _ = api.request("PUT", "/api/users/x", None, {"Content-Type": "application/json"})
    assert (status, body["error"]) == (400, "bad_request")


def test_vhosts_are_created_listed_and_deleted(broker, api):
    assert api.put("/api/vhosts/" + segment("team/a")) == (201, None)
    assert api.put("/api/vhosts/" + segment("team/a")) == (204, None)
    names = [vhost["name"] for vhost in api.get("/api/vhosts")]
    assert names == sorted(names) and {"/", "team/a"} <= set(names)
    assert api.get("/api/vhosts/%2F")["name"] == "/"
    assert api.put(f"/api/permissions/{segment('team/a')}/guest", {"configure": ".*", "write": ".*", "read": ".*"}) \
        == (201, None)
    connection = amqp(broker, vhost="team/a")
    connection.channel().queue_declare("in-team-a")
    assert api.delete("/api/vhosts/" + segment("team/a")) == (204, None)
    assert api.request("GET", "/api/vhosts/" + segment("team/a"))[0] == 404
    assert api.delete("/api/vhosts/" + segment("team/a"))[0] == 404
    with pytest.raises(pika.exceptions.AMQPError):
        connection.channel()  # the vhost's clients were closed with 320
    assert not connection.is_open


def test_users_with_password_or_hash_and_tags_log_in_over_amqp(broker, api):
    assert api.put("/api/users/alice", {"password": "s3cret", "tags": "management,monitoring"}) == (201, None)
    alice = api.get("/api/users/alice")
    assert alice["tags"] == ["management", "monitoring"]
    assert alice["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert api.put("/api/users/bob", {"password_hash": alice["password_hash"], "tags": ["management"]}) == (201, None)
    assert api.put("/api/users/bob", {"tags": ["management", "policymaker"]}) == (204, None)
    assert api.get("/api/users/bob")["password_hash"] == alice["password_hash"]
    assert "bob" in [user["name"] for user in api.get("/api/users")]
    assert api.put("/api/permissions/%2F/bob", {"configure": "^bob-", "write": ".*", "read": ".*"}) == (201, None)
    assert api.get("/api/permissions/%2F/bob") == {"user": "bob", "vhost": "/", "configure": "^bob-", "write": ".*",
                                                   "read": ".*"}
    amqp(broker, "bob", "s3cret").close()  # the hash carried alice's password over
    bob = api.as_user("bob", "s3cret")
    assert bob.get("/api/whoami") == {"name": "bob", "tags": ["management", "policymaker"]}
    assert bob.request("GET", "/api/users")[:2] == (
        401, {"error": "not_authorised", "reason": "Not administrator user"})
    assert bob.put("/api/vhosts/bobs")[0] == 401
    assert [vhost["name"] for vhost in bob.get("/api/vhosts")] == ["/"]
    assert {"user": "bob", "vhost": "/", "configure": "^bob-", "write": ".*", "read": ".*"} in \
        api.get("/api/permissions")
    assert [entry["user"] for entry in api.get("/api/users/bob/permissions")] == ["bob"]
    assert api.delete("/api/permissions/%2F/bob") == (204, None)
    assert api.request("GET", "/api/permissions/%2F/bob")[0] == 404
    assert [vhost["name"] for vhost in bob.get("/api/vhosts")] == []
    assert api.delete("/api/users/bob") == (204, None)
    assert api.delete("/api/users/bob")[0] == 404
    assert bob.request("GET", "/api/whoami")[:2] == (401, {"error": "not_authorised", "reason": "Login failed"})


def test_a_monitoring_user_sees_every_vhost(api):
    api.put("/api/vhosts/monitored")
    carol = api.as_user("alice", "s3cret")  # management and monitoring, no permissions anywhere
    assert {"/", "monitored"} <= {vhost["name"] for vhost in carol.get("/api/vhosts")}
    assert carol.get("/api/nodes")[0]["running"] is True
    api.delete("/api/vhosts/monitored")


def test_a_vhost_put_with_a_backend_gets_a_store_of_its_own(tmp_path):
    """brokerd's own field of PUT /api/vhosts/NAME's body, as brokerd-admin add-vhost --backend sends it."""
    data = tmp_path / "data"
    process = BrokerProcess(["--backend=memory", "--native", "none", "--data-dir", str(data)], cwd=tmp_path)
    try:
        api = Api(process.wait_listening("HTTP API"))
        assert api.put("/api/vhosts/own", {"backend": "sqlite"}) == (201, None)
        assert {"name": "own", "backend": "sqlite"} in stored_vhosts(data)
        assert any((data / "vhosts" / "own").iterdir())  # the sqlite store's files
        assert api.put("/api/permissions/own/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
        connection = amqp(process, vhost="own")
        connection.channel().queue_declare("kept", durable=True)
        connection.close()
        assert api.get("/api/queues/own/kept")["durable"] is True
        status, answer, _ = api.request("PUT", "/api/vhosts/bad", {"backend": "nosuch"})
        assert (status, answer["error"]) == (400, "bad_request") and "nosuch" in answer["reason"], answer
        assert api.request("PUT", "/api/vhosts/bad", {"backend": 7})[:2] == (
            400, {"error": "bad_request", "reason": "backend must be a backend string, such as sqlite"})
        assert api.request("GET", "/api/vhosts/bad")[0] == 404
        assert api.delete("/api/vhosts/own") == (204, None)
        assert not (data / "vhosts" / "own").exists()
    finally:
        assert process.stop() == 0


def stored_vhosts(data_dir):
    """The vhosts the access database in C{data_dir} holds on disk now."""
    access = AccessDatabase.in_directory(str(data_dir))
    access.open()
    return access.document()["vhosts"]


def test_http_none_turns_the_api_off(tmp_path):
    process = BrokerProcess(["--backend=memory", "--native", "none", "--http", "none"], cwd=tmp_path)
    try:
        process.wait_listening("AMQP")
        assert "HTTP API" not in process.listening
    finally:
        assert process.stop() == 0


def test_guest_may_use_the_api_from_loopback_only(tmp_path):
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no address but loopback ones")
    process = BrokerProcess(["--backend=memory", "--native", "none", "--http", "tcp:0:interface=0.0.0.0"],
                            cwd=tmp_path)
    try:
        _, port = process.wait_address("HTTP API")
        local = Api(f"tcp:127.0.0.1:{port}")
        assert local.put("/api/users/remote", {"password": "pw", "tags": "administrator"}) == (201, None)
        remote = Api(f"tcp:{address}:{port}")
        assert remote.request("GET", "/api/whoami")[:2] == (
            401, {"error": "not_authorised", "reason": "User can only log in via localhost"})
        assert remote.as_user("remote", "pw").get("/api/whoami")["name"] == "remote"
    finally:
        assert process.stop() == 0
