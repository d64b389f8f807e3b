"""What the access tests share: RabbitMQ's own password hashes, an access database and the
rabbitmqctl commands over it (fixtures), running a command, and a RabbitMQ 3.10.8 definitions export."""

import json

import pytest
from twisted.internet import defer

from brokerd.access.commands import AccessCommands
from brokerd.access.database import AccessDatabase
from tests.support.broker import make_broker

# Made by RabbitMQ 3.10.8 itself: rabbit_password:hash(rabbit_password_hashing_sha256, Password),
# base64-encoded, in an erl shell with the rabbit and rabbit_common ebin directories on its path.
RABBITMQ_GUEST_HASH = "8txHRarwsi3hEPY9yatYhW6Ay1E4IeoBkkT4AO6byh5TQXOX"
RABBITMQ_UTF8_HASH = "kAd5Lvcr9lione4ixslkQwFfonvOMzHxWaQ8fpb3G7q4v4Yb"  # of "pässwörd€"


@pytest.fixture
def access(tmp_path):
    database = AccessDatabase.in_directory(str(tmp_path))
    database.open()
    return database


@pytest.fixture
def management(access):
    broker, _ = make_broker()
    broker.store.open()
    for name in access.vhosts:
        broker.add_vhost(name)
    return AccessCommands(broker, access)


def on_disk(access):
    """The database as a fresh start would read it from its file."""
    again = AccessDatabase(access.path)
    assert again.open() is False
    return again


def result(d):
    """What an already-fired Deferred fired with (raising its failure)."""
    assert isinstance(d, defer.Deferred) and d.called, d
    outcome = []
    d.addBoth(outcome.append)
    if hasattr(outcome[0], "raiseException"):
        outcome[0].raiseException()
    return outcome[0]


def run(management, *command, user="guest", vhost="/", backend=None):
    return result(management.run(user, command[0], command[1:], vhost, backend))


def rabbitmq_definitions():
    """Definitions as RabbitMQ 3.10.8 exports them (GET /api/definitions), field for field, with the
    fields its rabbitmqctl export_definitions adds (a vhost's limits and metadata, a queue's type)."""
    return {
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "product_name": "RabbitMQ",
        "product_version": "3.10.8",
        "users": [
            {"name": "alice", "password_hash": RABBITMQ_UTF8_HASH,
             "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management", "policymaker"],
             "limits": {"max-connections": 5}},
            {"name": "guest", "password_hash": RABBITMQ_GUEST_HASH,
             "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"], "limits": {}},
        ],
        "vhosts": [{"name": "team", "limits": [], "metadata": {"description": "", "tags": []}}, {"name": "/"}],
        "permissions": [
            {"user": "alice", "vhost": "team", "configure": "^alice", "write": ".*", "read": ".*"},
            {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        ],
        "topic_permissions": [{"user": "alice", "vhost": "team", "exchange": "amq.topic", "write": ".*",
                               "read": ".*"}],
        "parameters": [{"value": {"max-connections": 10}, "vhost": "team", "component": "vhost-limits",
                        "name": "limits"}],
        "global_parameters": [{"name": "cluster_name", "value": "rabbit@localhost"}],
        "policies": [{"vhost": "team", "name": "ttl", "pattern": "^ttl\\.", "apply-to": "queues",
                      "definition": {"max-length": 10, "message-ttl": 60000}, "priority": 3}],
        "queues": [
            {"name": "orders.q", "vhost": "team", "durable": True, "auto_delete": False, "type": "classic",
             "arguments": {"x-message-ttl": 5000, "x-max-priority": 5, "x-queue-mode": "lazy"}},
            {"name": "ttl.q", "vhost": "team", "durable": True, "auto_delete": True, "arguments": {}},
        ],
        "exchanges": [
            {"name": "ingress", "vhost": "team", "type": "topic", "durable": True, "auto_delete": False,
             "internal": False, "arguments": {"alternate-exchange": "ae"}},
            {"name": "ae", "vhost": "team", "type": "fanout", "durable": True, "auto_delete": False,
             "internal": True, "arguments": {}},
            {"name": "orders", "vhost": "team", "type": "direct", "durable": True, "auto_delete": False,
             "internal": False, "arguments": {}},
            {"name": "hdr", "vhost": "team", "type": "headers", "durable": True, "auto_delete": False,
             "internal": False, "arguments": {}},
        ],
        "bindings": [
            {"source": "amq.direct", "vhost": "team", "destination": "orders.q", "destination_type": "queue",
             "routing_key": "from-amq", "arguments": {}},
            {"source": "hdr", "vhost": "team", "destination": "orders.q", "destination_type": "queue",
             "routing_key": "", "arguments": {"by": "xyz", "dt": 1577836800, "x-match": "any"}},
            {"source": "ingress", "vhost": "team", "destination": "orders", "destination_type": "exchange",
             "routing_key": "order.*", "arguments": {"k": 1}},
            {"source": "orders", "vhost": "team", "destination": "orders.q", "destination_type": "queue",
             "routing_key": "order.new", "arguments": {}},
        ],
    }


def comparable(document):
    """The definitions with lists in a fixed order and brokerd's own fields left out."""
    document = {key: value for key, value in document.items() if key not in ("product_name", "product_version")}
    return {key: sorted(value, key=lambda entry: json.dumps(entry, sort_keys=True)) if isinstance(value, list)
            else value for key, value in document.items()}
