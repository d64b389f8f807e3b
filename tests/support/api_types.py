"""The JSON types of the management API's answers, RabbitMQ's and brokerd's, field by field.

The same objects are made on either broker through its management API and
one pika connection (L{make_objects}): a vhost, a queue without a policy and
one with, a direct exchange with a policy bound to the first, a consumer on
it that got and acked a message, a message waiting in the second. L{ENDPOINTS} are the pages
fetched; L{field_types} turns an answer into C{{dotted path: {JSON type: count}}}
(C{a.b}, C{a[].b} for the items of a list), not looking inside maps whose keys
are data (arguments, client properties, policy definitions).

Run against RabbitMQ, this module writes the reference map the tests compare
brokerd with::

    python -m tests.support.api_types http://127.0.0.1:15679 5679 tests/http/rabbitmq_api_types.json

(the management API's base URL, the node's AMQP port, the file to write).
"""

import base64
import collections
import json
import re
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pika

VHOST = "i31-apitypes"
PLAIN_QUEUE, POLICY_QUEUE, EXCHANGE, POLICY = "typed-plain", "typed-policy", "typed-x", "typed-policy"
POLICY_DEFINITION = {"max-length": 1000}
EXCHANGE_POLICY, EXCHANGE_POLICY_DEFINITION = "typed-x-policy", {"alternate-exchange": "amq.fanout"}
STATS_WAIT_SECONDS = 30.0  # RabbitMQ shows a new object's figures after its next statistics round (5 s)

# name -> path, with {vhost}, {node}, {connection}, {channel}, {amqp_port} filled in
ENDPOINTS = {
    "overview": "/api/overview",
    "whoami": "/api/whoami",
    "nodes": "/api/nodes",
    "node": "/api/nodes/{node}",
    "connections": "/api/vhosts/{vhost}/connections",
    "connection": "/api/connections/{connection}",
    "channels": "/api/vhosts/{vhost}/channels",
    "channel": "/api/channels/{channel}",
    "consumers": "/api/consumers/{vhost}",
    "exchanges": "/api/exchanges/{vhost}",
    "exchange": "/api/exchanges/{vhost}/" + EXCHANGE,
    "queues": "/api/queues/{vhost}",
    "queue": "/api/queues/{vhost}/" + PLAIN_QUEUE,
    "queue_with_policy": "/api/queues/{vhost}/" + POLICY_QUEUE,
    "bindings": "/api/bindings/{vhost}",
    "queue_bindings": "/api/queues/{vhost}/" + PLAIN_QUEUE + "/bindings",
    "exchange_bindings_source": "/api/exchanges/{vhost}/" + EXCHANGE + "/bindings/source",
    "vhosts": "/api/vhosts",
    "vhost": "/api/vhosts/{vhost}",
    "users": "/api/users",
    "user": "/api/users/guest",
    "permissions": "/api/permissions",
    "permission": "/api/permissions/{vhost}/guest",
    "vhost_permissions": "/api/vhosts/{vhost}/permissions",
    "policies": "/api/policies/{vhost}",
    "policy": "/api/policies/{vhost}/" + POLICY,
    "definitions": "/api/definitions/{vhost}",
    "health_alarms": "/api/health/checks/alarms",
    "health_local_alarms": "/api/health/checks/local-alarms",
    "health_port_listener": "/api/health/checks/port-listener/{amqp_port}",
    "health_protocol_listener": "/api/health/checks/protocol-listener/amqp",
    "health_virtual_hosts": "/api/health/checks/virtual-hosts",
    "healthchecks_node": "/api/healthchecks/node",
    "aliveness_test": "/api/aliveness-test/{vhost}",
}

# Maps whose keys are data, not field names: only their own type is compared.
FREE_FORM = {"arguments", "client_properties", "definition", "effective_policy_definition",
             "cluster_state", "capabilities"}


