"""rabbitmqctl's topic permission commands, for every protocol's management front end.

C{set_topic_permissions -p VHOST USER EXCHANGE WRITE READ},
C{clear_topic_permissions -p VHOST USER [EXCHANGE]} (without EXCHANGE: every
one of the user's entries on the vhost), C{list_topic_permissions -p VHOST}
and C{list_user_topic_permissions USER}, for an administrator, with
rabbitmqctl's refusals (404 for an unknown user or vhost, 406 for an invalid
expression) and log lines. Each is a function of the
L{brokerd.access.commands.AccessCommands} that runs it (its broker, access
database and administrator check), registered in its command table.
"""

from brokerd.access.command_results import Table, done
from brokerd.access.database import AccessChangeRefused
from brokerd.access.topic_permissions import invalid_expression
from brokerd.errors import InternalError, NotFound, PreconditionFailed


def set_topic_permissions(commands, user, vhost, name, exchange, write, read):
    """Give user C{name} the C{write} and C{read} expressions for C{exchange} on C{vhost}."""
    commands.check_administrator(user)
    for expression in (write, read):
        if invalid_expression(expression=expression) is not None:
            raise PreconditionFailed(f"regular expression '{expression}' is invalid")
    _check_user_and_vhost(commands.access, name, vhost)
    _change(commands.access.set_topic_permissions, name, vhost, exchange, write, read)
    return done(
        user,
        "Set topic permissions on exchange '{exchange}' for user '{name}' in vhost '{vhost}'"
        " to '{write}', '{read}'",
        exchange=exchange, name=name, vhost=vhost, write=write, read=read,
    )


def clear_topic_permissions(commands, user, vhost, name, exchange=None):
    """Take user C{name}'s topic permissions on C{vhost}: for C{exchange}, or every one."""
    commands.check_administrator(user)
    _check_user_and_vhost(commands.access, name, vhost)
    _change(commands.access.clear_topic_permissions, name, vhost, exchange)
    on = "" if exchange is None else f" on exchange '{exchange}'"
    return done(
        user, "Cleared topic permissions{on} for user '{name}' in vhost '{vhost}'",
        on=on, name=name, vhost=vhost,
    )


def list_topic_permissions(commands, user, vhost):
    """The topic permissions on C{vhost}, as C{rabbitmqctl list_topic_permissions} prints them."""
    commands.check_administrator(user)
    if not commands.access.vhost_exists(vhost):
        raise NotFound(f"Virtual host '{vhost}' does not exist")
    rows = [
        (name, permission.exchange, permission.write, permission.read)
        for name, _, permission in commands.access.topic_permissions.of(vhost=vhost)
    ]
    return Table(("user", "exchange", "write", "read"), rows)


def list_user_topic_permissions(commands, user, name):
    """User C{name}'s topic permissions on every vhost."""
    commands.check_administrator(user)
    if commands.access.user(name) is None:
        raise NotFound(f"User {name} does not exist")
    rows = [
        (vhost, permission.exchange, permission.write, permission.read)
        for _, vhost, permission in commands.access.topic_permissions.of(user=name)
    ]
    return Table(("vhost", "exchange", "write", "read"), rows)


def _check_user_and_vhost(access, name, vhost):
    # rabbitmqctl's words, in its order: the vhost first.
    if not access.vhost_exists(vhost):
        raise NotFound(f"Virtual host {vhost} does not exist")
    if access.user(name) is None:
        raise NotFound(f"User {name} does not exist")


def _change(change, *arguments):
    """Make a change to the access database: a refusal is 406, a failed write 541."""
    try:
        change(*arguments)
    except AccessChangeRefused as problem:
        raise PreconditionFailed(str(problem)) from None
    except OSError as problem:
        raise InternalError(f"the change could not be saved: {problem}") from None


# command -> (function, fewest and most positional arguments, what they are)
COMMANDS = {
    "set_topic_permissions": (set_topic_permissions, 4, 4, "USER EXCHANGE WRITE READ"),
    "clear_topic_permissions": (clear_topic_permissions, 1, 2, "USER [EXCHANGE]"),
    "list_topic_permissions": (list_topic_permissions, 0, 0, "no arguments"),
    "list_user_topic_permissions": (list_user_topic_permissions, 1, 1, "USER"),
}
