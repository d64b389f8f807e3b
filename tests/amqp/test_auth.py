"""AMQP logins against the access database: PLAIN and AMQPLAIN responses, a
users file imported into it, and guest kept to loopback addresses as RabbitMQ
keeps it."""

import pytest
from pamqp import encode as pamqp_encode

from brokerd.access.database import AccessDatabase
from brokerd.amqp.auth import Authenticator, LoginRefused, UsersFileImport, parse_response


def file_checker(path):
    """An authenticator's database as a first start with a users file makes it: the file's users, no guest."""
    return AccessDatabase.in_memory(default_user=None)


def users_file_authenticator(path):
    access = file_checker(path)
    return Authenticator(access, users_file=UsersFileImport(path, access))


def amqplain(login, password):
    table = pamqp_encode.field_table({"LOGIN": login, "PASSWORD": password})
    return table[4:]  # AMQPLAIN sends the table without its length prefix


def outcome(deferred):
    """The user name a login Deferred fired with, or the LoginRefused it failed with."""
    results = []
    deferred.addBoth(results.append)
    assert results, "the login did not finish at once"
    result = results[0]
    if hasattr(result, "trap"):
        result.trap(LoginRefused)
        return result.value
    return result


def test_plain_and_amqplain_responses_are_read():
    assert parse_response("PLAIN", b"\0alice\0s3cret") == (b"alice", b"s3cret")
    assert parse_response("AMQPLAIN", amqplain("alice", "s3cret")) == (b"alice", b"s3cret")


@pytest.mark.parametrize(
    "mechanism, response, complaint",
    [
        ("PLAIN", b"alice:s3cret", "PLAIN response must be \\0user\\0password"),
        ("AMQPLAIN", amqplain("alice", "x")[:-3], "AMQPLAIN response is not a field table"),
        ("AMQPLAIN", pamqp_encode.field_table({"LOGIN": "alice"})[4:], "AMQPLAIN response needs LOGIN and PASSWORD"),
        ("EXTERNAL", b"", "unsupported authentication mechanism 'EXTERNAL'; use one of PLAIN, AMQPLAIN"),
    ],
)
def test_malformed_responses_are_refused_with_the_reason(mechanism, response, complaint):
    with pytest.raises(LoginRefused) as refused:
        parse_response(mechanism, response)
    assert complaint in str(refused.value)


def test_default_user_is_guest_from_loopback_only():
    authenticator = Authenticator()
    assert outcome(authenticator.login("PLAIN", b"\0guest\0guest", "127.0.0.1")) == "guest"
    assert outcome(authenticator.login("AMQPLAIN", amqplain("guest", "guest"), "::1")) == "guest"
    remote = outcome(authenticator.login("PLAIN", b"\0guest\0guest", "192.0.2.10"))
    assert isinstance(remote, LoginRefused)
    assert "user 'guest' can only connect via localhost" in str(remote)
    wrong = outcome(authenticator.login("PLAIN", b"\0guest\0nope", "127.0.0.1"))
    assert isinstance(wrong, LoginRefused)
    assert str(wrong) == "PLAIN login refused: user 'guest' - invalid credentials"  # RabbitMQ's words
    assert "nope" not in str(wrong)


def test_users_file_replaces_the_default_user(tmp_path):
    users = tmp_path / "users"
    users.write_text("alice:s3cret\nbob:hunter2\n")
    authenticator = users_file_authenticator(str(users))
    assert outcome(authenticator.login("PLAIN", b"\0alice\0s3cret", "192.0.2.10")) == "alice"
    assert outcome(authenticator.login("AMQPLAIN", amqplain("bob", "hunter2"), "127.0.0.1")) == "bob"
    assert isinstance(outcome(authenticator.login("PLAIN", b"\0guest\0guest", "127.0.0.1")), LoginRefused)
    assert isinstance(outcome(authenticator.login("PLAIN", b"\0alice\0wrong", "127.0.0.1")), LoginRefused)
    users.write_text("alice:changed!\n")  # imported again when it changes: no restart needed
    assert outcome(authenticator.login("PLAIN", b"\0alice\0changed!", "127.0.0.1")) == "alice"


def amqplain_entries(login_tag, login_value, password=b"S\x00\x00\x00\x01p"):
    return b"\x05LOGIN" + login_tag + login_value + b"\x08PASSWORD" + password


@pytest.mark.parametrize(
    "response, complaint",
    [
        (amqplain_entries(b"l", (2**28).to_bytes(8, "big")), "AMQPLAIN LOGIN must be a string, not an integer"),
        (amqplain_entries(b"I", b"\xff\xff\xff\xff"), "AMQPLAIN LOGIN must be a string, not an integer"),
        (amqplain_entries(b"d", b"\0" * 8), "AMQPLAIN LOGIN must be a string, not a floating-point number"),
        (amqplain_entries(b"D", b"\x02\0\0\0\x05"), "AMQPLAIN LOGIN must be a string, not a decimal"),
        (amqplain_entries(b"A", b"\0\0\0\0"), "AMQPLAIN LOGIN must be a string, not an array"),
        (amqplain_entries(b"F", b"\0\0\0\0"), "AMQPLAIN LOGIN must be a string, not a field table"),
        (amqplain_entries(b"t", b"\x01"), "AMQPLAIN LOGIN must be a string, not a boolean"),
        (amqplain_entries(b"V", b""), "AMQPLAIN response needs LOGIN and PASSWORD"),
        (amqplain_entries(b"S", (2**28).to_bytes(4, "big") + b"x"), "has a long string of 268435456 bytes but only"),
        (amqplain_entries(b"x", b"\0\0\0\x02\xff\xfe"), "AMQPLAIN LOGIN is not valid UTF-8"),
        (amqplain_entries(b"S", b"\0\0\0\x01a", b"I\0\0\0\x01"), "AMQPLAIN PASSWORD must be a string, not an integer"),
        (b"\0al\xffce\0secret", None),
    ],
    ids=["2^28", "negative", "float", "decimal", "array", "table", "boolean", "void", "giant-string", "bytes-not-utf8",
         "password-int", "plain-not-utf8"],
)
def test_credentials_that_are_not_utf8_strings_are_refused_with_the_reason(response, complaint):
    mechanism = "PLAIN" if complaint is None else "AMQPLAIN"
    with pytest.raises(LoginRefused) as refused:
        parse_response(mechanism, response)
    assert (complaint or "PLAIN user name is not valid UTF-8") in str(refused.value)


def test_non_ascii_credentials_are_utf8_in_both_mechanisms_and_the_users_file(tmp_path):
    users = tmp_path / "users"
    users.write_text("alice:päss\n€ve:p€ss\n", encoding="utf-8")
    authenticator = users_file_authenticator(str(users))
    assert outcome(authenticator.login("PLAIN", "\0alice\0päss".encode(), "127.0.0.1")) == "alice"
    assert outcome(authenticator.login("AMQPLAIN", amqplain("€ve", "p€ss"), "127.0.0.1")) == "€ve"
    assert isinstance(outcome(authenticator.login("PLAIN", "\0alice\0päss".encode("latin-1"), "::1")), LoginRefused)
    assert isinstance(outcome(authenticator.login("AMQPLAIN", amqplain("€ve", "pess"), "::1")), LoginRefused)
