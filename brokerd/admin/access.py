"""C{brokerd-admin}'s users, vhosts, permissions and policies: rabbitmqctl's commands, in its
argument order, as requests to RabbitMQ's management API::

    add-user NAME PASSWORD [--tags TAG,...]   PUT /api/users/NAME
                                              (refused if NAME exists, as rabbitmqctl does)
    delete-user NAME                          DELETE /api/users/NAME
    change-password NAME PASSWORD             PUT /api/users/NAME, with the tags it has
    set-user-tags NAME [TAG...]               PUT /api/users/NAME, with the password hash it has
    add-vhost NAME [--backend SPEC]           PUT /api/vhosts/NAME
                                              ({"backend": SPEC}: brokerd's own field)
    delete-vhost NAME                         DELETE /api/vhosts/NAME
    set-permissions [--vhost V] USER CONFIGURE WRITE READ    PUT /api/permissions/V/USER
    clear-permissions [--vhost V] USER                       DELETE /api/permissions/V/USER
    set-policy [--vhost V] [--priority N] [--apply-to all|queues|exchanges] NAME PATTERN DEFINITION
                                              PUT /api/policies/V/NAME (DEFINITION is JSON)
    clear-policy [--vhost V] NAME             DELETE /api/policies/V/NAME

The API's user object carries the user's tags and password hash, and a PUT
replaces both, so the commands that change one read the user first and send
the other back as it was.
"""

import json

from brokerd.admin.client import AdminError, segment
from brokerd.admin.command import Command, add_vhost_option, done, vhost_of

APPLY_TO = ("all", "queues", "exchanges")


def _tags_text(tags):
    """Tags as every RabbitMQ version's API takes them: one comma-separated string."""
    if isinstance(tags, list):
        return ",".join(tags)
    return tags or ""


def _tags_shown(tags):
    return f"[{', '.join(tags)}]"


def _existing_user(client, name):
    """
    The API's object for user C{name}; L{AdminError} in rabbitmqctl's words
    when there is none.
    """
    user = client.get_json_if_any(f"/api/users/{segment(name)}")
    if user is None:
        raise AdminError(f'User "{name}" does not exist')
    return user


# -- users

# Positionals get dests of their own: the login's --user and --password are
# dests of the whole command line.

def _add_user_arguments(parser):
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("new_password", metavar="PASSWORD")
    parser.add_argument("--tags", default="", metavar="TAG,...",
                        help="comma-separated: administrator, monitoring, policymaker, management"
                             " (default: none)")


def add_user(client, arguments, out):
    path = f"/api/users/{segment(arguments.name)}"
    if client.get_json_if_any(path) is not None:
        raise AdminError(f'User "{arguments.name}" already exists')
    tags = [tag.strip() for tag in arguments.tags.split(",") if tag.strip()]
    client.send_json("PUT", path, {"password": arguments.new_password, "tags": ",".join(tags)})
    done(out, f"Added user {arguments.name} with tags {_tags_shown(tags)}")


def _name_argument(parser):
    parser.add_argument("name", metavar="NAME")


def delete_user(client, arguments, out):
    client.request("DELETE", f"/api/users/{segment(arguments.name)}")
    done(out, f"Deleted user {arguments.name}")


def _change_password_arguments(parser):
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("new_password", metavar="PASSWORD")


def change_password(client, arguments, out):
    user = _existing_user(client, arguments.name)
    client.send_json("PUT", f"/api/users/{segment(arguments.name)}",
                     {"password": arguments.new_password, "tags": _tags_text(user.get("tags"))})
    done(out, f"Changed the password of user {arguments.name}")


def _set_user_tags_arguments(parser):
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("tags", nargs="*", metavar="TAG",
                        help="administrator, monitoring, policymaker, management (none: no tags)")


def set_user_tags(client, arguments, out):
    user = _existing_user(client, arguments.name)
    body = {"password_hash": user.get("password_hash", ""), "tags": ",".join(arguments.tags)}
    if user.get("hashing_algorithm"):
        body["hashing_algorithm"] = user["hashing_algorithm"]
    client.send_json("PUT", f"/api/users/{segment(arguments.name)}", body)
    done(out, f"Set the tags of user {arguments.name} to {_tags_shown(arguments.tags)}")


# -- vhosts

def _add_vhost_arguments(parser):
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--backend", metavar="SPEC",
                        help="the vhost's own message store, a backend string such as sqlite or"
                             " chunked:chunk_size=64M (default: the broker's --backend)")


