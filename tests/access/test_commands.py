"""The management commands, protocol-free: a real access database in a temporary
directory and a real broker on a memory store. Only an administrator may run
them; each change is on disk (a second database opened from the same file
sees it) when its Deferred fires; refusals are RabbitMQ's codes and words."""

import pytest
from twisted.logger import formatEvent, globalLogPublisher
from zope.interface.verify import verifyObject

from brokerd.access.commands import COMMANDS, NOT_ADMINISTRATOR, Table
from brokerd.access.database import Permissions
from brokerd.access.interfaces import IAccessCommands
from brokerd.errors import AccessRefused, InternalError, MethodNotImplemented, NotFound, PreconditionFailed
from brokerd.session.connection import Connection
from tests.support.access import access, management, on_disk, run  # noqa: F401 (fixtures: access, management)


def test_management_provides_its_interface(management):
    assert verifyObject(IAccessCommands, management)


# One valid call of every command, for the refusals.
EVERY_COMMAND = [
    ("add_vhost", "team"), ("delete_vhost", "/"), ("list_vhosts",), ("add_user", "bob2", "pw"),
    ("delete_user", "guest"), ("change_password", "guest", "new"), ("list_users",),
    ("set_user_tags", "guest"), ("set_permissions", "guest", "", "", ""), ("clear_permissions", "guest"),
    ("list_permissions",), ("export_definitions",), ("import_definitions", "{}"),
    ("set_topic_permissions", "guest", "amq.topic", "", ""), ("clear_topic_permissions", "guest"),
    ("list_topic_permissions",), ("list_user_topic_permissions", "guest"), ("trace_on",), ("trace_off",),
]
# The policy commands have rules of their own (tests/access/test_policies.py).
POLICY_COMMANDS = ["set_policy", "clear_policy", "list_policies"]


def test_every_command_is_covered():
    assert sorted([command[0] for command in EVERY_COMMAND] + POLICY_COMMANDS) == sorted(COMMANDS)


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=lambda command: command[0])
@pytest.mark.parametrize("who", ["no tags", "monitoring", "unknown", "nobody logged in", "demoted"])
def test_only_an_administrator_may_run_any_command_and_a_refusal_changes_nothing(management, access, command, who):
    access.add_user("bob", "pw", ["monitoring"] if who == "monitoring" else [])
    user = {"unknown": "ghost", "nobody logged in": None}.get(who, "bob")
    if who == "demoted":
        user = "guest"
        run(management, "set_user_tags", "guest", "monitoring")  # the last administrator demotes itself
    before = on_disk(access).document()
    with pytest.raises(AccessRefused) as refused:
        run(management, *command, user=user)
    assert refused.value.reply_code == 403
    assert refused.value.text == (NOT_ADMINISTRATOR if user else f"{NOT_ADMINISTRATOR} (no user logged in)")
    assert str(refused.value) == f"403 ACCESS_REFUSED - {refused.value.text}"
    assert on_disk(access).document() == before
    assert sorted(management.broker.vhosts) == ["/"]


def test_users_are_added_tagged_given_new_passwords_and_deleted_each_on_disk_at_once(management, access):
    assert run(management, "add_user", "alice", "pässwörd") == Table((), [])
    assert on_disk(access).check_password("alice", "pässwörd")
    run(management, "set_user_tags", "alice", "monitoring", "management")
    assert on_disk(access).user("alice").tags == ("monitoring", "management")
    assert run(management, "list_users") == Table(
        ("user", "tags"), [("alice", "[monitoring, management]"), ("guest", "[administrator]")]
    )
    run(management, "set_user_tags", "alice")
    assert on_disk(access).user("alice").tags == ()
    assert run(management, "list_users").rows[0] == ("alice", "[]")

    run(management, "change_password", "alice", "new one")
    reread = on_disk(access)
    assert reread.check_password("alice", "new one") and not reread.check_password("alice", "pässwörd")

    run(management, "set_permissions", "alice", ".*", ".*", ".*")
    run(management, "delete_user", "alice")
    reread = on_disk(access)
    assert reread.user("alice") is None and reread.permissions_of("alice", "/") is None


def test_a_new_administrator_may_manage(management, access):
    run(management, "add_user", "root", "pw")
    run(management, "set_user_tags", "root", "administrator")
    assert run(management, "list_vhosts", user="root") == Table(("name",), [("/",)])


@pytest.mark.parametrize(
    "command, error, text",
    [
        (("add_user", "guest", "pw"), PreconditionFailed, 'User "guest" already exists'),
        (("add_user", "", "pw"), PreconditionFailed, "user cannot be an empty string"),
        (("add_user", "x" * 256, "pw"), PreconditionFailed, "a user name must be 1 to 255 bytes of UTF-8"),
        (("delete_user", "nobody"), NotFound, 'User "nobody" does not exist'),
        (("change_password", "nobody", "pw"), NotFound, 'User "nobody" does not exist'),
        (("set_user_tags", "nobody", "administrator"), NotFound, 'User "nobody" does not exist'),
        (("set_user_tags", "guest", "a,b"), PreconditionFailed, "'a,b' is not a user tag"),
        (("delete_vhost", "nope"), NotFound, "Virtual host 'nope' does not exist"),
        (("add_vhost", "v" * 256), PreconditionFailed, "a vhost name must be 1 to 255 bytes of UTF-8"),
        (("set_permissions", "nobody", ".*", ".*", ".*"), NotFound, "User nobody does not exist"),
        (("set_permissions", "guest", ".*", "(", ".*"), PreconditionFailed, "regular expression '(' is invalid"),
        (("clear_permissions", "nobody"), NotFound, "User nobody does not exist"),
        (("list_users", "extra"), PreconditionFailed, "list_users takes no arguments, got 1 argument(s)"),
        (("set_permissions", "guest", ".*"), PreconditionFailed,
         "set_permissions takes USER CONFIGURE WRITE READ, got 2 argument(s)"),
        (("set_user_tags",), PreconditionFailed, "set_user_tags takes NAME [TAG...], got 0 argument(s)"),
        (("add_queue", "q"), MethodNotImplemented, "unknown management command 'add_queue'"),
    ],
)
def test_a_change_that_cannot_be_made_is_refused_in_rabbitmqs_words_and_changes_nothing(
        management, access, command, error, text):
    before = on_disk(access).document()
    with pytest.raises(error) as refused:
        run(management, *command)
    assert text in refused.value.text
    assert on_disk(access).document() == before


