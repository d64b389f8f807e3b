"""Topic permissions in the access database and rabbitmqctl's commands, protocol-free: a real
database in a temporary directory and a real broker on a memory store. Entries are on disk when a
change returns, go with their user or vhost, and the compiled rules a connection holds follow every
change; the commands answer with rabbitmqctl's tables, refusals and log lines (RabbitMQ 3.10.8's)."""

import json

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from brokerd.access.commands import Table
from brokerd.access.definitions import DefinitionsRefused, export_definitions, import_definitions
from brokerd.access.topic_permissions import TopicPermission, check_topic_write
from brokerd.errors import AccessRefused, NotFound, PreconditionFailed
from brokerd.model.message import Message
from tests.support.access import access, management, on_disk, result, run  # noqa: F401 (fixtures)
from tests.support.broker import make_broker, properties
from tests.support.paths import ROOT

REFERENCE_EXPORT = ROOT / "tests" / "support" / "rabbitmq-3.10.8-topic-permissions.json"


def test_entries_are_one_per_exchange_on_disk_at_once_and_go_with_their_user_or_vhost(access):
    access.add_user("alice", "pw")
    access.add_vhost("team")
    access.set_topic_permissions("alice", "/", "amq.topic", "^a", "^r")
    access.set_topic_permissions("alice", "/", "amq.topic", "^a2", "^r2")  # replaces
    access.set_topic_permissions("alice", "/", "events", "", "")
    access.set_topic_permissions("alice", "team", "amq.topic", "^t", "^t")
    reread = on_disk(access)
    assert reread.topic_permissions.of("alice", "/") == [
        ("alice", "/", TopicPermission("amq.topic", "^a2", "^r2")), ("alice", "/", TopicPermission("events", "", ""))]
    assert reread.document()["topic_permissions"][0] == {
        "user": "alice", "vhost": "/", "exchange": "amq.topic", "write": "^a2", "read": "^r2"}
    access.clear_topic_permissions("alice", "/", "events")
    assert [entry[2].exchange for entry in on_disk(access).topic_permissions.of("alice")] == ["amq.topic", "amq.topic"]
    access.delete_vhost("team")
    assert on_disk(access).topic_permissions.of() == [("alice", "/", TopicPermission("amq.topic", "^a2", "^r2"))]
    access.delete_user("alice")
    assert on_disk(access).topic_permissions.of() == []


def test_a_database_written_before_topic_permissions_opens_without_any(access):
    document = access.document()
    del document["topic_permissions"]
    with open(access.path, "w") as file:
        json.dump(document, file)
    assert on_disk(access).topic_permissions.of() == []


def test_the_rules_a_connection_holds_follow_every_change_with_names_expanded(access):
    broker, _ = make_broker()
    vhost = broker.add_vhost("/")
    access.add_user("a(b", "pw")  # a name that makes {username} an invalid expression
    rules = access.topic_rules("guest", "/")
    assert rules == {} and access.topic_rules("guest", "/") is rules
    access.set_topic_permissions("guest", "/", "amq.topic", "^{username}\\.{vhost}$", "")
    assert set(rules) == {"amq.topic"}
    check_topic_write(rules, vhost, "amq.topic", "guest./", "guest")
    with pytest.raises(AccessRefused) as refused:
        check_topic_write(rules, vhost, "amq.topic", "guest.x", "guest")
    assert refused.value.text == (
        "access to topic 'guest.x' in exchange 'amq.topic' in vhost '/' refused for user 'guest'")
    access.set_topic_permissions("a(b", "/", "amq.topic", "^{username}", "")
    with pytest.raises(AccessRefused):
        check_topic_write(access.topic_rules("a(b", "/"), vhost, "amq.topic", "a(b", "a(b")
    access.clear_topic_permissions("guest", "/")
    assert rules == {}
    access.set_topic_permissions("guest", "/", "amq.topic", "^x", "")
    access.open()  # read again from the file: the same dict, refilled
    assert set(rules) == {"amq.topic"}


def test_the_commands_set_list_and_clear_with_rabbitmqctls_tables(management, access):
    run(management, "add_user", "alice", "pw")
    run(management, "add_vhost", "team")
    run(management, "set_topic_permissions", "alice", "events", "^w", "^r", vhost="team")
    run(management, "set_topic_permissions", "alice", "amq.topic", "^w2", "", vhost="team")
    run(management, "set_topic_permissions", "alice", "amq.topic", "^x", "^y")
    assert run(management, "list_topic_permissions", vhost="team") == Table(
        ("user", "exchange", "write", "read"), [("alice", "amq.topic", "^w2", ""), ("alice", "events", "^w", "^r")])
    assert run(management, "list_user_topic_permissions", "alice") == Table(
        ("vhost", "exchange", "write", "read"),
        [("/", "amq.topic", "^x", "^y"), ("team", "amq.topic", "^w2", ""), ("team", "events", "^w", "^r")])
    run(management, "clear_topic_permissions", "alice", "events", vhost="team")
    assert [row[1] for row in run(management, "list_topic_permissions", vhost="team").rows] == ["amq.topic"]
    run(management, "clear_topic_permissions", "alice", vhost="team")
    run(management, "clear_topic_permissions", "alice", vhost="team")  # none: no error, as rabbitmqctl
    assert run(management, "list_topic_permissions", vhost="team").rows == []
    assert on_disk(access).topic_permissions.of() == [("alice", "/", TopicPermission("amq.topic", "^x", "^y"))]


