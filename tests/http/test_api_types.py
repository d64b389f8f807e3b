"""Every field of every management API page brokerd serves has the JSON type RabbitMQ 3.10 gives it.

The same objects as on the RabbitMQ node the reference was captured from
(L{tests.support.api_types.make_objects}: a queue with a policy and one
without, an exchange, a binding, a pika connection whose channel consumes and
acks) are made on a real brokerd; each page's answer is compared, field by
field, with C{rabbitmq_api_types.json}: null, string, integer, float, boolean,
array or object as RabbitMQ gives it there, and no field RabbitMQ always gives
missing unless C{api_fields_not_provided.json} says why. Then RabbitMQ's
C{rabbitmqadmin} lists each kind of object in its formats.
"""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.support import api_types
from tests.support.httpapi import RABBITMQADMIN, amqp, broker  # noqa: F401 (broker: the module's fixture)

HERE = pathlib.Path(__file__).parent
REFERENCE = json.loads((HERE / "rabbitmq_api_types.json").read_text())["endpoints"]
NOT_PROVIDED = json.loads((HERE / "api_fields_not_provided.json").read_text())["groups"]

# What rabbitmqadmin's default columns and the dashboard's pages read: these must be there.
NEEDED = {
    "overview": ["rabbitmq_version", "cluster_name", "queue_totals.messages", "object_totals.queues",
                 "message_stats.publish_details.rate", "listeners[].port", "node", "product_version"],
    "connections": ["[].name", "[].user", "[].channels", "[].vhost", "[].protocol", "[].client_properties",
                    "[].recv_oct", "[].send_oct", "[].connected_at"],
    "channels": ["[].name", "[].user", "[].vhost", "[].state", "[].consumer_count", "[].prefetch_count",
                 "[].messages_unacknowledged", "[].message_stats.publish"],
    "exchanges": ["[].name", "[].type", "[].vhost", "[].durable", "[].auto_delete", "[].internal", "[].arguments",
                  "[].policy"],
    "queues": ["[].name", "[].messages", "[].vhost", "[].durable", "[].auto_delete", "[].exclusive", "[].arguments",
               "[].policy", "[].type", "[].state", "[].messages_ready", "[].messages_unacknowledged", "[].consumers",
               "[].message_stats.publish_details.rate", "[].effective_policy_definition"],
    "queue": ["memory", "message_stats.ack_details.rate", "effective_policy_definition"],
    "bindings": ["[].source", "[].destination", "[].routing_key", "[].vhost", "[].destination_type",
                 "[].arguments", "[].properties_key"],
    "vhosts": ["[].name", "[].messages", "[].tracing"],
    "users": ["[].name", "[].tags", "[].password_hash", "[].hashing_algorithm"],
    "permissions": ["[].user", "[].vhost", "[].configure", "[].write", "[].read"],
    "policies": ["[].name", "[].vhost", "[].pattern", "[].apply-to", "[].definition", "[].priority"],
    "nodes": ["[].name", "[].type", "[].mem_used", "[].running"],
    "whoami": ["name", "tags"],
}


def not_provided(endpoint):
    """{pattern: reason} of the fields brokerd leaves out of C{endpoint}'s answer."""
    found = {}
    for group in NOT_PROVIDED:
        if endpoint in group["endpoints"]:
            found.update(group["fields"])
    return found


@pytest.fixture(scope="module")
def client(broker):
    _, host, port = broker.wait_listening("HTTP API").split(":")
    return api_types.Client(f"http://{host}:{port}")


@pytest.fixture(scope="module")
def answers(broker, client):
    """Every page's answer with the objects in place (the consuming connection still open)."""
    _, amqp_port = broker.wait_address("AMQP")
    connection = api_types.make_objects(client, amqp_port)
    try:
        yield api_types.fetch_all(client, amqp_port, client.get("/api/overview")["node"])
    finally:
        connection.close()


def test_the_reference_covers_every_page_compared():
    assert sorted(REFERENCE) == sorted(api_types.ENDPOINTS)
    assert REFERENCE["queues"]["fields"]["[].policy"]["types"] == ["null", "string"]  # RabbitMQ: null without one


@pytest.mark.parametrize("endpoint", sorted(api_types.ENDPOINTS))
def test_each_field_has_rabbitmqs_type_and_none_is_missing_without_a_reason(answers, endpoint):
    problems = api_types.compare(REFERENCE[endpoint]["fields"], answers[endpoint], not_provided(endpoint))
    assert problems == []


def test_the_queue_fields_for_a_policy_are_rabbitmqs(answers):
    by_name = {queue["name"]: queue for queue in answers["queues"]}
    plain, with_policy = by_name[api_types.PLAIN_QUEUE], by_name[api_types.POLICY_QUEUE]
    assert (plain["policy"], plain["effective_policy_definition"], plain["operator_policy"]) == (None, {}, None)
    assert (with_policy["policy"], with_policy["effective_policy_definition"]) == (
        api_types.POLICY, api_types.POLICY_DEFINITION)
    assert answers["queue_with_policy"]["effective_policy_definition"] == api_types.POLICY_DEFINITION


def test_an_exchange_names_its_policy_and_leaves_the_field_out_without_one(answers):
    by_name = {exchange["name"]: exchange for exchange in answers["exchanges"]}
    assert by_name[api_types.EXCHANGE]["policy"] == api_types.EXCHANGE_POLICY
    assert "policy" not in by_name["amq.direct"]  # as RabbitMQ 3.10, where a queue has "policy": null