def json_type(value):
    """The JSON type of a decoded value: null, boolean, integer, float, string, array, object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def field_types(answer):
    """C{{path: Counter of JSON types}} of every value in C{answer}; the answer itself is C{""}."""
    found = collections.defaultdict(collections.Counter)

    def walk(path, value, key=None):
        found[path][json_type(value)] += 1
        if isinstance(value, dict) and key not in FREE_FORM:
            for name, inner in value.items():
                walk(f"{path}.{name}" if path else name, inner, name)
        elif isinstance(value, list):
            for inner in value:
                walk(path + "[]", inner, key)

    walk("", answer)
    return found


def parent_of(path):
    """The path of the value holding C{path}'s (C{""} for the answer's own fields)."""
    if path.endswith("[]"):
        return path[:-2]
    cut = path.rfind(".")
    return path[:cut] if cut >= 0 else ""


def reference_fields(answer):
    """
    C{{path: {"types": [...], "required": bool}}}: a field is required when
    every object holding such fields has it.
    """
    found = field_types(answer)
    objects = {path: counts.get("object", 0) for path, counts in found.items()}
    fields = {}
    for path, counts in sorted(found.items()):
        if path == "":
            continue
        holder = parent_of(path)
        fields[path] = {"types": sorted(counts),
                        "required": sum(counts.values()) >= objects.get(holder, 0)}
    return fields


class Client:
    """Requests to a management API as guest; answers are C{(status, JSON or None)}."""

    def __init__(self, base, user="guest", password="guest"):
        self.base = base.rstrip("/")
        self.authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def request(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", self.authorization)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        return status, (json.loads(raw) if raw else None)

    def get(self, path):
        status, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body

    def put(self, path, body):
        status, answer = self.request("PUT", path, body)
        assert status in (201, 204), (path, status, answer)


def segment(name):
    return quote(name, safe="")


def make_objects(client, amqp_port):
    """
    Make the objects on the broker behind C{client}; the pika connection that
    consumes (to be closed by the caller).
    """
    vhost = segment(VHOST)
    client.put(f"/api/vhosts/{vhost}", {})
    client.put(f"/api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    client.put(f"/api/policies/{vhost}/{POLICY}", {
        "pattern": f"^{POLICY_QUEUE}$", "definition": POLICY_DEFINITION, "apply-to": "queues",
        "priority": 0})
    client.put(f"/api/policies/{vhost}/{EXCHANGE_POLICY}", {
        "pattern": f"^{EXCHANGE}$", "definition": EXCHANGE_POLICY_DEFINITION, "apply-to": "exchanges",
        "priority": 0})
    for queue in (PLAIN_QUEUE, POLICY_QUEUE):
        client.put(f"/api/queues/{vhost}/{queue}", {"durable": True, "arguments": {}})
    client.put(f"/api/exchanges/{vhost}/{EXCHANGE}", {"type": "direct", "durable": True})
    status, answer = client.request(
        "POST", f"/api/bindings/{vhost}/e/{EXCHANGE}/q/{PLAIN_QUEUE}", {"routing_key": "k"})
    assert status == 201, answer
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", amqp_port, VHOST, pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=10))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    channel.confirm_delivery()
    channel.basic_publish("", POLICY_QUEUE, b"waiting")
    got = []
    channel.basic_consume(PLAIN_QUEUE, lambda ch, method, properties, body: got.append(method))
    channel.basic_publish(EXCHANGE, "k", b"consumed")
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    assert got, "the consumer got nothing"
    channel.basic_ack(got[0].delivery_tag)
    connection.process_data_events(0)
    return connection


def fetch_all(client, amqp_port, node):
    """Every endpoint's answer, the connection's and the channel's named from the listings."""
    vhost = segment(VHOST)
    [connection] = client.get(f"/api/vhosts/{vhost}/connections")
    [channel] = client.get(f"/api/vhosts/{vhost}/channels")
    names = {"vhost": vhost, "node": segment(node), "connection": segment(connection["name"]),
             "channel": segment(channel["name"]), "amqp_port": amqp_port}
    return {name: client.get(path.format(**names)) for name, path in ENDPOINTS.items()}


