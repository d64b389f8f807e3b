"""The management API's listing parameters (sort, columns, pages, name filters), rates and health checks."""

import json
import subprocess
import sys

import pytest
from twisted.internet.task import Clock

from backends.memory import MemoryStore
from brokerd.access.database import AccessDatabase
from brokerd.http import topology
from brokerd.http.rates import CounterRates
from brokerd.http.routes import encode
from brokerd.http.server import ApiContext, ApiRequest
from brokerd.model.broker import Broker
from brokerd.model.message import Message
from brokerd.proto.messages_pb2 import BasicProperties
from brokerd.testing import BrokerProcess
from tests.support.httpapi import RABBITMQADMIN, Api, module_broker

QUEUES = {"alpha": 3, "Beta": 0, "gamma": 7, "delta": 1, "epsilon": 5}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from module_broker(tmp_path_factory, "--memory-high-watermark", "64KiB")


@pytest.fixture(scope="module")
def api(broker):
    api = Api(broker.wait_listening("HTTP API"))
    for name, depth in QUEUES.items():
        assert api.put(f"/api/queues/%2F/{name}", {"durable": False})[0] == 201
        for number in range(depth):
            assert api.post("/api/exchanges/%2F/amq.default/publish", {
                "routing_key": name, "payload": f"m{number}", "payload_encoding": "string", "properties": {}}) == (
                200, {"routed": True})
    return api


def names(items):
    return [item["name"] for item in items]


def test_sort_and_sort_reverse_order_a_listing_by_any_dotted_key_then_by_vhost_and_name(api):
    assert names(api.get("/api/queues?sort=messages")) == ["Beta", "delta", "alpha", "epsilon", "gamma"]
    assert names(api.get("/api/queues?sort=messages&sort_reverse=true")) == [
        "gamma", "epsilon", "alpha", "delta", "Beta"]
    assert names(api.get("/api/queues?sort=message_stats.publish")) == ["Beta", "delta", "alpha", "epsilon", "gamma"]
    # Names sort as binaries (upper case first), as RabbitMQ's Erlang term order does; a missing key sorts as 0.
    assert names(api.get("/api/queues/%2F?sort=name")) == ["Beta", "alpha", "delta", "epsilon", "gamma"]
    assert names(api.get("/api/queues?sort=no_such_field&sort_reverse=true")) == [
        "gamma", "epsilon", "delta", "alpha", "Beta"]


def test_columns_keep_only_the_named_fields_down_dotted_paths(api):
    listing = api.get("/api/queues?sort=name&columns=name,messages,message_stats.publish_details.rate")
    assert listing[1] == {"name": "alpha", "messages": 3, "message_stats": {"publish_details": {"rate": listing[1][
        "message_stats"]["publish_details"]["rate"]}}}
    assert all(set(queue) == {"name", "messages", "message_stats"} for queue in listing)
    assert api.get("/api/queues/%2F/gamma?columns=name,consumers") == {"name": "gamma", "consumers": 0}
    assert api.get("/api/overview?columns=queue_totals.messages") == {"queue_totals": {"messages": 16}}


def test_pages_come_in_rabbitmqs_envelope_filtered_by_name(api):
    page = api.get("/api/queues?page=2&page_size=2&sort=messages")
    assert page == {"total_count": 5, "item_count": 2, "filtered_count": 5, "page": 2, "page_size": 2,
                    "page_count": 3, "items": page["items"]}
    assert names(page["items"]) == ["alpha", "epsilon"]
    filtered = api.get("/api/queues?page=1&name=ET&columns=name")  # case-insensitive substring
    assert filtered == {"total_count": 5, "item_count": 1, "filtered_count": 1, "page": 1, "page_size": 100,
                        "page_count": 1, "items": [{"name": "Beta"}]}
    regex = api.get("/api/queues?page=1&use_regex=true&name=^(alpha|gamma)$&columns=name")
    assert names(regex["items"]) == ["alpha", "gamma"]
    assert api.get("/api/queues?page=2&page_size=5")["items"] == []  # just past the end: empty, as RabbitMQ