def test_the_channel_says_it_is_in_confirm_mode(answers):
    [channel] = answers["channels"]
    assert (channel["confirm"], channel["transactional"], channel["messages_unconfirmed"]) == (True, False, 0)


def test_a_connection_shows_the_tuning_its_client_negotiated(answers):
    [connection] = answers["connections"]
    # pika asks for 2047 channels, 131072-byte frames and the server's heartbeat (brokerd's 60 s, as RabbitMQ's)
    assert (connection["channel_max"], connection["frame_max"], connection["timeout"]) == (2047, 131072, 60)


def test_a_channel_in_tx_mode_counts_the_publishes_waiting_for_commit(broker, client):
    connection = amqp(broker)
    try:
        channel = connection.channel()
        channel.tx_select()
        channel.basic_publish("", "nowhere", b"held")
        channel.queue_declare("", exclusive=True)  # answered once the publish before it was taken
        [listed] = [each for each in client.get("/api/channels") if each["transactional"]]
        assert (listed["confirm"], listed["messages_uncommitted"], listed["acks_uncommitted"]) == (False, 1, 0)
        channel.tx_commit()
        assert client.get(f"/api/channels/{api_types.segment(listed['name'])}")["messages_uncommitted"] == 0
    finally:
        connection.close()


@pytest.mark.parametrize("endpoint", sorted(NEEDED))
def test_the_fields_rabbitmqadmin_and_the_dashboard_read_are_given(answers, endpoint):
    given = api_types.field_types(answers[endpoint])
    assert [path for path in NEEDED[endpoint] if path not in given] == []


def test_each_field_left_out_has_a_reason_and_names_a_field_rabbitmq_gives():
    for group in NOT_PROVIDED:
        for endpoint in group["endpoints"]:
            assert endpoint in REFERENCE, endpoint
        for pattern, reason in group["fields"].items():
            assert reason.strip(), pattern
            assert any(api_types.covered(path, {pattern: reason}) for endpoint in group["endpoints"]
                       for path in REFERENCE[endpoint]["fields"]), pattern
        for endpoint in NEEDED:
            needed_left_out = [path for path in NEEDED[endpoint] if api_types.covered(path, not_provided(endpoint))]
            assert needed_left_out == [], endpoint


# -- RabbitMQ's rabbitmqadmin, in its formats

LISTED = ["connections", "channels", "consumers", "exchanges", "queues", "bindings", "users", "vhosts", "permissions",
          "nodes", "policies"]
FORMATS = ["table", "tsv", "long", "kvp", "raw_json", "pretty_json"]


@pytest.fixture(scope="module")
def admin(broker, answers):
    if RABBITMQADMIN is None:
        pytest.skip("rabbitmqadmin (RabbitMQ's) is not installed here")
    _, port = broker.wait_address("HTTP API")

    def run(*args):
        finished = subprocess.run([sys.executable, RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", "guest",
                                   "-p", "guest", "-V", api_types.VHOST, *args], capture_output=True, text=True,
                                  timeout=30)
        assert (finished.returncode, finished.stderr) == (0, ""), args
        return finished.stdout

    return run


@pytest.mark.parametrize("kind", LISTED)
@pytest.mark.parametrize("output", FORMATS)
def test_rabbitmqadmin_lists_each_kind_with_its_default_columns(admin, kind, output):
    shown = admin("-f", output, "list", kind)
    assert shown.strip()
    if output == "raw_json":
        assert isinstance(json.loads(shown), list)


def test_rabbitmqadmin_lists_queues_with_their_policy_in_every_column(admin):
    # RabbitMQ 3.10 gives "policy": null for a queue without one, and rabbitmqadmin's table and tsv formats fail on a
    # null (against RabbitMQ as against brokerd); the long, kvp and raw_json formats show it.
    long = admin("-f", "long", "list", "queues", "name", "policy")
    assert f"  name: {api_types.POLICY_QUEUE}\npolicy: {api_types.POLICY}\n" in long
    assert f"  name: {api_types.PLAIN_QUEUE}\npolicy: None\n" in long
    kvp = admin("-f", "kvp", "list", "queues", "name", "policy").splitlines()
    assert f'name="{api_types.POLICY_QUEUE}" policy="{api_types.POLICY}"' in kvp
    listed = json.loads(admin("-f", "raw_json", "list", "queues", "name", "policy"))
    assert {"name": api_types.PLAIN_QUEUE, "policy": None} in listed
    assert {"name": api_types.POLICY_QUEUE, "policy": api_types.POLICY} in listed
    for output in ("long", "kvp", "raw_json"):  # every field of every queue, as deep as it goes
        assert api_types.POLICY_QUEUE in admin("-f", output, "-d", "3", "list", "queues")


def test_rabbitmqadmin_lists_exchanges_with_their_policy_in_a_table(admin):
    # An exchange without a policy has no policy field in RabbitMQ 3.10 (not null), so the table shows it empty.
    table = admin("list", "exchanges", "name", "policy").splitlines()
    cells = [[cell.strip() for cell in line.split("|")[1:3]] for line in table if line.startswith("|")]
    assert ["amq.direct", ""] in cells and [api_types.EXCHANGE, api_types.EXCHANGE_POLICY] in cells
