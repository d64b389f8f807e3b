"""The management API's topic permissions on a real broker over real HTTP, with the status codes,
bodies and field names RabbitMQ 3.10.8 answers (checked against a reference node); a real RabbitMQ
export with topic permissions loads through POST /api/definitions and its user is held to them over
pika; brokerd-admin sets, lists and clears them."""

import json

import pika.exceptions
import pytest

from tests.support.admin_cli import admin, http_url
from tests.support.httpapi import amqp, api, broker, segment  # noqa: F401 (api, broker: the module's fixtures)
from tests.support.paths import ROOT

REFERENCE_EXPORT = ROOT / "tests" / "support" / "rabbitmq-3.10.8-topic-permissions.json"


def entry(user, vhost, exchange, write, read):
    return {"user": user, "vhost": vhost, "exchange": exchange, "write": write, "read": read}


@pytest.fixture(scope="module")
def users(api):
    """tpa (no topic permissions yet) and the vhost tpv."""
    assert api.put("/api/users/tpa", {"password": "pw", "tags": ""})[0] == 201
    assert api.put("/api/vhosts/tpv")[0] == 201
    return api


def test_a_put_creates_then_adds_entries_and_the_listings_show_them(users):
    api = users
    path = "/api/topic-permissions/tpv/tpa"
    assert api.request("GET", path)[:2] == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api.put(path, {"exchange": "amq.topic", "write": "^a\\.", "read": "^r\\."}) == (201, None)
    assert api.put(path, {"exchange": "amq.topic", "write": "^{username}\\.", "read": "^r\\."}) == (204, None)
    assert api.put(path + "/ignored", {"exchange": "t2", "write": "^w2", "read": "^r2"}) == (204, None)
    expected = [entry("tpa", "tpv", "amq.topic", "^{username}\\.", "^r\\."), entry("tpa", "tpv", "t2", "^w2", "^r2")]
    assert api.get(path) == expected
    assert api.get(path + "/t2") == expected  # RabbitMQ answers every entry there too
    assert [item for item in api.get("/api/topic-permissions") if item["user"] == "tpa"] == expected
    assert api.get("/api/users/tpa/topic-permissions") == expected
    assert api.get("/api/vhosts/tpv/topic-permissions") == expected
    assert api.request("GET", "/api/users/nobody/topic-permissions")[0] == 404
    assert api.request("GET", "/api/vhosts/nowhere/topic-permissions")[0] == 404


def test_a_delete_with_an_exchange_takes_that_entry_and_one_without_takes_all(users):
    api = users
    path = "/api/topic-permissions/tpv/tpa"
    for exchange in ("e1", "e2", ""):
        api.put(path, {"exchange": exchange, "write": "w", "read": "r"})
    assert api.delete(path + "/e1") == (204, None)
    assert api.delete(path + "/not-there") == (204, None)  # another entry exists: RabbitMQ's 204
    assert api.delete(path + "/amq.default") == (204, None)  # the default exchange, as RabbitMQ names it
    assert "e1" not in [item["exchange"] for item in api.get(path)]
    assert "" not in [item["exchange"] for item in api.get(path)]
    assert api.delete(path) == (204, None)
    assert api.request("GET", path)[0] == 404
    assert api.delete(path)[0] == 404
    assert api.delete(path + "/e2")[0] == 404


@pytest.mark.parametrize("body, reason", [
    ({"write": "a", "read": "b"}, "[{key_missing,exchange}]"),
    ({"exchange": "x"}, "[{key_missing,write},{key_missing,read}]"),
])
def test_a_put_missing_fields_is_400_in_rabbitmqs_words(users, body, reason):
    assert users.put("/api/topic-permissions/tpv/tpa", body) == (400, {"error": "bad_request", "reason": reason})


