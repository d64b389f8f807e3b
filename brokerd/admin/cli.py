"""C{brokerd-admin} (also C{python -m brokerd.admin}): everything an operator does, over the HTTP
management API::

    brokerd-admin list queues --vhost team
    brokerd-admin --format json list connections
    brokerd-admin add-user alice 's3cret' --tags monitoring
    brokerd-admin add-vhost team --backend sqlite
    brokerd-admin set-permissions --vhost team alice '^alice\\.' '^alice\\.' '.*'
    brokerd-admin set-policy --vhost team --apply-to queues ttl '^ttl\\.' '{"message-ttl":60000}'
    brokerd-admin export backup.json        # '-': standard output
    brokerd-admin import backup.json        # '-': standard input
    brokerd-admin purge jobs --vhost team
    brokerd-admin close-connection '127.0.0.1:50412 -> 127.0.0.1:5672' --reason 'maintenance'
    brokerd-admin migrate --data-dir /var/lib/brokerd --from chunked --to sqlite   # broker stopped

Commands take rabbitmqctl's arguments in its order (L{brokerd.admin.access});
C{brokerd-admin --help} lists them by task (L{TASKS}), C{brokerd-admin COMMAND
--help} gives one's arguments. It logs in to the management API at C{--url}
(default C{$BROKERD_URL}, else C{http://127.0.0.1:15672}) as C{--user} with
C{--password} (defaults: C{$BROKERD_USER}, C{$BROKERD_PASSWORD}, else
guest/guest). A per-vhost command's C{--vhost} may also come before the
command. Listings are tables with a header line and aligned columns
(L{brokerd.admin.tables}, the one table printer); C{--format json} prints the
API's JSON as it answered. Exit status 0 when the command did what it says; 1
when it did not, with one line on standard error (C{error: HTTP 401
not_authorised - Login failed}: the API's status, error and reason; or the URL
it could not reach); 2 for a command line that does not parse.
"""

import argparse
import os
import sys

from brokerd.admin import access, listing, migration, operations, parameters, topic_access
from brokerd.admin.client import AdminError, ManagementClient

DEFAULT_URL = "http://127.0.0.1:15672"
DEFAULT_USER = "guest"
DEFAULT_PASSWORD = "guest"
PROGRAM = "brokerd-admin"

# (task, its commands), in the order --help lists them.
TASKS = [
    ("listing", listing.COMMANDS),
    ("users", access.USER_COMMANDS),
    ("vhosts", access.VHOST_COMMANDS),
    ("permissions", access.PERMISSION_COMMANDS),
    ("topic permissions", topic_access.TOPIC_PERMISSION_COMMANDS),
    ("policies", access.POLICY_COMMANDS),
    ("parameters", parameters.PARAMETER_COMMANDS),
    ("limits", parameters.LIMIT_COMMANDS),
    ("definitions", operations.DEFINITION_COMMANDS),
    ("queues", operations.QUEUE_COMMANDS),
    ("connections", operations.CONNECTION_COMMANDS),
    ("tracing", topic_access.TRACING_COMMANDS),
    ("migration (broker stopped; no API)", migration.COMMANDS),
]
COMMANDS = {command.name: command for _, commands in TASKS for command in commands}


def commands_by_task():
    """The text of C{--help}'s command list: each task, then its commands with one line each."""
    width = max(map(len, COMMANDS)) + 2
    lines = [f"commands, by task ({PROGRAM} COMMAND --help gives one's arguments):"]
    for task, commands in TASKS:
        lines.append(f"  {task}")
        lines += [f"    {command.name.ljust(width)}{command.summary}" for command in commands]
    return "\n".join(lines)


def build_parser():
    parser = argparse.ArgumentParser(
        prog=PROGRAM, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="An operator's command line over brokerd's HTTP management API (RabbitMQ's).",
        epilog=commands_by_task() + (
            "\n\nExit status: 0 done; 1 not done (one line 'error: ...' on stderr);"
            " 2 a command line that does not parse."
        ))
    default_url = os.environ.get("BROKERD_URL", DEFAULT_URL)
    parser.add_argument("--url", default=default_url,
                        help=f"the management API (default: $BROKERD_URL, else {DEFAULT_URL})")
    parser.add_argument("--user", default=os.environ.get("BROKERD_USER", DEFAULT_USER),
                        help=f"user to log in as (default: $BROKERD_USER, else {DEFAULT_USER})")
    parser.add_argument("--password", default=os.environ.get("BROKERD_PASSWORD", DEFAULT_PASSWORD),
                        help="that user's password"
                             f" (default: $BROKERD_PASSWORD, else {DEFAULT_PASSWORD})")
    parser.add_argument("--ssl-ca-cert-file", default=None, metavar="FILE",
                        help="PEM file of the authorities an https --url's certificate must"
                             " come from (default: the system's); its name is checked too")
    parser.add_argument("--vhost", default=None, metavar="V",
                        help="the vhost of a per-vhost command, as its own --vhost"
                             " (default: every vhost for list, / for the others)")
    parser.add_argument("--format", choices=["table", "json"], default="table",
                        help="how listings print (default: table)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                       help="one of the commands below")
    for command in COMMANDS.values():
        command_parser = subparsers.add_parser(command.name, description=command.description)
        command.add_arguments(command_parser)
    return parser


def main(argv=None, out=None):
    """Run one command; the exit status (0 done, 1 not done, with one line on standard error)."""
    arguments = build_parser().parse_args(argv)
    out = out if out is not None else sys.stdout
    try:
        client = ManagementClient(arguments.url, arguments.user, arguments.password,
                                  arguments.ssl_ca_cert_file)
        status = COMMANDS[arguments.command].run(client, arguments, out)
        out.flush()
    except AdminError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader (e.g. head) stopped reading: not an error to report
        # As Python's documentation says: what is left to flush at exit goes nowhere.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status or 0
