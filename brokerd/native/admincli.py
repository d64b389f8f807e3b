"""The command line's management commands, deprecated: C{brokerd-admin} (over the HTTP management
API) replaces them, and they go in the next release::

    python -m brokerd.native add-user alice 's3cret'
    python -m brokerd.native set-user-tags alice monitoring
    python -m brokerd.native add-vhost team [--backend sqlite]
    python -m brokerd.native set-permissions --vhost team alice '^alice\\.' '^alice\\.' '.*'
    python -m brokerd.native list-permissions --vhost team
    python -m brokerd.native set-policy --vhost team --apply-to queues \\
        ttl '^ttl\\.' '{"message-ttl":60000}'
    python -m brokerd.native list-policies --vhost team
    python -m brokerd.native export-definitions backup.json
    python -m brokerd.native import-definitions backup.json

Each first prints one line on standard error naming the C{brokerd-admin}
command that replaces it (L{REPLACEMENTS}), then does what it did: it is one
ManagementRequest (L{brokerd.native.access_requests}) for the user the
command line logged in as, who must be an administrator (for the policy
commands, an administrator or a policymaker with permissions on the vhost). A
change prints nothing and exits 0 once it is durable; a listing prints what
C{rabbitmqctl --quiet} prints, for scripts that read it: a header line of
column names, then one line per row, columns separated by tabs (for people,
C{brokerd-admin list} prints aligned tables). C{export-definitions} writes
RabbitMQ's definitions JSON to its file (C{-}: standard output);
C{import-definitions} sends a file's (C{-}: standard input) in one frame, so
it must be smaller than the broker's C{--native-max-frame}. A refusal is one
line on standard error with the broker's reply code and text (403 for a user
who is not an administrator, 404 for an unknown user or vhost, 406 for a
change that cannot be made) and exit status 1.
"""

import json
import sys

from twisted.internet import defer

DEFAULT_VHOST = "/"

# Each deprecated command -> the brokerd-admin command line that replaces it.
REPLACEMENTS = {
    "add-vhost": "add-vhost NAME [--backend SPEC]",
    "delete-vhost": "delete-vhost NAME",
    "list-vhosts": "list vhosts",
    "add-user": "add-user NAME PASSWORD",
    "delete-user": "delete-user NAME",
    "change-password": "change-password NAME PASSWORD",
    "list-users": "list users",
    "set-user-tags": "set-user-tags NAME [TAG...]",
    "set-permissions": "set-permissions [--vhost V] USER CONFIGURE WRITE READ",
    "clear-permissions": "clear-permissions [--vhost V] USER",
    "list-permissions": "list permissions --vhost V",
    "set-policy": (
        "set-policy [--vhost V] [--priority N] [--apply-to all|queues|exchanges]"
        " NAME PATTERN DEFINITION"
    ),
    "clear-policy": "clear-policy [--vhost V] NAME",
    "list-policies": "list policies --vhost V",
    "export-definitions": "export FILE",
    "import-definitions": "import FILE",
}


def deprecation(program, command):
    """The line a deprecated management C{command} of C{program} prints first on standard error."""
    return f"{program} {command} is deprecated; use: brokerd-admin {REPLACEMENTS[command]}"