def test_an_unknown_user_or_vhost_and_an_invalid_expression_are_400(users):
    body = {"exchange": "x", "write": "a", "read": "b"}
    for path in ("/api/topic-permissions/tpv/nobody", "/api/topic-permissions/nowhere/tpa"):
        assert users.put(path, body) == (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    status, answer = users.put("/api/topic-permissions/tpv/tpa", {"exchange": "x", "write": "(", "read": "a"})
    assert status == 400 and answer["reason"][:2] == ["invalid_regexp", "("]
    assert users.request("GET", "/api/topic-permissions/tpv/tpa")[0] == 404


def test_only_administrators_see_or_change_them(users):
    assert users.put("/api/users/tp-monitor", {"password": "pw", "tags": "monitoring"})[0] == 201
    monitor = users.as_user("tp-monitor", "pw")
    for method, path in (("GET", "/api/topic-permissions"), ("GET", "/api/users/tpa/topic-permissions"),
                         ("PUT", "/api/topic-permissions/tpv/tpa"), ("DELETE", "/api/topic-permissions/tpv/tpa")):
        status, answer, _ = monitor.request(method, path, {"exchange": "x", "write": "", "read": ""})
        assert (status, answer["error"]) == (401, "not_authorised")


def test_deleting_the_user_or_the_vhost_takes_its_entries(users):
    api = users
    api.put("/api/users/tp-gone", {"password": "pw", "tags": ""})
    api.put("/api/vhosts/tp-gone-v")
    api.put("/api/topic-permissions/tp-gone-v/tpa", {"exchange": "x", "write": "", "read": ""})
    api.put("/api/topic-permissions/tpv/tp-gone", {"exchange": "x", "write": "", "read": ""})
    assert api.delete("/api/users/tp-gone")[0] == 204
    assert api.delete("/api/vhosts/tp-gone-v")[0] == 204
    assert not [item for item in api.get("/api/topic-permissions")
                if "tp-gone" in (item["user"], item["vhost"]) or item["vhost"] == "tp-gone-v"]


def test_a_rabbitmq_export_with_topic_permissions_loads_and_its_user_is_held_to_them(broker, api):
    """The export is RabbitMQ 3.10.8's own, from a reference node (cut to one user and vhost)."""
    document = json.loads(REFERENCE_EXPORT.read_text())
    assert api.post("/api/definitions", document)[0] in (200, 201, 204)
    user, vhost = "i31-topicperm-alice", "i31-topicperm-export"
    assert api.get(f"/api/topic-permissions/{vhost}/{user}") == sorted(
        document["topic_permissions"], key=lambda item: item["exchange"])
    exported = api.get("/api/definitions")["topic_permissions"]
    assert all(item in exported for item in document["topic_permissions"])
    refused = (f"ACCESS_REFUSED - access to topic '{{}}' in exchange 'events' in vhost '{vhost}'"
               f" refused for user '{user}'")
    with amqp(broker, user, "alice-pw", vhost) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("events", f"{user}.news", b"mine")  # write: ^{username}\.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish("events", "public.news", b"x")
        assert (closed.value.reply_code, closed.value.reply_text) == (403, refused.format("public.news"))
        channel = connection.channel()
        channel.queue_bind("alice.inbox", "events", f"{user}.#")  # read: ^(public|{username})\.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_bind("alice.inbox", "events", "secret.#")
        assert (closed.value.reply_code, closed.value.reply_text) == (403, refused.format("secret.#"))


def test_brokerd_admin_sets_lists_and_clears_them(broker, users):
    url = http_url(broker)
    assert admin(url, "set-topic-permissions", "--vhost", "tpv", "tpa", "amq.topic", "^{username}\\.", "^r") == (
        0, "Set the topic permissions of user tpa on exchange amq.topic in vhost tpv\n", "")
    assert admin(url, "set-topic-permissions", "-p", "tpv", "tpa", "events", "^e", "")[0] == 0
    status, out, _ = admin(url, "--format", "json", "list", "topic_permissions", "--vhost", "tpv")
    assert status == 0 and json.loads(out) == [entry("tpa", "tpv", "amq.topic", "^{username}\\.", "^r"),
                                               entry("tpa", "tpv", "events", "^e", "")]
    status, out, _ = admin(url, "list", "topic_permissions", "--vhost", "tpv")
    assert out.splitlines()[0].split() == ["user", "vhost", "exchange", "write", "read"]
    assert admin(url, "clear-topic-permissions", "--vhost", "tpv", "tpa", "events") == (
        0, "Cleared the topic permissions of user tpa on exchange events in vhost tpv\n", "")
    assert [item["exchange"] for item in users.get("/api/topic-permissions/tpv/tpa")] == ["amq.topic"]
    assert admin(url, "clear-topic-permissions", "--vhost", "tpv", "tpa")[0] == 0
    assert admin(url, "clear-topic-permissions", "--vhost", "tpv", "tpa")[0] == 0  # none left: as rabbitmqctl
    assert users.request("GET", "/api/topic-permissions/tpv/tpa")[0] == 404
    status, _, error = admin(url, "set-topic-permissions", "--vhost", "tpv", "nobody", "x", "a", "b")
    assert (status, error) == (1, "error: HTTP 400 bad_request - vhost_or_user_not_found\n")
