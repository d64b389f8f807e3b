"""Definitions through a real broker process: ``--load-definitions`` with a file shaped as
RabbitMQ 3.10.8 writes it (its user logs in over AMQP with pika and its old password; a
message routes through its exchange-to-exchange binding), a bad file stopping the start in
one line, and the command line's policy commands and definitions export and import."""

import json

import pika
import pytest

from brokerd.testing import BrokerProcess, native_cli
from tests.support.access import RABBITMQ_GUEST_HASH, rabbitmq_definitions

# Made by RabbitMQ 3.10.8 (rabbitmqctl add_user bob pw, then export_definitions).
RABBITMQ_BOB_HASH = "ckma6IgknTErb6p2qaZibVPFDc1BVeitYVRboDXWedJ6EbA3"


def definitions_file(tmp_path, document):
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("definitions")
    document = rabbitmq_definitions()
    document["users"].append({"name": "bob", "password_hash": RABBITMQ_BOB_HASH,
                              "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": [], "limits": {}})
    document["permissions"].append({"user": "bob", "vhost": "team", "configure": "", "write": "^ingress$",
                                    "read": "^orders\\.q$"})
    process = BrokerProcess(["--backend=memory", "--data-dir", str(tmp_path / "data"), "--native",
                             "tcp:0:interface=127.0.0.1", "--load-definitions", definitions_file(tmp_path, document)],
                            cwd=str(tmp_path))
    process.native = process.wait_listening("native protocol")
    process.amqp = process.wait_listening("AMQP")
    process.tmp_path = tmp_path
    yield process
    assert process.stop() == 0
    assert not any("Traceback" in line for line in process.output), process.tail()


def test_an_imported_user_logs_in_with_its_old_password_and_routing_follows_the_e2e_binding(broker):
    assert broker.wait_for_output(r"definitions imported from .*definitions\.json \(--load-definitions\)$")
    host, port = broker.amqp.split(":")[1:]
    parameters = pika.ConnectionParameters(host, int(port), "team", pika.PlainCredentials("bob", "pw"))
    with pika.BlockingConnection(parameters) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("ingress", "order.new", b"routed", pika.BasicProperties(delivery_mode=2))
        method, _properties, body = channel.basic_get("orders.q", auto_ack=True)
        assert body == b"routed" and method.routing_key == "order.new"
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(host, int(port), "team",
                                                          pika.PlainCredentials("bob", "not pw")))


def test_policies_are_set_listed_and_cleared_from_the_command_line(broker):
    set_policy = native_cli(broker.native, "set-policy", "--vhost", "team", "--priority", "7", "--apply-to", "queues",
                            "cap", "^orders", '{"max-length": 100}')
    assert set_policy.returncode == 0, set_policy.stderr
    assert set_policy.stderr.decode() == ("python -m brokerd.native set-policy is deprecated; use: brokerd-admin"
                                          " set-policy [--vhost V] [--priority N] [--apply-to all|queues|exchanges]"
                                          " NAME PATTERN DEFINITION\n")
    listed = native_cli(broker.native, "list-policies", "--vhost", "team")
    assert listed.stderr.decode() == ("python -m brokerd.native list-policies is deprecated; use: brokerd-admin"
                                      " list policies --vhost V\n")
    assert listed.stdout.decode().splitlines() == [
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority",
        "team\tcap\t^orders\tqueues\t{\"max-length\":100}\t7",
        "team\tttl\t^ttl\\.\tqueues\t{\"max-length\":10,\"message-ttl\":60000}\t3",
    ]
    missing = native_cli(broker.native, "clear-policy", "--vhost", "team", "nonesuch")
    assert (missing.returncode, missing.stderr.decode().splitlines()) == (1, [
        "python -m brokerd.native clear-policy is deprecated; use: brokerd-admin clear-policy [--vhost V] NAME",
        "error: 404 NOT_FOUND - Parameter does not exist"])


def test_definitions_export_and_import_from_the_command_line(broker):
    exported_path = broker.tmp_path / "exported.json"
    exported = native_cli(broker.native, "export-definitions", str(exported_path))
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr == (b"python -m brokerd.native export-definitions is deprecated;"
                               b" use: brokerd-admin export FILE\n")
    document = json.loads(exported_path.read_text(encoding="utf-8"))
    assert {"name": "bob", "password_hash": RABBITMQ_BOB_HASH, "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": [], "limits": {}} in document["users"]
    assert {"source": "ingress", "vhost": "team", "destination": "orders", "destination_type": "exchange",
            "routing_key": "order.*", "arguments": {"k": 1}} in document["bindings"]
    document["vhosts"].append({"name": "copied"})
    document["queues"].append({"name": "added.q", "vhost": "copied", "durable": True, "auto_delete": False,
                               "arguments": {"x-max-length": 3}})
    exported_path.write_text(json.dumps(document), encoding="utf-8")
    imported = native_cli(broker.native, "import-definitions", str(exported_path))
    assert imported.returncode == 0, imported.stderr
    assert imported.stderr == (b"python -m brokerd.native import-definitions is deprecated;"
                               b" use: brokerd-admin import FILE\n")
    again = json.loads(native_cli(broker.native, "export-definitions", "-").stdout)
    assert again["queues"] == sorted(document["queues"], key=lambda entry: (entry["vhost"], entry["name"]))
    document["queues"][0]["arguments"] = {"x-max-length": "many"}
    exported_path.write_text(json.dumps(document), encoding="utf-8")
    refused = native_cli(broker.native, "import-definitions", str(exported_path))
    assert refused.returncode == 1 and b"406 PRECONDITION_FAILED - queues: " in refused.stderr


def test_a_bad_definitions_file_stops_the_start_in_one_line(tmp_path):
    document = {"users": [{"name": "guest", "password_hash": RABBITMQ_GUEST_HASH, "tags": "administrator",
                           "hashing_algorithm": "rabbit_password_hashing_sha512"}]}
    path = definitions_file(tmp_path, document)
    process = BrokerProcess(["--backend=memory", "--data-dir", str(tmp_path / "data"), "--native", "none",
                             "--load-definitions", path], cwd=str(tmp_path))
    assert process.process.wait(60) == 1
    process.stop()
    failures = [line for line in process.output if "could not start" in line]
    assert len(failures) == 1 and f"brokerd could not start: --load-definitions={path}: users: user 'guest' has a" \
        " password hash made by 'rabbit_password_hashing_sha512'" in failures[0], process.output
    assert not any("Traceback" in line for line in process.output), process.output
