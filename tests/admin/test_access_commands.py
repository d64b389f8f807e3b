"""brokerd-admin's users, vhosts, permissions and policies, as an operator runs them against one real
broker over real HTTP: rabbitmqctl's arguments, the change in effect for the API and for pika, the
listings in table and JSON, and refusals as one line in RabbitMQ's words with exit status 1."""

import json

import pika
import pika.exceptions
import pytest

from tests.support.admin_cli import admin, http_url
from tests.support.httpapi import amqp, broker  # noqa: F401 (the module's fixture)


@pytest.fixture(scope="module")
def url(broker):
    return http_url(broker)


def rows(table):
    """A table's lines split into cells (the header's included)."""
    return [line.split() for line in table.splitlines()]


def test_a_user_is_added_tagged_given_a_new_password_and_deleted(url):
    assert admin(url, "add-user", "alice", "first", "--tags", "monitoring") == (
        0, "Added user alice with tags [monitoring]\n", "")
    assert admin(url, "add-user", "alice", "other") == (1, "", 'error: User "alice" already exists\n')
    status, table, errors = admin(url, "list", "users")
    assert (status, errors) == (0, "") and ["alice", "monitoring"] in rows(table)
    assert admin(url, "list", "vhosts", user="alice", password="first")[0] == 0  # a monitoring user may

    assert admin(url, "change-password", "alice", "second") == (0, "Changed the password of user alice\n", "")
    assert admin(url, "list", "vhosts", user="alice", password="first")[2] == (
        "error: HTTP 401 not_authorised - Login failed\n")
    status, listed, _ = admin(url, "--format", "json", "list", "users")
    assert next(user for user in json.loads(listed) if user["name"] == "alice")["tags"] == ["monitoring"]

    assert admin(url, "set-user-tags", "alice", "administrator", "management") == (
        0, "Set the tags of user alice to [administrator, management]\n", "")
    assert admin(url, "list", "users", user="alice", password="second")[0] == 0  # same password, now an admin
    assert admin(url, "set-user-tags", "alice") == (0, "Set the tags of user alice to []\n", "")
    assert admin(url, "list", "vhosts", user="alice", password="second") == (
        1, "", "error: HTTP 401 not_authorised - Not management user\n")

    assert admin(url, "delete-user", "alice") == (0, "Deleted user alice\n", "")
    assert admin(url, "delete-user", "alice") == (1, "", "error: HTTP 404 Object Not Found - Not Found\n")
    for command in (["change-password", "alice", "pw"], ["set-user-tags", "alice", "monitoring"]):
        assert admin(url, *command) == (1, "", 'error: User "alice" does not exist\n')


def test_a_vhost_is_added_given_permissions_and_policies_and_deleted(broker, url):
    assert admin(url, "add-vhost", "team") == (0, "Added vhost team\n", "")
    assert admin(url, "add-user", "zed", "zed-pass") == (0, "Added user zed with tags []\n", "")
    assert admin(url, "set-permissions", "--vhost", "team", "zed", "^zed\\.", "", ".*") == (
        0, "Set the permissions of user zed in vhost team\n", "")
    assert admin(url, "list", "permissions", "--vhost", "team") == (
        0, "user  vhost  configure  write  read\nzed   team   ^zed\\.            .*\n", "")
    with amqp(broker, "zed", "zed-pass", vhost="team") as zed:
        zed.channel().queue_declare("zed.q", auto_delete=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            zed.channel().queue_declare("other.q")
        assert refused.value.reply_code == 403

    assert admin(url, "set-policy", "-p", "team", "--priority", "7", "--apply-to", "queues", "cap", "^orders",
                 '{"max-length":100}') == (0, "Set policy cap in vhost team\n", "")
    status, table, errors = admin(url, "list", "policies", "--vhost", "team")
    assert (status, errors) == (0, "")
    assert rows(table) == [["vhost", "name", "pattern", "apply-to", "definition", "priority"],
                           ["team", "cap", "^orders", "queues", '{"max-length":', "100}", "7"]]
    status, listed, errors = admin(url, "--format", "json", "list", "policies", "--vhost", "team")
    assert json.loads(listed) == [{"vhost": "team", "name": "cap", "pattern": "^orders", "apply-to": "queues",
                                   "definition": {"max-length": 100}, "priority": 7}]
    status, out, errors = admin(url, "set-policy", "--vhost", "team", "bad", ".*", "{max-length: 1}")
    assert (status, out) == (1, "") and errors.startswith("error: the policy definition is not JSON: ")
    assert admin(url, "clear-policy", "--vhost", "team", "cap") == (0, "Cleared policy cap in vhost team\n", "")
    assert admin(url, "clear-policy", "--vhost", "team", "cap") == (
        1, "", "error: HTTP 404 Object Not Found - Not Found\n")

    # The global --vhost before the command (as brokerd-admin has always taken it) is the same setting.
    assert admin(url, "--vhost", "team", "clear-permissions", "zed") == (
        0, "Cleared the permissions of user zed in vhost team\n", "")
    assert admin(url, "--vhost", "team", "list", "permissions") == (0, "user  vhost  configure  write  read\n", "")
    assert admin(url, "delete-vhost", "team") == (0, "Deleted vhost team\n", "")
    assert admin(url, "delete-vhost", "team") == (1, "", "error: HTTP 404 Object Not Found - Not Found\n")
    assert admin(url, "delete-user", "zed")[0] == 0


def test_a_vhost_added_with_a_backend_has_its_own_store_and_a_bad_backend_is_refused(broker, url):
    assert admin(url, "add-vhost", "own", "--backend", "sqlite") == (0, "Added vhost own on backend sqlite\n", "")
    assert admin(url, "set-permissions", "-p", "own", "guest", ".*", ".*", ".*")[0] == 0
    with amqp(broker, vhost="own") as connection:
        connection.channel().queue_declare("own.q", durable=True)
    status, table, _ = admin(url, "list", "queues", "--vhost", "own")
    assert rows(table)[1][:2] == ["own", "own.q"]
    status, out, errors = admin(url, "add-vhost", "bad", "--backend", "nosuch")
    assert (status, out) == (1, "") and errors.startswith("error: HTTP 400 bad_request - ") and "nosuch" in errors
    assert len(errors.splitlines()) == 1
    assert "bad" not in [row[0] for row in rows(admin(url, "list", "vhosts")[1])]
    assert admin(url, "delete-vhost", "own")[0] == 0


def test_a_user_who_is_not_an_administrator_is_refused(url):
    assert admin(url, "add-user", "viewer", "viewer-pass", "--tags", "monitoring")[0] == 0
    try:
        assert admin(url, "add-user", "eve", "pw", user="viewer", password="viewer-pass") == (
            1, "", "error: HTTP 401 not_authorised - Not administrator user\n")
        assert admin(url, "add-vhost", "eves", user="viewer", password="viewer-pass") == (
            1, "", "error: HTTP 401 not_authorised - Not administrator user\n")
    finally:
        admin(url, "delete-user", "viewer")


def test_the_url_comes_from_brokerd_url_when_not_given(url):
    status, table, errors = admin(None, "list", "vhosts", env={"BROKERD_URL": url})
    assert (status, errors) == (0, "") and ["/"] == rows(table)[1][:1]