@pytest.mark.parametrize("query, error, reason", [
    ("page=0", "invalid_pagination_parameters", "Invalid pagination parameters: page number 0, page size undefined"),
    ("page=1&page_size=501", "invalid_pagination_parameters",
     "Invalid pagination parameters: page number 1, page size 501"),
    ("page=x", "invalid_pagination_parameters", "Invalid pagination parameters: page number x, page size undefined"),
    ("page=4&page_size=2&name=a", "page_out_of_range", "Page out of range, page: 4 page size: 2, len: 4"),
    ("page=1&use_regex=true&name=(a+)%2B$", "invalid_pagination_parameters", None),
    ("page=1&use_regex=true&name=(a", "invalid_pagination_parameters", None),
    ("page=1&use_regex=true&name=" + "a" * 1025, "invalid_pagination_parameters", "name filter regex is too long"),
])
def test_bad_page_parameters_and_regexes_that_could_stall_the_broker_are_refused_with_400(api, query, error, reason):
    status, body, _ = api.request("GET", "/api/queues?" + query)
    assert status == 400 and body["error"] == error, body
    if reason is not None:
        assert body["reason"] == reason


def test_a_name_regex_that_backtracks_without_bound_is_refused_and_a_plain_one_is_not():
    from brokerd.http.listing import compile_name_regex
    from brokerd.http.routes import ApiError

    for risky in ("(a+)+$", "(a|aa)*b", r"(\w+)\1", ".*.*.*x", "(?=a)a", "a.*b.*c"):
        with pytest.raises(ApiError, match="too complex"):
            compile_name_regex(risky)
    for plain, name in (("^celery", "celery-1"), (r"\.dlq$", "jobs.dlq"), ("^jobs-[0-9]+$", "jobs-12"),
                        ("^(alpha|gamma)$", "gamma"), ("^a.*b.*c$", "a-b-c"), ("work.*", "rework")):
        assert compile_name_regex(plain).search(name.upper())  # case-insensitive, as RabbitMQ's caseless


