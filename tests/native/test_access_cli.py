"""Managing users, vhosts and permissions with ``python -m brokerd.native`` as
an operator runs it against a real broker process (sqlite store): rabbitmqctl's
arguments and tables, each change in the access database on disk when the
command exits and in effect for pika, a vhost with a store of its own,
one-line refusals in RabbitMQ's words, 403 for a user who is not an
administrator, and changes kept across a SIGKILL. The command line logs in as
guest, the first start's administrator, unless BROKERD_USER and
BROKERD_PASSWORD name another user. These commands are deprecated: each first
says on stderr which brokerd-admin command replaces it."""

import os
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from brokerd.access.database import AccessDatabase
from tests.support.client_broker import checked_for_tracebacks, pika_parameters, start_broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """The module's broker; besides guest it knows viewer (a monitoring user) and zed (no permissions)."""
    directory = tmp_path_factory.mktemp("management")
    access = AccessDatabase.in_directory(str(directory / "brokerd-data"))
    access.open()
    access.add_user("viewer", "viewer-pass", ["monitoring"])
    access.set_permissions("viewer", "/", ".*", ".*", ".*")
    access.add_user("zed", "zed-pass")
    running = start_broker(directory, "--backend=sqlite")
    running.access_path = access.path
    with checked_for_tracebacks(running):
        yield running
    running.process.stop()


def cli(broker, *args, user=None, password=None):
    """
    The command line run against C{broker} (as C{user}); returns (exit status, stdout, stderr) as text,
    stderr without its first line, checked to be the deprecation line naming the command's replacement.
    """
    env = dict(os.environ)
    if user is not None:
        env.update(BROKERD_USER=user, BROKERD_PASSWORD=password)
    result = subprocess.run([sys.executable, "-m", "brokerd.native", "--connect", broker.native_endpoint, *args],
                            env=env, capture_output=True, timeout=60)
    deprecation, _, errors = result.stderr.decode("utf-8").partition("\n")
    assert deprecation.startswith(f"python -m brokerd.native {args[0]} is deprecated; use: brokerd-admin "), deprecation
    return result.returncode, result.stdout.decode("utf-8"), errors


def test_each_management_command_first_names_the_brokerd_admin_command_replacing_it(broker):
    done = subprocess.run([sys.executable, "-m", "brokerd.native", "--connect", broker.native_endpoint, "list-users"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        0, "python -m brokerd.native list-users is deprecated; use: brokerd-admin list users\n")
    assert done.stdout.startswith("user\ttags\n")
    done = subprocess.run([sys.executable, "-m", "brokerd.native", "--connect", broker.native_endpoint, "add-user",
                           "guest", "pw"], capture_output=True, text=True, timeout=60)
    assert done.stderr.splitlines() == [
        "python -m brokerd.native add-user is deprecated; use: brokerd-admin add-user NAME PASSWORD",
        'error: 406 PRECONDITION_FAILED - User "guest" already exists']


DONE = (0, "", "")  # a change's outcome: exit status 0, nothing printed


def on_disk(broker):
    """The access database as the broker's data directory holds it now."""
    access = AccessDatabase(broker.access_path)
    access.open()
    return access


def connect(broker, user, password, vhost="/"):
    return pika.BlockingConnection(pika_parameters(broker, user, password, virtual_host=vhost))


def test_a_user_is_added_with_tags_and_permissions_logs_in_and_is_deleted(broker):
    assert cli(broker, "add-user", "alice", "pässwörd") == DONE
    assert on_disk(broker).check_password("alice", "pässwörd")
    assert cli(broker, "set-user-tags", "alice", "monitoring", "management") == DONE
    assert cli(broker, "set-permissions", "alice", "^alice\\.", "^alice\\.", ".*") == DONE
    assert cli(broker, "list-users") == (
        0, "user\ttags\nalice\t[monitoring, management]\nguest\t[administrator]\nviewer\t[monitoring]\nzed\t[]\n", ""
    )
    with connect(broker, "alice", "pässwörd") as alice:
        alice.channel().queue_declare("alice.q", auto_delete=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            alice.channel().queue_declare("bob.q")
        assert refused.value.reply_code == 403
    assert cli(broker, "delete-user", "alice") == DONE
    assert on_disk(broker).user("alice") is None
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(broker, "alice", "pässwörd")


def test_a_vhost_is_added_given_permissions_listed_and_deleted(broker):
    assert cli(broker, "add-vhost", "team") == DONE
    assert cli(broker, "set-permissions", "--vhost", "team", "zed", "^zed\\.", "", ".*") == DONE
    assert cli(broker, "list-vhosts") == (0, "name\n/\nteam\n", "")
    # As with rabbitmqctl, the administrator who adds a vhost gets no permissions on it.
    permissions = cli(broker, "list-permissions", "--vhost", "team")
    assert permissions == (0, "user\tconfigure\twrite\tread\nzed\t^zed\\.\t\t.*\n", "")
    with connect(broker, "zed", "zed-pass", vhost="team") as zed:
        zed.channel().queue_declare("zed.q", durable=True)
    assert cli(broker, "delete-vhost", "team") == DONE
    reread = on_disk(broker)
    assert not reread.vhost_exists("team") and reread.permissions_of("zed", "team") is None


def test_a_vhost_added_with_a_backend_keeps_its_own_store_and_a_bad_backend_is_refused(broker):
    assert cli(broker, "add-vhost", "own", "--backend", "sqlite") == DONE
    assert {"name": "own", "backend": "sqlite"} in on_disk(broker).document()["vhosts"]
    status, out, err = cli(broker, "add-vhost", "bad", "--backend", "nosuch")
    assert (status, out) == (1, "") and err.startswith("error: 406 PRECONDITION_FAILED - ") and "nosuch" in err
    assert not on_disk(broker).vhost_exists("bad")
    assert cli(broker, "delete-vhost", "own") == DONE


@pytest.mark.parametrize("args, complaint", [
    (("add-user", "guest", "pw"), '406 PRECONDITION_FAILED - User "guest" already exists'),
    (("delete-vhost", "nope"), "404 NOT_FOUND - Virtual host 'nope' does not exist"),
])
def test_a_refused_change_is_one_line_in_rabbitmqs_words(broker, args, complaint):
    assert cli(broker, *args) == (1, "", f"error: {complaint}\n")


def test_a_user_who_is_not_an_administrator_is_refused_with_403(broker):
    refused = cli(broker, "add-user", "eve", "pw", user="viewer", password="viewer-pass")
    assert refused == (1, "", "error: 403 ACCESS_REFUSED - Not administrator user\n")
    assert on_disk(broker).user("eve") is None


def test_changes_survive_a_sigkill(broker):
    """Runs last: it restarts the module's broker."""
    assert cli(broker, "add-vhost", "kept") == DONE
    assert cli(broker, "set-permissions", "--vhost", "kept", "zed", ".*", "", "") == DONE
    broker.process.restart(crash=True)
    restarted = type(broker)(broker.process)
    assert cli(restarted, "list-permissions", "--vhost", "kept") == (0, "user\tconfigure\twrite\tread\nzed\t.*\t\t\n",
                                                                     "")
    with connect(restarted, "zed", "zed-pass", vhost="kept"):
        pass