def add_vhost(client, arguments, out):
    body = {"backend": arguments.backend} if arguments.backend else {}
    client.send_json("PUT", f"/api/vhosts/{segment(arguments.name)}", body)
    backend = f" on backend {arguments.backend}" if arguments.backend else ""
    done(out, f"Added vhost {arguments.name}{backend}")


def delete_vhost(client, arguments, out):
    client.request("DELETE", f"/api/vhosts/{segment(arguments.name)}")
    done(out, f"Deleted vhost {arguments.name}")


# -- permissions

def _set_permissions_arguments(parser):
    add_vhost_option(parser)
    parser.add_argument("permitted_user", metavar="USER")
    parser.add_argument("configure", metavar="CONFIGURE",
                        help="regular expression of the names USER may configure")
    parser.add_argument("write", metavar="WRITE",
                        help="regular expression of the names USER may write to")
    parser.add_argument("read", metavar="READ",
                        help="regular expression of the names USER may read from")


def set_permissions(client, arguments, out):
    vhost = vhost_of(arguments)
    path = f"/api/permissions/{segment(vhost)}/{segment(arguments.permitted_user)}"
    client.send_json(
        "PUT", path,
        {"configure": arguments.configure, "write": arguments.write, "read": arguments.read},
    )
    done(out, f"Set the permissions of user {arguments.permitted_user} in vhost {vhost}")


def _clear_permissions_arguments(parser):
    add_vhost_option(parser)
    parser.add_argument("permitted_user", metavar="USER")


def clear_permissions(client, arguments, out):
    vhost = vhost_of(arguments)
    path = f"/api/permissions/{segment(vhost)}/{segment(arguments.permitted_user)}"
    client.request("DELETE", path)
    done(out, f"Cleared the permissions of user {arguments.permitted_user} in vhost {vhost}")


# -- policies

def _set_policy_arguments(parser):
    add_vhost_option(parser)
    parser.add_argument("--priority", type=int, default=0, metavar="N",
                        help="a policy of higher priority wins over another matching the same name"
                             " (default: 0)")
    parser.add_argument("--apply-to", choices=APPLY_TO, default="all",
                        help="what it applies to (default: all)")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("pattern", metavar="PATTERN",
                        help="regular expression of the queue or exchange names")
    parser.add_argument("definition", metavar="DEFINITION",
                        help='a JSON object, e.g. \'{"message-ttl":60000}\'')


def set_policy(client, arguments, out):
    try:
        definition = json.loads(arguments.definition)
    except ValueError as problem:
        raise AdminError(f"the policy definition is not JSON: {problem}") from None
    vhost = vhost_of(arguments)
    client.send_json("PUT", f"/api/policies/{segment(vhost)}/{segment(arguments.name)}",
                     {"pattern": arguments.pattern, "definition": definition,
                      "priority": arguments.priority, "apply-to": arguments.apply_to})
    done(out, f"Set policy {arguments.name} in vhost {vhost}")


def _clear_policy_arguments(parser):
    add_vhost_option(parser)
    parser.add_argument("name", metavar="NAME")


def clear_policy(client, arguments, out):
    vhost = vhost_of(arguments)
    client.request("DELETE", f"/api/policies/{segment(vhost)}/{segment(arguments.name)}")
    done(out, f"Cleared policy {arguments.name} in vhost {vhost}")


USER_COMMANDS = [
    Command("add-user", "create a user (refused if it exists)", _add_user_arguments, add_user),
    Command("delete-user", "delete a user with its permissions", _name_argument, delete_user),
    Command("change-password", "change a user's password (its tags stay)",
            _change_password_arguments, change_password),
    Command("set-user-tags", "replace a user's tags (none: no tags; its password stays)",
            _set_user_tags_arguments, set_user_tags),
]
VHOST_COMMANDS = [
    Command("add-vhost", "create a vhost, on the broker's store or a store of its own",
            _add_vhost_arguments, add_vhost),
    Command("delete-vhost", "delete a vhost with its queues, messages and permissions",
            _name_argument, delete_vhost),
]
PERMISSION_COMMANDS = [
    Command("set-permissions", "give a user three regular expressions on a vhost",
            _set_permissions_arguments, set_permissions),
    Command("clear-permissions", "take a user's permissions on a vhost",
            _clear_permissions_arguments, clear_permissions),
]
POLICY_COMMANDS = [
    Command("set-policy", "create or replace a policy of a vhost", _set_policy_arguments,
            set_policy),
    Command("clear-policy", "delete a policy of a vhost", _clear_policy_arguments, clear_policy),
]