def test_rabbitmqadmin_sorts_and_picks_columns_through_the_same_parameters(broker, api):
    if RABBITMQADMIN is None:
        pytest.skip("rabbitmqadmin is not installed (.ci/run fetches it from Debian's rabbitmq-server package)")
    _, port = broker.wait_address("HTTP API")
    listed = subprocess.run([sys.executable, RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-f", "raw_json",
                             "list", "queues", "name", "messages", "--sort", "messages", "--sort-reverse"],
                            capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(listed.stdout) == [{"name": name, "messages": depth} for name, depth in sorted(
        QUEUES.items(), key=lambda item: item[1], reverse=True)]


def test_rates_cover_five_to_ten_seconds_however_often_they_are_read():
    rates = CounterRates(0.0, (0,))
    assert rates.rates(0.0, (0,)) == (0.0,)
    assert rates.rates(2.0, (40,)) == (20.0,)  # before the first 5 s: since the first look
    assert rates.rates(5.0, (50,)) == (10.0,)  # a new sample; still measured from 0
    assert rates.rates(5.0, (50,)) == (10.0,)  # a second reader at once sees the same
    assert rates.rates(8.0, (80,)) == (10.0,)  # from the sample at 0 until the next is taken
    assert rates.rates(10.0, (80,)) == (6.0,)  # from the sample at 5: 30 messages in 5 s


def test_a_queues_rates_follow_what_it_took_per_second_whoever_looks():
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    vhost = broker.vhosts["/"]
    vhost.declare_queue("work")
    api = ApiRequest(ApiContext(broker, AccessDatabase.in_memory(), None), None, "guest")

    def publish_rate():
        [queue] = json.loads(encode(topology.list_queues(api)))
        assert queue["message_stats"]["publish_details"] == topology.message_stats(
            vhost.queues["work"], clock.seconds())["publish_details"]
        return queue["message_stats"]["publish_details"]["rate"]

    assert publish_rate() == 0.0
    for _ in range(50):
        vhost.publish("", Message("", "work", BasicProperties(), b"x"))
    clock.advance(5)
    assert [publish_rate() for _ in range(3)] == [10.0, 10.0, 10.0]
    clock.advance(5)
    assert publish_rate() == 0.0


def test_health_checks_pass_on_a_healthy_broker_and_name_what_is_missing(broker, api):
    _, amqp_port = broker.wait_address("AMQP")
    assert api.get("/api/health/checks/alarms") == {"status": "ok"}
    assert api.get("/api/health/checks/local-alarms") == {"status": "ok"}
    assert api.get("/api/health/checks/virtual-hosts") == {"status": "ok"}
    assert api.get("/api/healthchecks/node") == {"status": "ok"}
    assert api.get(f"/api/health/checks/port-listener/{amqp_port}") == {"status": "ok", "port": amqp_port}
    # RabbitMQ 3.10 names the protocol checked in one string, "amqp" for amqp091, and the missing ones so too
    assert api.get("/api/health/checks/protocol-listener/amqp091") == {"status": "ok", "protocol": "amqp"}
    assert api.get("/api/health/checks/protocol-listener/amqp,http") == {"status": "ok", "protocol": "amqp,http"}
    status, body, _ = api.request("GET", "/api/health/checks/protocol-listener/mqtt,amqp")
    assert (status, body) == (503, {"status": "failed", "reason": "No active listener", "missing": "mqtt",
                                    "protocols": ["amqp", "http"]})
    status, body, _ = api.request("GET", "/api/health/checks/port-listener/1")
    assert status == 503 and body["missing"] == 1 and amqp_port in body["ports"], body
    assert api.request("GET", "/api/health/checks/port-listener/x")[:2] == (
        400, {"error": "bad_request", "reason": "Invalid port"})
    assert api.request("GET", "/api/healthchecks/node/rabbit@elsewhere")[0] == 404


def test_the_aliveness_test_publishes_and_gets_a_message_with_the_users_permissions(api):
    assert api.get("/api/aliveness-test/%2F") == {"status": "ok"}
    assert api.get("/api/aliveness-test/%2F") == {"status": "ok"}
    assert api.get("/api/queues/%2F/aliveness-test")["messages"] == 0
    assert api.put("/api/users/watcher", {"password": "pw", "tags": "management"})[0] == 201
    watcher = api.as_user("watcher", "pw")
    assert watcher.request("GET", "/api/aliveness-test/%2F")[0] == 401  # no permissions on '/'
    assert api.request("GET", "/api/aliveness-test/nosuch")[0] == 404


def test_the_alarms_check_fails_while_the_memory_watermark_blocks_publishers(api):
    assert api.put("/api/queues/%2F/big", {"durable": False})[0] == 201
    assert api.post("/api/exchanges/%2F/amq.default/publish", {  # past the 64 KiB watermark: publishers block
        "routing_key": "big", "payload": "x" * 128 * 1024, "payload_encoding": "string", "properties": {}})[0] == 200
    status, body, _ = api.request("GET", "/api/health/checks/alarms")
    node = api.get("/api/overview")["node"]
    assert (status, body) == (503, {"status": "failed", "reason": "There are alarms in effect in the cluster",
                                    "alarms": [{"resource": "memory", "node": node}]})
    assert api.request("GET", "/api/health/checks/local-alarms")[1]["reason"] == (
        "There are alarms in effect on the node")
    assert api.delete("/api/queues/%2F/big/contents") == (204, None)
    assert api.get("/api/health/checks/alarms") == {"status": "ok"}


def test_the_virtual_hosts_check_names_a_vhost_that_is_down(tmp_path):
    data_dir = tmp_path / "data"
    access = AccessDatabase.in_directory(str(data_dir))
    access.open()
    access.add_vhost("broken", "nosuch")
    process = BrokerProcess(["--backend=sqlite", "--data-dir", str(data_dir), "--native", "none"], cwd=tmp_path)
    try:
        status, body, _ = Api(process.wait_listening("HTTP API")).request("GET", "/api/health/checks/virtual-hosts")
        assert (status, body) == (503, {"status": "failed", "reason": "Some virtual hosts are down",
                                        "virtual-hosts": ["broken"]})
    finally:
        process.stop()
