"""The access database in-process: RabbitMQ's password hashes, the first
start's defaults, durable changes, and the role the protocol servers see."""

import json
import os

import pytest
from zope.interface.verify import verifyObject

from brokerd.access.database import (
    ACCESS_FILE,
    AccessChangeRefused,
    AccessDatabase,
    AccessDatabaseDamaged,
    Permissions,
)
from brokerd.access.interfaces import IAccessDatabase
from brokerd.access.passwords import hash_password, password_matches
from tests.support.access import RABBITMQ_GUEST_HASH, RABBITMQ_UTF8_HASH


def test_hashes_made_by_rabbitmq_verify_against_their_passwords():
    assert password_matches(RABBITMQ_GUEST_HASH, "guest")
    assert password_matches(RABBITMQ_GUEST_HASH, b"guest")
    assert not password_matches(RABBITMQ_GUEST_HASH, "Guest")
    assert password_matches(RABBITMQ_UTF8_HASH, "pässwörd€")
    assert not password_matches(RABBITMQ_UTF8_HASH, "pässwörd€".encode("latin-1", "replace"))


def test_our_hashes_are_rabbitmqs_format_salted_afresh_each_time():
    salt = bytes.fromhex("f2dc4745")  # the salt of RABBITMQ_GUEST_HASH
    assert hash_password("guest", salt) == RABBITMQ_GUEST_HASH
    assert hash_password("guest") != hash_password("guest")
    assert not password_matches("not base64!", "guest")
    assert not password_matches("Z3Vlc3Q=", "guest")  # too short to hold a salt and a digest


def test_first_start_makes_guest_an_administrator_with_every_permission_on_slash(tmp_path):
    database = AccessDatabase.in_directory(str(tmp_path))
    assert database.open() is True
    assert database.vhosts == ["/"]
    assert database.user("guest").tags == ("administrator",)
    assert database.check_password("guest", "guest")
    assert database.permissions_of("guest", "/") == Permissions(".*", ".*", ".*")
    assert verifyObject(IAccessDatabase, database)
    document = json.loads((tmp_path / ACCESS_FILE).read_text())
    assert document["users"][0]["hashing_algorithm"] == "rabbit_password_hashing_sha256"


def test_a_default_user_replaces_guest_on_the_first_start_only(tmp_path):
    database = AccessDatabase.in_directory(str(tmp_path))
    database.open("admin", "s€cret")
    assert set(database.users) == {"admin"} and database.check_password("admin", "s€cret")
    again = AccessDatabase.in_directory(str(tmp_path))
    assert again.open("other", "x") is False
    assert set(again.users) == {"admin"}


def test_every_change_is_on_disk_when_it_returns(tmp_path):
    database = AccessDatabase.in_directory(str(tmp_path))
    database.open()
    database.add_user("alice", "päss", ["monitoring"])
    database.add_vhost("team")
    database.set_permissions("alice", "team", "^alice\\.", "^alice\\.", "")
    database.set_user_tags("alice", ["management", "policymaker"])
    database.delete_user("guest")
    reopened = AccessDatabase.in_directory(str(tmp_path))
    reopened.open()
    assert set(reopened.users) == {"alice"} and reopened.check_password("alice", "päss")
    assert reopened.user("alice").tags == ("management", "policymaker")
    assert reopened.vhosts == ["/", "team"]
    assert reopened.permissions_of("alice", "team") == Permissions("^alice\\.", "^alice\\.", "")
    assert reopened.permissions_of("guest", "/") is None  # deleted with its user
    reopened.delete_vhost("team")
    assert AccessDatabase.in_directory(str(tmp_path)).open() is False
    assert reopened.permissions == {}
    assert not os.path.exists(tmp_path / (ACCESS_FILE + ".tmp"))


@pytest.mark.parametrize(
    "change, complaint",
    [
        (lambda db: db.add_user("guest", "x"), "user 'guest' already exists"),
        (lambda db: db.add_vhost("/"), "vhost '/' already exists"),
        (lambda db: db.set_permissions("nobody", "/", ".*", ".*", ".*"), "no user 'nobody'"),
        (lambda db: db.set_permissions("guest", "nowhere", ".*", ".*", ".*"), "no vhost 'nowhere'"),
        (lambda db: db.set_permissions("guest", "/", "(", ".*", ".*"), "configure expression '(' is not valid"),
        (lambda db: db.delete_vhost("nowhere"), "no vhost 'nowhere'"),
        (lambda db: db.add_user("", "x"), "a user name must be 1 to 255 bytes"),
    ],
)
def test_a_change_that_names_nothing_or_is_malformed_is_refused_and_changes_nothing(change, complaint):
    database = AccessDatabase.in_memory()
    before = database.document()
    with pytest.raises(AccessChangeRefused, match=complaint.replace("(", r"\(")):
        change(database)
    assert database.document() == before