def covered(path, patterns):
    """
    The reason C{patterns} ({pattern: reason}) give for C{path} (a pattern
    covers what is inside it too, and may hold C{*}, which stops at a dot; a list's items are matched
    without their leading C{[].}), or None.
    """
    path = path.removeprefix("[].")
    for pattern, reason in patterns.items():
        matches = re.compile(re.escape(pattern).replace(r"\*", "[^.]*") + r"\Z").match
        if any(matches(candidate) for candidate in (path, *_holders(path))):
            return reason
    return None


def _holders(path):
    while path:
        path = parent_of(path)
        if path:
            yield path


def compare(reference, answer, not_provided):
    """
    The differences of C{answer} from the C{reference} fields of one endpoint,
    as lines: a type RabbitMQ never gives there, a null where RabbitMQ leaves
    the field out, or a field RabbitMQ always gives that is missing and not in
    C{not_provided} ({pattern: reason}). Other fields brokerd adds are not compared.
    """
    found = field_types(answer)
    known_holders = {"", "[]", *reference}
    problems = []
    for path, counts in sorted(found.items()):
        wanted = reference.get(path)
        if path and wanted is not None and not set(counts) <= set(wanted["types"]):
            problems.append(f"{path}: {sorted(counts)}, RabbitMQ gives {wanted['types']}")
        elif path and wanted is None and "null" in counts and parent_of(path) in known_holders:
            problems.append(f"{path}: null, RabbitMQ leaves it out")
    for path, wanted in sorted(reference.items()):
        holder = parent_of(path)
        holder_present = "object" in found.get(holder, {})
        if (wanted["required"] and holder_present and path not in found
                and covered(path, not_provided) is None):
            problems.append(f"{path}: missing (RabbitMQ gives {wanted['types']})")
    return problems


def remove_objects(client):
    client.request("DELETE", f"/api/vhosts/{segment(VHOST)}")


def _stats_shown(client):
    """True once RabbitMQ lists the figures of the queue, the connection and the channel, idle."""
    vhost = segment(VHOST)
    queue = client.get(f"/api/queues/{vhost}/{PLAIN_QUEUE}")
    connections = client.get(f"/api/vhosts/{vhost}/connections")
    channels = client.get(f"/api/vhosts/{vhost}/channels")
    return ("ack" in queue.get("message_stats", {}) and "idle_since" in queue and connections
            and "recv_oct" in connections[0] and channels and "ack" in channels[0].get("message_stats", {})
            and "idle_since" in channels[0])


def capture(base, amqp_port, output):
    client = Client(base)
    node = client.get("/api/overview")["node"]
    connection = make_objects(client, amqp_port)
    try:
        deadline = time.monotonic() + STATS_WAIT_SECONDS
        while not _stats_shown(client):
            assert time.monotonic() < deadline, "RabbitMQ did not show the objects' figures"
            connection.process_data_events(0.5)
        answers = fetch_all(client, amqp_port, node)
        version = answers["overview"]["rabbitmq_version"]
    finally:
        connection.close()
        remove_objects(client)
    document = {
        "captured_from": f"RabbitMQ {version} with the management plugin, by tests/support/api_types.py",
        "endpoints": {name: {"path": ENDPOINTS[name], "fields": reference_fields(answer)}
                      for name, answer in answers.items()},
    }
    write_reference(document, output)


def write_reference(document, output):
    """The reference map as JSON with one line per field, so that a new capture reads as a diff."""
    lines = ["{", f' "captured_from": {json.dumps(document["captured_from"])},', ' "endpoints": {']
    endpoints = sorted(document["endpoints"].items())
    for number, (name, endpoint) in enumerate(endpoints):
        lines.append(f'  {json.dumps(name)}: {{"path": {json.dumps(endpoint["path"])}, "fields": {{')
        fields = sorted(endpoint["fields"].items())
        lines += [f"   {json.dumps(path)}: {json.dumps(field, sort_keys=True)}"
                  + ("," if index < len(fields) - 1 else "") for index, (path, field) in enumerate(fields)]
        lines.append("  }}" + ("," if number < len(endpoints) - 1 else ""))
    lines += [" }", "}"]
    with open(output, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    capture(sys.argv[1], int(sys.argv[2]), sys.argv[3])