def add_management_commands(commands):
    """Add the management commands to the C{commands} sub-parsers of L{brokerd.native.cli}."""

    def command(name, help, *positionals, per_vhost=False):
        words = " ".join(
            word for word in REPLACEMENTS[name].split() if word.islower() and word[0].isalpha()
        )
        parser = commands.add_parser(name, help=f"{help} (deprecated: brokerd-admin {words})")
        if per_vhost:
            parser.add_argument(
                "-p", "--vhost", dest="permissions_vhost", default=DEFAULT_VHOST, metavar="VHOST",
                help=f"the vhost (default: {DEFAULT_VHOST})",
            )
        for positional in positionals:  # dests apart from the login's --user and --password
            parser.add_argument(f"managed_{positional}", metavar=positional.upper())
        return parser

    add_vhost = command("add-vhost", "create a vhost (one that exists is left as it is)", "name")
    add_vhost.add_argument(
        "--backend", metavar="SPEC",
        help="the vhost's own message store, e.g. sqlite (default: the broker's --backend)",
    )
    command("delete-vhost", "delete a vhost with its queues, messages and permissions", "name")
    command("list-vhosts", "list the vhosts")
    command("add-user", "create a user (no tags, no permissions)", "name", "password")
    command("delete-user", "delete a user with its permissions", "name")
    command("change-password", "change a user's password", "name", "password")
    command("list-users", "list the users and their tags")
    tags = command("set-user-tags", "replace a user's tags (none: no tags)", "name")
    tags.add_argument(
        "managed_tags", nargs="*", metavar="TAG",
        help="administrator, monitoring, management, policymaker",
    )
    command(
        "set-permissions", "give a user three regular expressions on a vhost",
        "user", "configure", "write", "read", per_vhost=True,
    )
    command("clear-permissions", "take a user's permissions on a vhost", "user", per_vhost=True)
    command("list-permissions", "list the permissions on a vhost", per_vhost=True)
    policy = command(
        "set-policy", "create or replace a policy on a vhost", "name", "pattern", "definition",
        per_vhost=True,
    )
    policy.add_argument(
        "--priority", default="0", help="policies of higher priority win (default: 0)"
    )
    policy.add_argument("--apply-to", default="all", choices=["all", "queues", "exchanges"],
                        help="what the policy applies to (default: all)")
    command("clear-policy", "delete a policy of a vhost", "name", per_vhost=True)
    command("list-policies", "list the policies of a vhost", per_vhost=True)
    command(
        "export-definitions",
        "write the broker's definitions (RabbitMQ's JSON) to FILE ('-': stdout)", "file",
    )
    command(
        "import-definitions", "import definitions (RabbitMQ's JSON) from FILE ('-': stdin)", "file"
    )


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
        return [
            options.managed_user, options.managed_configure, options.managed_write,
            options.managed_read,
        ]
    if command == "clear-permissions":
        return [options.managed_user]
    if command == "set-policy":
        return [
            options.managed_name, options.managed_pattern, options.managed_definition,
            options.priority, options.apply_to,
        ]
    if command == "clear-policy":
        return [options.managed_name]
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


@defer.inlineCallbacks
def _export_definitions(channel, options):
    _columns, rows = yield channel.management("export_definitions")
    text = json.dumps(json.loads(rows[0][0]), indent=2, ensure_ascii=False) + "\n"
    if options.managed_file == "-":
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.flush()
    else:
        with open(options.managed_file, "w", encoding="utf-8") as file:
            file.write(text)
    return 0


@defer.inlineCallbacks
def _import_definitions(channel, options):
    try:
        if options.managed_file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(options.managed_file, "rb") as file:
                data = file.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as problem:
        print(f"error: cannot read {options.managed_file!r}: {problem}", file=sys.stderr)
        return 1
    limit = getattr(channel.protocol, "server_max_frame_size", 0)
    if limit and len(data) + 4096 > limit:
        print(
            f"error: {options.managed_file!r} is {len(data)} bytes:"
            f" more than the broker's largest frame ({limit} bytes, its --native-max-frame) allows",
            file=sys.stderr,
        )
        return 1
    yield channel.management("import_definitions", [text])
    return 0


MANAGEMENT_COMMANDS = dict.fromkeys(
    [
        "add-vhost", "delete-vhost", "list-vhosts", "add-user", "delete-user", "change-password",
        "list-users", "set-user-tags", "set-permissions", "clear-permissions", "list-permissions",
        "set-policy", "clear-policy", "list-policies",
    ],
    _run_management_command,
)
MANAGEMENT_COMMANDS.update(
    {"export-definitions": _export_definitions, "import-definitions": _import_definitions}
)
