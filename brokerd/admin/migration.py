"""C{brokerd-admin migrate}: move a stopped broker's durable state to another
backend, in this process::

    brokerd-admin migrate --data-dir /var/lib/brokerd --from chunked --to sqlite
    brokerd-admin migrate --data-dir /var/lib/brokerd --vhost-backend team=filelog

It is the one command that does not talk to the management API: the broker
must be stopped, and L{brokerd.migrate} opens both stores itself. That
package (with Twisted and the backends) is imported only when the command
runs, so every other command starts without it. Progress goes to standard
error, each line beginning C{migrate: }; a failure is the one line
C{error: ...} and exit status 1, with anything the run wrote removed.
"""

from brokerd.admin.command import Command

PROGRESS_PREFIX = "migrate: "


def add_arguments(parser):
    """The options of L{brokerd.migrate.cli.add_arguments}, given here so that
    C{--help} does not import it (a test checks that the two agree)."""
    parser.add_argument("--data-dir", required=True, metavar="DIR",
                        help="the stopped broker's --data-dir")
    parser.add_argument("--from", dest="source", metavar="BACKEND",
                        help="the backend the broker's store is in now, as --backend takes it"
                             " (e.g. chunked:chunk_size=64M); with --to")
    parser.add_argument("--to", dest="target", metavar="BACKEND",
                        help="the backend to move the broker's store to (with every vhost that"
                             " has no store of its own), as --backend takes it; its store must"
                             " be empty")
    parser.add_argument("--vhost-backend", dest="vhost_backends", action="append",
                        metavar="VHOST=BACKEND",
                        help="move the store of its own that VHOST has to BACKEND (as add-vhost"
                             " --backend takes it; its store must be empty) and record it;"
                             " repeat for each vhost to move. A vhost with a store of its own"
                             " that none names keeps it as it is")
    parser.add_argument("--leave-quarantined", action="store_true",
                        help="migrate even if the source holds quarantined or damaged records;"
                             " they stay in the source alone and are listed")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def migrate_store(client, arguments, out):
    """
    Run L{brokerd.migrate} on the arguments (the management API's C{client} is
    not used); its exit status.
    """
    from brokerd.migrate.cli import LinePrefixes, run_command

    return run_command(arguments, LinePrefixes(progress=PROGRESS_PREFIX, error=""), out=out)


COMMANDS = [
    Command(
        "migrate",
        "with the broker stopped, move its data directory to another backend and check the copy",
        add_arguments, migrate_store,
        "With the broker stopped, move the durable state of its data directory (topology,"
        " persistent and delayed messages) from one storage backend to another, then check the"
        " copy: --from/--to move the broker's store, --vhost-backend the store of its own a"
        " vhost has (its new backend is recorded once every store is moved and checked; a"
        " failure leaves nothing written). Talks to no API.",
    ),
]
