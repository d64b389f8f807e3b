"""The command line of L{brokerd.migrate}::

    brokerd-admin migrate --data-dir D --from chunked --to sqlite      # the broker stopped
    brokerd-admin migrate --data-dir D --vhost-backend team=filelog

The first copies what the broker's chunked store in D holds into a new
sqlite store in D, checks it, and says what it did; the second does the same
for the store of its own that vhost team has, and records its new backend.
Exit status 0 on success; 1 with one line on stderr on any failure, after
removing what the run had written.

C{brokerd-admin migrate} (L{brokerd.admin.migration}) runs it in its own
process through L{run_command}. C{python -m brokerd.migrate} (L{main}) still
does the same for one release, after one line on stderr naming the command
that replaces it.
"""

import argparse
import os
import sys
from typing import NamedTuple

from twisted.internet import defer, task
from twisted.logger import LogLevel, formatEvent, globalLogBeginner

from brokerd.migrate import MigrationError, migrate_broker

PROGRAM = "python -m brokerd.migrate"
REPLACEMENT = "brokerd-admin migrate --data-dir DIR --from BACKEND --to BACKEND"
DEPRECATION = f"{PROGRAM} is deprecated; use: {REPLACEMENT}"


class LinePrefixes(NamedTuple):
    """How the command's lines on stderr begin: C{progress} before progress and
    the stores' log lines, C{error} before the one C{error: ...} line of a
    failure."""

    progress: str
    error: str


DEPRECATED_PREFIXES = LinePrefixes(f"{PROGRAM}: ", f"{PROGRAM}: ")


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line and status 1, as every other failure of the command."""

    def error(self, message):
        self.exit(1, f"{PROGRAM}: error: {message} (see --help)\n")


DESCRIPTION = (
    "Move a stopped broker's durable state (topology, persistent and delayed messages)"
    " from one storage backend to another in the same data directory, then check the copy."
    " --from/--to move the broker's store, with every vhost that has no store of its own;"
    " --vhost-backend moves a vhost's own store, and its new backend is recorded for it."
    " A vhost with a store of its own that no --vhost-backend names keeps it as it is."
)


def add_arguments(parser):
    """
    The command's options, as C{python -m brokerd.migrate} takes them
    (C{brokerd-admin migrate} takes the same).
    """
    parser.add_argument("--data-dir", required=True, help="the broker's --data-dir")
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


def parse_arguments(argv=None):
    parser = OneLineParser(prog=PROGRAM, description=DESCRIPTION)
    add_arguments(parser)
    return parser.parse_args(argv)


class StoreLog:
    """
    Shows what the stores log at warning level and above on stderr, one line
    each, and counts the errors.
    """

    def __init__(self, stream, prefix):
        self.stream = stream
        self.prefix = prefix
        self.errors = 0

    def __call__(self, event):
        level = event.get("log_level")
        if level is None or level < LogLevel.warn:
            return
        if level >= LogLevel.error:
            self.errors += 1
        text = formatEvent(event).replace("\n", " ")
        source = "store " if str(event.get("log_namespace", "")).startswith("backends.") else ""
        self.stream.write(f"{self.prefix}{source}{level.name}: {text}\n")
        self.stream.flush()


def _say(stream, prefix):
    def write(line):
        stream.write(f"{prefix}{line}\n")
        stream.flush()
    return write


def store_report(what, source, target, figures):
    """The lines saying what the move of one store (C{what}) carried and checked."""
    lines = [
        f"migrated {what} from {source} to {target}:"
        f" {figures['topology']} topology records, {figures['queues']} queues,"
        f" {figures['entries']} queued messages stored as {figures['messages']}"
        f" ({figures['bytes'] / 1e6:.1f} MB of bodies), {figures['delayed']} delayed messages",
        f"copied in {figures['copy_seconds']:.2f} s, checked in {figures['verify_seconds']:.2f} s:"
        " the target holds the same queues, messages (order, bodies, properties, flags,"
        " delivery counts) and delayed messages",
    ]
    for line in figures["left_behind"]:
        lines.append(f"left in the source only: {line}")
    if figures["source_problems"]:
        lines.append(
            f"the stores logged {figures['source_problems']} errors (above):"
            " what they name is left in the source only"
        )
    for path in figures["changed_source_files"]:
        lines.append(f"note: opening the source changed {path} (its own recovery)")
    return lines


def broker_report(arguments, migration_plan, results, backup):
    """The lines printed on success: each store moved, the vhosts kept, what to start."""
    lines = []
    for move, figures in results:
        what = arguments.data_dir if move.vhost is None else f"vhost {move.vhost!r}"
        lines.extend(store_report(what, move.source, move.target, figures))
    for vhost, backend in migration_plan.kept.items():
        lines.append(f"vhost {vhost!r} keeps its {backend} store (no --vhost-backend names it)")
    moved = [move for move, _ in results if move.vhost is not None]
    if moved:
        lines.append(
            f"recorded in {migration_plan.access.path}: "
            + ", ".join(f"vhost {move.vhost!r} on {move.target}" for move in moved)
            + f"; the database as it was is kept as {backup}"
            " (put it back to start on the earlier stores)"
        )
    if arguments.target is None:
        lines.append(
            f"start the broker as before (--data-dir={arguments.data_dir}); the vhosts' earlier"
            " files are left as they were and can be removed once it serves"
        )
    else:
        left = "the earlier stores'" if moved else f"the {arguments.source}"
        lines.append(
            f"start the broker with --backend={arguments.target} --data-dir={arguments.data_dir};"
            f" {left} files are left as they were and can be removed once it serves"
        )
    return lines


def run(reactor, arguments, out=None, err=None, prefixes=DEPRECATED_PREFIXES):
    """Migrate as C{arguments} say, the report to C{out} and progress and
    errors to C{err} (defaults: standard output and error), each line on C{err}
    beginning as C{prefixes} say; a Deferred firing with the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    say, say_error = _say(err, prefixes.progress), _say(err, prefixes.error)
    if not os.path.isdir(arguments.data_dir):
        say_error(f"error: data directory {arguments.data_dir} does not exist")
        return defer.succeed(1)
    store_log = StoreLog(err, prefixes.progress)
    globalLogBeginner.beginLoggingTo([store_log], redirectStandardIO=False)
    progress = None if arguments.quiet else say
    running = migrate_broker(
        arguments.data_dir, arguments.source, arguments.target, arguments.vhost_backends,
        arguments.leave_quarantined, progress, lambda: store_log.errors, reactor=reactor,
    )

    def succeeded(result):
        try:
            out.write("".join(line + "\n" for line in broker_report(arguments, *result)))
            out.flush()
        except BrokenPipeError:  # a reader such as head went away: the migration itself succeeded
            pass
        return 0

    def failed(failure):
        failure.trap(MigrationError)
        say_error(f"error: {failure.getErrorMessage()}")
        return 1

    return running.addCallbacks(succeeded, failed)


def run_command(arguments, prefixes, out=None, err=None):
    """
    Run the reactor for one migration as C{arguments} (as L{add_arguments}
    makes them) say; its exit status.
    """
    try:
        task.react(
            lambda reactor: run(reactor, arguments, out, err, prefixes).addCallback(_exit_status)
        )
    except SystemExit as exit:
        return exit.code or 0
    return 0


def main(argv=None):
    """
    C{python -m brokerd.migrate}: the deprecation line, then the migration;
    exits with its status.
    """
    print(DEPRECATION, file=sys.stderr, flush=True)
    sys.exit(run_command(parse_arguments(argv), DEPRECATED_PREFIXES))


def _exit_status(status):
    if status:
        raise SystemExit(status)
