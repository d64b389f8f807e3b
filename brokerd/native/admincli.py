"""The command line's management commands: users, vhosts and permissions, in rabbitmqctl's argument order.

    python -m brokerd.native add-user alice 's3cret'
    python -m brokerd.native set-user-tags alice monitoring
    python -m brokerd.native add-vhost team [--backend sqlite]
    python -m brokerd.native set-permissions --vhost team alice '^alice\\.' '^alice\\.' '.*'
    python -m brokerd.native list-permissions --vhost team

Each is one ManagementRequest (L{brokerd.native.management}) for the user the
command line logged in as, who must be an administrator. A change prints
nothing and exits 0 once it is durable; a listing prints what
C{rabbitmqctl --quiet} prints: a header line of column names, then one line
per row, columns separated by tabs. A refusal is one line on standard error
with the broker's reply code and text (403 for a user who is not an
administrator, 404 for an unknown user or vhost, 406 for a change that cannot
be made) and exit status 1.
"""

import sys

from twisted.internet import defer

DEFAULT_VHOST = "/"


def add_management_commands(commands):
    """Add the management commands to the C{commands} sub-parsers of L{brokerd.native.cli}."""

    def command(name, help, *positionals, per_vhost=False):
        parser = commands.add_parser(name, help=help)
        if per_vhost:
            parser.add_argument("-p", "--vhost", dest="permissions_vhost", default=DEFAULT_VHOST, metavar="VHOST",
                                help=f"the vhost whose permissions (default: {DEFAULT_VHOST})")
        for positional in positionals:  # dests apart from the login's --user and --password
            parser.add_argument(f"managed_{positional}", metavar=positional.upper())
        return parser

    add_vhost = command("add-vhost", "create a vhost (one that exists is left as it is)", "name")
    add_vhost.add_argument("--backend", metavar="SPEC", help="the vhost's own message store, e.g. sqlite"
                                                             " (default: the broker's --backend)")
    command("delete-vhost", "delete a vhost with its queues, messages and permissions", "name")
    command("list-vhosts", "list the vhosts")
    command("add-user", "create a user (no tags, no permissions)", "name", "password")
    command("delete-user", "delete a user with its permissions", "name")
    command("change-password", "change a user's password", "name", "password")
    command("list-users", "list the users and their tags")
    tags = command("set-user-tags", "replace a user's tags (none: no tags)", "name")
    tags.add_argument("managed_tags", nargs="*", metavar="TAG", help="administrator, monitoring, management, policymaker")
    command("set-permissions", "give a user three regular expressions on a vhost", "user", "configure", "write",
            "read", per_vhost=True)
    command("clear-permissions", "take a user's permissions on a vhost", "user", per_vhost=True)
    command("list-permissions", "list the permissions on a vhost", per_vhost=True)


def _request(options):
    """The management command and its positional arguments named by C{options}."""
    command = options.command
    if command in ("add-vhost", "delete-vhost", "delete-user"):
        return [options.managed_name]
    if command in ("add-user", "change-password"):
        return [options.managed_name, options.managed_password]
    if command == "set-user-tags":
        return [options.managed_name, *options.managed_tags]
    if command == "set-permissions":
        return [options.managed_user, options.managed_configure, options.managed_write, options.managed_read]
    if command == "clear-permissions":
        return [options.managed_user]
    return []


@defer.inlineCallbacks
def _run_management_command(channel, options):
    columns, rows = yield channel.management(
        options.command.replace("-", "_"),
        _request(options),
        vhost=getattr(options, "permissions_vhost", ""),
        backend=getattr(options, "backend", None) or "",
    )
    if columns:
        lines = ["\t".join(columns), *("\t".join(row) for row in rows)]
        sys.stdout.buffer.write("".join(line + "\n" for line in lines).encode("utf-8"))
        sys.stdout.flush()
    return 0


MANAGEMENT_COMMANDS = dict.fromkeys(
    ["add-vhost", "delete-vhost", "list-vhosts", "add-user", "delete-user", "change-password", "list-users",
     "set-user-tags", "set-permissions", "clear-permissions", "list-permissions"],
    _run_management_command,
)
