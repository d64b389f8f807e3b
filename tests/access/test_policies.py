"""Policies in the access database and rabbitmqctl's policy commands, protocol-free: a real
database in a temporary directory and a real broker on a memory store, whose vhosts are
told their policies after every change. Refusals are RabbitMQ's codes and words."""

import json

import pytest

from brokerd.access.commands import NOT_AUTHORISED_OBJECT, NOT_AUTHORISED_VHOST, Table
from brokerd.access.database import AccessChangeRefused, AccessDatabase
from brokerd.access.policies import publish_all_policies
from brokerd.errors import AccessRefused, NotFound, PreconditionFailed
from brokerd.model.policy_effects import Policy
from tests.support.access import management, on_disk, run  # noqa: F401 (management: a fixture)


@pytest.fixture
def access(tmp_path):
    database = AccessDatabase.in_directory(str(tmp_path))
    database.open()
    database.add_vhost("team")
    return database


def test_policies_are_kept_per_vhost_on_disk_and_listed_highest_priority_first(access):
    access.set_policy("/", "ttl", "^ttl\\.", {"message-ttl": 60000}, 1, "queues")
    access.set_policy("/", "cap", ".*", {"max-length": 10}, 5)
    access.set_policy("team", "ttl", ".*", {"expires": 1000}, apply_to="all")
    reread = on_disk(access)
    assert reread.policies("/") == [Policy("/", "cap", ".*", {"max-length": 10}, 5, "all"),
                                    Policy("/", "ttl", "^ttl\\.", {"message-ttl": 60000}, 1, "queues")]
    assert reread.policies() == [*reread.policies("/"), Policy("team", "ttl", ".*", {"expires": 1000}, 0, "all")]
    access.set_policy("/", "cap", ".*", {"max-length": 20}, 5)  # replaces it
    access.clear_policy("/", "ttl")
    assert on_disk(access).policies("/") == [Policy("/", "cap", ".*", {"max-length": 20}, 5, "all")]
    access.delete_vhost("team")  # its policies go with it
    assert on_disk(access).policies("team") == []


def test_a_file_from_before_policies_reads_with_none(access):
    with open(access.path) as file:
        document = json.load(file)
    del document["policies"]
    with open(access.path, "w") as file:
        json.dump(document, file)
    assert on_disk(access).policies() == []


@pytest.mark.parametrize(
    "arguments, complaint",
    [
        (("/", "p", "(", {"max-length": 1}), "Validation failed: pattern should be regular expression but is invalid"),
        (("/", "p", "x", {"max-length": 1}, 0, "foo"),
         "Validation failed: apply-to 'foo' unrecognised; should be 'queues', 'exchanges' or 'all'"),
        (("/", "p", "x", [1]), "Validation failed: definition must be a dictionary: [1]"),
        (("/", "p", "x", {}), "Validation failed: no policy provided"),
        (("/", "p", "x", {"max-length": 1}, "high"), "Validation failed: priority should be a number, actually was"),
        (("nowhere", "p", "x", {"max-length": 1}), "no vhost 'nowhere'"),
    ],
)
def test_a_policy_rabbitmq_would_refuse_is_refused_in_its_words_and_changes_nothing(access, arguments, complaint):
    before = on_disk(access).document()
    with pytest.raises(AccessChangeRefused) as refused:
        access.set_policy(*arguments)
    assert str(refused.value).startswith(complaint)
    assert on_disk(access).document() == before


def test_set_policy_stores_it_and_tells_the_vhost_its_policies(management, access):
    assert run(management, "set_policy", "ttl", "^t", '{"message-ttl": 500}', "2", "queues", vhost="team") == \
        Table((), [])
    assert on_disk(access).policies("team") == [Policy("team", "ttl", "^t", {"message-ttl": 500}, 2, "queues")]
    assert management.broker.vhosts["team"].policies == access.policies("team")
    run(management, "set_policy", "all", ".*", '{"max-length": 3}', vhost="team")
    assert [policy.name for policy in management.broker.vhosts["team"].policies] == ["ttl", "all"]
    assert run(management, "list_policies", vhost="team") == Table(
        ("vhost", "name", "pattern", "apply-to", "definition", "priority"),
        [("team", "ttl", "^t", "queues", '{"message-ttl":500}', "2"),
         ("team", "all", ".*", "all", '{"max-length":3}', "0")])
    run(management, "clear_policy", "ttl", vhost="team")
    assert management.broker.vhosts["team"].policies == [Policy("team", "all", ".*", {"max-length": 3})]
    assert management.broker.vhosts["/"].policies == []  # other vhosts are not bothered


def test_a_policy_set_by_command_applies_to_the_vhosts_queues(management):
    """The command reaches the model: a queue of that vhost, declared before or after, gets the policy's limit."""
    team = management.broker.vhosts["team"]
    team.declare_queue("before")
    run(management, "set_policy", "cap", ".*", '{"max-length": 3}', vhost="team")
    team.declare_queue("after")
    assert [team.queues[name].policy.max_length for name in ("before", "after")] == [3, 3]
    run(management, "clear_policy", "cap", vhost="team")
    assert team.queues["before"].policy.max_length is None


def test_every_vhost_is_told_its_policies_at_start(management, access):
    access.set_policy("/", "a", ".*", {"max-length": 1})
    publish_all_policies(management.broker, access)
    assert management.broker.vhosts["/"].policies == [Policy("/", "a", ".*", {"max-length": 1})]
    assert management.broker.vhosts["team"].policies == []


@pytest.mark.parametrize(
    "command, error, text",
    [
        (("set_policy", "p", "x", "not json"), PreconditionFailed, "JSON decoding error. Reason:"),
        (("set_policy", "p", "x", '{"max-length": 1}', "x"), PreconditionFailed, "'x' priority must be a number"),
        (("set_policy", "p", "(", '{"max-length": 1}'), PreconditionFailed,
         "Validation failed: pattern should be regular expression"),
        (("clear_policy", "nope"), NotFound, "Parameter does not exist"),
    ],
)
def test_policy_command_refusals_are_rabbitmqs(management, access, command, error, text):
    with pytest.raises(error) as refused:
        run(management, *command)
    assert refused.value.text.startswith(text)
    assert access.policies() == []


def test_a_policymaker_may_set_policies_where_it_has_permissions_only(management, access):
    access.add_user("pm", "pw", ["policymaker"])
    access.set_permissions("pm", "team", "", "", "")
    access.add_user("viewer", "pw", ["management"])
    access.set_permissions("viewer", "team", "", "", "")
    run(management, "set_policy", "p", ".*", '{"max-length": 1}', user="pm", vhost="team")
    assert len(run(management, "list_policies", user="viewer", vhost="team").rows) == 1
    for user, vhost in (("pm", "/"), ("viewer", "team"), ("ghost", "team"), (None, "team")):
        with pytest.raises(AccessRefused) as refused:
            run(management, "set_policy", "q", ".*", '{"max-length": 1}', user=user, vhost=vhost)
        assert refused.value.text == NOT_AUTHORISED_OBJECT
    for user, vhost in (("viewer", "/"), ("ghost", "team")):
        with pytest.raises(AccessRefused) as refused:
            run(management, "list_policies", user=user, vhost=vhost)
        assert refused.value.text == NOT_AUTHORISED_VHOST
    assert [policy.name for policy in access.policies()] == ["p"]