def test_a_change_that_cannot_be_written_is_undone(tmp_path):
    database = AccessDatabase.in_directory(str(tmp_path))
    database.open()
    (tmp_path / (ACCESS_FILE + ".tmp")).mkdir()  # where the new version would be written
    with pytest.raises(OSError):
        database.add_vhost("team")
    assert database.vhosts == ["/"]
    assert AccessDatabase.in_directory(str(tmp_path)).open() is False


def test_a_damaged_file_is_named_and_not_overwritten(tmp_path):
    (tmp_path / ACCESS_FILE).write_text("{not json")
    with pytest.raises(AccessDatabaseDamaged, match=f"access database {tmp_path / ACCESS_FILE} cannot be read"):
        AccessDatabase.in_directory(str(tmp_path)).open()
    assert (tmp_path / ACCESS_FILE).read_text() == "{not json"


def test_failed_logins_are_counted_per_user_name():
    database = AccessDatabase.in_memory()
    database.count_failed_login("guest")
    database.count_failed_login("guest")
    database.count_failed_login("mallory")
    assert database.failed_logins == {"guest": 2, "mallory": 1}


@pytest.mark.parametrize(
    "arguments, environment, defaults",
    [
        ([], {}, ("guest", "guest")),
        (["--default-user", "admin", "--default-pass", "pw"], {}, ("admin", "pw")),
        ([], {"RABBITMQ_DEFAULT_USER": "ops", "RABBITMQ_DEFAULT_PASS": "€"}, ("ops", "€")),
        (["--users", "USERS"], {}, (None, "guest")),  # a users file given on the first start replaces guest
    ],
    ids=["guest", "options", "environment", "users-file"],
)
def test_the_first_starts_administrator_comes_from_the_options_or_the_environment(
    tmp_path, monkeypatch, arguments, environment, defaults
):
    from brokerd.process.tap import Options

    for name in ("RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "users").write_text("alice:x\n")
    arguments = [str(tmp_path / "users") if argument == "USERS" else argument for argument in arguments]
    options = Options()
    options.parseOptions(["--backend", "memory", "--data-dir", str(tmp_path), "--amqp", "none", "--native", "none",
                          *arguments])
    assert options["access-defaults"] == defaults
    assert options["amqp-settings"].authenticator.access.path == str(tmp_path / ACCESS_FILE)


def test_another_nodes_document_replaces_the_database_durably_and_its_listeners_hear_each_save(tmp_path):
    leader = AccessDatabase.in_directory(str(tmp_path / "leader"))
    os.makedirs(tmp_path / "leader")
    saved = []
    leader.on_saved.append(saved.append)
    leader.open("admin", "secret")
    leader.add_user("alice", "pw", ("monitoring",))
    assert len(saved) == 2 and saved[-1] == leader.document_bytes()
    os.makedirs(tmp_path / "follower")
    follower = AccessDatabase.in_directory(str(tmp_path / "follower"))
    follower.replace_document(saved[-1])
    assert follower.user("alice").tags == ("monitoring",)
    reopened = AccessDatabase.in_directory(str(tmp_path / "follower"))
    assert reopened.open() is False and reopened.check_password("alice", "pw")


@pytest.mark.parametrize("data, named", [
    (b"\xff\xfe", "UnicodeDecodeError"),
    (b"[1, 2]", "AttributeError"),
    (b'{"format": "brokerd access database", "version": 1}', "KeyError"),
    (b'{"format": "something else", "version": 1, "users": []}', "not a brokerd access database"),
    (b"[" * 100000, "RecursionError"),
])
def test_a_document_that_is_not_a_database_is_refused_and_changes_nothing(tmp_path, data, named):
    database = AccessDatabase.in_directory(str(tmp_path))
    database.open("admin", "secret")
    before = (tmp_path / "access.json").read_bytes()
    with pytest.raises(AccessDatabaseDamaged, match=named):
        database.replace_document(data)
    assert (tmp_path / "access.json").read_bytes() == before
    assert database.user("admin") is not None
