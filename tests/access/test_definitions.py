"""Definitions export and import, protocol-free: real access databases in temporary directories
and real brokers on memory stores. A document shaped as RabbitMQ 3.10.8's management API
writes it imports; export -> import into a fresh broker gives the same definitions; a
malformed document is one error and changes nothing."""

import copy
import json

import pytest

from brokerd.access.database import AccessDatabase
from brokerd.access.definitions import DefinitionsRefused, export_definitions, import_definitions, parse_definitions
from brokerd.model.message import Message
from brokerd.model.policy_effects import Policy
from brokerd.session.connection import Connection
from tests.support.access import (
    comparable,
    on_disk,
    rabbitmq_definitions,
    result,
)
from tests.support.broker import make_broker, properties


def fresh(tmp_path, name):
    access = AccessDatabase.in_directory(str(tmp_path / name))
    access.open()
    broker, _ = make_broker()
    broker.store.open()
    return broker, access


def imported(broker, access, document, vhost=None):
    return result(import_definitions(broker, access, copy.deepcopy(document), vhost))


def test_a_rabbitmq_export_imports_with_its_passwords_routing_and_policies(tmp_path):
    broker, access = fresh(tmp_path, "a")
    imported(broker, access, rabbitmq_definitions())
    reread = on_disk(access)
    assert reread.check_password("alice", "pässwörd€") and reread.check_password("guest", "guest")
    assert reread.user("alice").tags == ("management", "policymaker")
    assert reread.permissions_of("alice", "team").as_tuple() == ("^alice", ".*", ".*")
    assert reread.policies("team") == [Policy("team", "ttl", "^ttl\\.", {"max-length": 10, "message-ttl": 60000},
                                              3, "queues")]
    team = broker.vhosts["team"]
    assert team.queues["orders.q"].arguments == {"x-message-ttl": 5000, "x-max-priority": 5, "x-queue-mode": "lazy"}
    assert team.queues["ttl.q"].auto_delete and team.exchanges["ae"].internal
    assert team.exchanges["ingress"].arguments == {"alternate-exchange": "ae"}
    # order.new goes ingress -> (e2e, order.*) orders -> (order.new) orders.q
    assert team.publish("ingress", Message("ingress", "order.new", properties(), b"x"))[0] == 1
    assert team.queues["orders.q"].message_count == 1
    assert team.publish("amq.direct", Message("amq.direct", "from-amq", properties(), b"y"))[0] == 1


def test_export_then_import_into_a_fresh_broker_gives_the_same_definitions(tmp_path):
    broker, access = fresh(tmp_path, "a")
    imported(broker, access, rabbitmq_definitions())
    broker.vhosts["team"].declare_queue("transient", durable=False)
    broker.vhosts["team"].declare_queue("mine", Connection(broker, "team"), durable=True, exclusive=True)
    exported = export_definitions(broker, access)
    assert {"name": "transient", "vhost": "team", "durable": False, "auto_delete": False, "arguments": {}} \
        in exported["queues"]
    assert exported["product_name"] == "brokerd" and exported["rabbit_version"] == "3.10.8"
    again_broker, again_access = fresh(tmp_path, "b")
    imported(again_broker, again_access, json.loads(json.dumps(exported)))
    assert comparable(export_definitions(again_broker, again_access)) == comparable(exported)
    original = rabbitmq_definitions()
    for section in ("vhosts", "permissions", "policies", "queues", "exchanges", "bindings"):
        assert len(exported[section]) == len(original[section]) + (section == "queues"), section


def test_importing_again_changes_nothing(tmp_path):
    broker, access = fresh(tmp_path, "a")
    imported(broker, access, rabbitmq_definitions())
    before = (on_disk(access).document(), export_definitions(broker, access))
    imported(broker, access, rabbitmq_definitions())
    assert (on_disk(access).document(), export_definitions(broker, access)) == before


def test_one_vhosts_definitions_export_without_vhost_fields_and_import_into_another(tmp_path):
    broker, access = fresh(tmp_path, "a")
    imported(broker, access, rabbitmq_definitions())
    exported = export_definitions(broker, access, "team")
    assert sorted(exported) == ["bindings", "exchanges", "parameters", "policies", "queues", "rabbit_version"]
    assert all("vhost" not in entry for section in ("queues", "exchanges", "bindings") for entry in exported[section])
    access.add_vhost("copy")
    broker.add_vhost("copy")
    imported(broker, access, exported, vhost="copy")
    assert sorted(broker.vhosts["copy"].queues) == ["orders.q", "ttl.q"]
    assert [policy.name for policy in access.policies("copy")] == ["ttl"]


@pytest.mark.parametrize(
    "change, complaint",
    [
        (lambda d: d.update(users={"alice": {}}), "users: a list of JSON objects is expected"),
        (lambda d: d["users"][0].update(hashing_algorithm="rabbit_password_hashing_md5"),
         "users: user 'alice' has a password hash made by 'rabbit_password_hashing_md5'"),
        (lambda d: d["permissions"][0].update(vhost="nowhere"), "permissions: Virtual host 'nowhere' does not exist"),
        (lambda d: d["policies"][0].update(pattern="("),
         "policies: Validation failed: pattern should be regular expression but is invalid"),
        (lambda d: d["exchanges"][0].update(type="x-nonesuch"), "exchanges: unknown exchange type 'x-nonesuch'"),
        (lambda d: d["queues"][0]["arguments"].update({"x-max-length": "many"}),
         "queues: PRECONDITION_FAILED - invalid arg 'x-max-length'"),
        (lambda d: d["bindings"][1]["arguments"].update({"x-match": "most"}), "bindings: PRECONDITION_FAILED"),
        (lambda d: d["bindings"][0].update(destination_type="topic"), "bindings: destination_type 'topic'"),
        (lambda d: d["queues"][0].update(durable="yes"), "'durable' must be true or false"),
        (lambda d: d["exchanges"][0].update(type="x-delayed-message"),
         "exchanges: invalid arg 'x-delayed-type' for exchange 'ingress' in vhost 'team': None is none of"),
        (lambda d: d["queues"][0].update(vhost="down"), "queues: vhost 'down' is down: its store cannot be opened"),
    ],
)
def test_a_malformed_document_is_one_error_and_changes_nothing(tmp_path, change, complaint):
    broker, access = fresh(tmp_path, "a")
    access.add_vhost("down")
    broker.mark_vhost_unavailable("down", "its store cannot be opened")
    document = rabbitmq_definitions()
    change(document)
    before = (on_disk(access).document(), export_definitions(broker, access))
    with pytest.raises(DefinitionsRefused) as refused:
        imported(broker, access, document)
    assert complaint in str(refused.value)
    assert (on_disk(access).document(), export_definitions(broker, access)) == before


@pytest.mark.parametrize("text", [b"{", b"[1, 2]", b"\xff"])
def test_text_that_is_not_a_json_object_is_refused(text):
    with pytest.raises(DefinitionsRefused):
        parse_definitions(text)