@pytest.mark.parametrize("command", ["set_permissions", "clear_permissions", "list_permissions"])
def test_the_permission_commands_name_an_unknown_vhost_as_rabbitmq_does(management, command):
    arguments = {"set_permissions": ("guest", ".*", ".*", ".*"), "clear_permissions": ("guest",)}.get(command, ())
    with pytest.raises(NotFound) as refused:
        run(management, command, *arguments, vhost="nope")
    # rabbitmqctl quotes the name in list_permissions' complaint but not in the other two's.
    quoted = "'nope'" if command == "list_permissions" else "nope"
    assert refused.value.text == f"Virtual host {quoted} does not exist"


def test_vhosts_are_added_served_listed_and_deleted_with_their_queues_and_permissions(management, access):
    broker = management.broker
    run(management, "add_vhost", "team")
    assert on_disk(access).vhost_exists("team")
    assert "amq.topic" in broker.vhost("team").exchanges
    run(management, "add_vhost", "team")  # as rabbitmqctl: adding one that exists is no error and no change
    run(management, "add_vhost", "a-team")
    assert run(management, "list_vhosts") == Table(("name",), [("/",), ("a-team",), ("team",)])

    run(management, "set_permissions", "guest", ".*", ".*", ".*", vhost="team")
    client = Connection(broker, "team")
    client.open_channel(1, None).queue_declare("jobs", durable=True)
    run(management, "delete_vhost", "team")
    reread = on_disk(access)
    assert not reread.vhost_exists("team") and reread.permissions_of("guest", "team") is None
    assert "team" not in broker.vhosts and client.closed
    assert list(broker.store.topology()) == []


def test_permissions_are_set_listed_and_cleared_per_vhost(management, access):
    run(management, "add_vhost", "team")
    run(management, "add_user", "zed", "pw")
    run(management, "add_user", "alice", "pw")
    run(management, "set_permissions", "zed", "^zed\\.", "", ".*", vhost="team")
    run(management, "set_permissions", "alice", ".*", ".*", ".*", vhost="team")
    assert on_disk(access).permissions_of("zed", "team") == Permissions("^zed\\.", "", ".*")
    assert run(management, "list_permissions", vhost="team") == Table(
        ("user", "configure", "write", "read"), [("alice", ".*", ".*", ".*"), ("zed", "^zed\\.", "", ".*")]
    )
    assert run(management, "list_permissions") == Table(("user", "configure", "write", "read"),
                                                        [("guest", ".*", ".*", ".*")])
    run(management, "clear_permissions", "zed", vhost="team")
    assert on_disk(access).permissions_of("zed", "team") is None
    run(management, "clear_permissions", "zed", vhost="team")  # none left to clear: no error, as rabbitmqctl
    assert [row[0] for row in run(management, "list_permissions", vhost="team").rows] == ["alice"]


def test_an_empty_vhost_means_the_default_one(management):
    run(management, "add_user", "alice", "pw")
    run(management, "set_permissions", "alice", "a", "b", "c", vhost="")
    assert ("alice", "a", "b", "c") in run(management, "list_permissions").rows


def test_a_change_the_database_cannot_write_is_541_and_undone(management, access, tmp_path):
    access.path = str(tmp_path / "gone" / "access.json")  # its directory does not exist: the save fails
    with pytest.raises(InternalError, match="the change could not be saved"):
        run(management, "add_user", "alice", "pw")
    assert access.user("alice") is None


def test_each_change_is_logged_with_who_made_it_and_never_a_password(management):
    lines = []

    def observe(event):
        if event.get("log_namespace") == "brokerd.access.commands":
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        run(management, "add_user", "alice", "s3cret")
        run(management, "change_password", "alice", "n3w")
        run(management, "set_user_tags", "alice", "monitoring", "management")
        run(management, "add_vhost", "team")
        run(management, "set_permissions", "alice", "^a", "", ".*", vhost="team")
        run(management, "clear_permissions", "alice", vhost="team")
        run(management, "delete_vhost", "team")
        run(management, "delete_user", "alice")
        run(management, "list_users")
    finally:
        globalLogPublisher.removeObserver(observe)
    assert lines == [
        "Created user 'alice' (by user 'guest')",
        "Changed password for user 'alice' (by user 'guest')",
        "Set user tags for user 'alice' to [monitoring, management] (by user 'guest')",
        "Added vhost 'team' (by user 'guest')",
        "Set permissions for user 'alice' in vhost 'team' to '^a', '', '.*' (by user 'guest')",
        "Cleared permissions for user 'alice' in vhost 'team' (by user 'guest')",
        "Deleted vhost 'team' (by user 'guest')",
        "Deleted user 'alice' (by user 'guest')",
    ]