@pytest.mark.parametrize("command, text", [
    (("set_topic_permissions", "nobody", "x", "a", "b"), "User nobody does not exist"),
    (("clear_topic_permissions", "nobody"), "User nobody does not exist"),
    (("list_user_topic_permissions", "nobody"), "User nobody does not exist"),
])
def test_an_unknown_user_is_404_in_rabbitmqctls_words(management, command, text):
    with pytest.raises(NotFound) as refused:
        run(management, *command)
    assert refused.value.text == text


@pytest.mark.parametrize("command, text", [
    (("set_topic_permissions", "guest", "x", "a", "b"), "Virtual host nowhere does not exist"),
    (("clear_topic_permissions", "guest"), "Virtual host nowhere does not exist"),
    (("list_topic_permissions",), "Virtual host 'nowhere' does not exist"),
])
def test_an_unknown_vhost_is_404_in_rabbitmqctls_words(management, command, text):
    with pytest.raises(NotFound) as refused:
        run(management, *command, vhost="nowhere")
    assert refused.value.text == text


def test_an_invalid_expression_is_refused_and_changes_nothing(management, access):
    before = on_disk(access).document()
    with pytest.raises(PreconditionFailed) as refused:
        run(management, "set_topic_permissions", "guest", "amq.topic", "(", "")
    assert refused.value.text == "regular expression '(' is invalid"
    assert on_disk(access).document() == before


def test_each_change_is_logged_with_who_made_it(management):
    lines = []

    def observe(event):
        if event.get("log_namespace") == "brokerd.access.commands":
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        run(management, "set_topic_permissions", "guest", "amq.topic", "^a", "^b")
        run(management, "clear_topic_permissions", "guest", "amq.topic")
        run(management, "clear_topic_permissions", "guest")
    finally:
        globalLogPublisher.removeObserver(observe)
    assert lines == [
        "Set topic permissions on exchange 'amq.topic' for user 'guest' in vhost '/' to '^a', '^b' (by user 'guest')",
        "Cleared topic permissions on exchange 'amq.topic' for user 'guest' in vhost '/' (by user 'guest')",
        "Cleared topic permissions for user 'guest' in vhost '/' (by user 'guest')",
    ]


def test_a_rabbitmq_export_with_topic_permissions_imports_and_exports_them_again(access):
    """The export is RabbitMQ 3.10.8's own (GET /api/definitions on a reference node, cut to one vhost)."""
    document = json.loads(REFERENCE_EXPORT.read_text())
    broker, _ = make_broker()
    broker.store.open()
    broker.add_vhost("/")
    result(import_definitions(broker, access, document))
    user, vhost = "i31-topicperm-alice", "i31-topicperm-export"
    assert on_disk(access).check_password(user, "alice-pw")
    rules = access.topic_rules(user, vhost)
    served = broker.vhosts[vhost]
    check_topic_write(rules, served, "events", f"{user}.x", user)
    with pytest.raises(AccessRefused):
        check_topic_write(rules, served, "events", "public.x", user)
    check_topic_write(rules, served, "amq.topic", f"{vhost}.x", user)
    assert served.publish("events", Message("events", "public.news", properties(), b"x"))[0] == 1

    def key(entry):
        return json.dumps(entry, sort_keys=True)

    exported = export_definitions(broker, access)["topic_permissions"]
    assert sorted(exported, key=key) == sorted(document["topic_permissions"], key=key)


def test_a_malformed_topic_permission_refuses_the_whole_document(access):
    broker, _ = make_broker()
    broker.store.open()
    broker.add_vhost("/")
    for entry, fault in [
        ({"user": "guest", "vhost": "/", "exchange": "x", "write": "(", "read": ""}, "write expression '('"),
        ({"user": "nobody", "vhost": "/", "exchange": "x", "write": "", "read": ""}, "User nobody does not exist"),
        ({"user": "guest", "vhost": "nowhere", "exchange": "x", "write": "", "read": ""}, "Virtual host 'nowhere'"),
        ({"user": "guest", "vhost": "/", "exchange": 1, "write": "", "read": ""}, "must be strings"),
    ]:
        document = {"users": [{"name": "new", "password": "pw", "tags": []}], "topic_permissions": [entry]}
        with pytest.raises(DefinitionsRefused) as refused:
            result(import_definitions(broker, access, document))
        assert fault in str(refused.value) and "topic_permissions" in str(refused.value)
        assert access.user("new") is None and access.topic_permissions.of() == []
