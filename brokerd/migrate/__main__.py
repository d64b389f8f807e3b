"""The command line of L{brokerd.migrate}: with the broker stopped,

    python -m brokerd.migrate --data-dir D --from chunked --to sqlite

copies what the chunked store in D holds into a new sqlite store in D, checks
it, and says what it did. Exit status 0 on success; 1 with one line on
stderr on any failure, after removing what the run had written.
"""

import argparse
import os
import sys

from twisted.internet import defer, task
from twisted.logger import LogLevel, formatEvent, globalLogBeginner

from brokerd.migrate import MigrationError, migrate

PROGRAM = "python -m brokerd.migrate"


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line and status 1, as every other failure of the command."""

    def error(self, message):
        self.exit(1, f"{PROGRAM}: error: {message} (see --help)\n")


def parse_arguments(argv=None):
    parser = OneLineParser(
        prog=PROGRAM,
        description="Move a stopped broker's durable state (topology, persistent and delayed messages) from one"
                    " storage backend to another in the same data directory, then check the copy.",
    )
    parser.add_argument("--data-dir", required=True, help="the broker's --data-dir")
    parser.add_argument("--from", dest="source", required=True, metavar="BACKEND",
                        help="the backend the data is in now, as --backend takes it (e.g. chunked:chunk_size=64M)")
    parser.add_argument("--to", dest="target", required=True, metavar="BACKEND",
                        help="the backend to move it to, as --backend takes it; its store must be empty")
    parser.add_argument("--leave-quarantined", action="store_true",
                        help="migrate even if the source holds quarantined or damaged records; they stay in the"
                             " source alone and are listed")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


class StoreLog:
    """Shows what the stores log at warning level and above on stderr, one line each, and counts the errors."""

    def __init__(self, stream):
        self.stream = stream
        self.errors = 0

    def __call__(self, event):
        level = event.get("log_level")
        if level is None or level < LogLevel.warn:
            return
        if level >= LogLevel.error:
            self.errors += 1
        text = formatEvent(event).replace("\n", " ")
        source = "store " if str(event.get("log_namespace", "")).startswith("backends.") else ""
        self.stream.write(f"{PROGRAM}: {source}{level.name}: {text}\n")
        self.stream.flush()


def _say(stream):
    def write(line):
        stream.write(f"{PROGRAM}: {line}\n")
        stream.flush()
    return write


def report(arguments, figures):
    """The lines printed on success."""
    lines = [
        f"migrated {arguments.data_dir} from {arguments.source} to {arguments.target}: {figures['topology']} topology"
        f" records, {figures['queues']} queues, {figures['entries']} queued messages stored as {figures['messages']}"
        f" ({figures['bytes'] / 1e6:.1f} MB of bodies), {figures['delayed']} delayed messages",
        f"copied in {figures['copy_seconds']:.2f} s, checked in {figures['verify_seconds']:.2f} s: the target holds"
        " the same queues, messages (order, bodies, properties, flags, delivery counts) and delayed messages",
    ]
    for line in figures["left_behind"]:
        lines.append(f"left in the source only: {line}")
    if figures["source_problems"]:
        lines.append(f"the stores logged {figures['source_problems']} errors (above): what they name is left in the"
                     " source only")
    for path in figures["changed_source_files"]:
        lines.append(f"note: opening the source changed {path} (its own recovery)")
    lines.append(f"start the broker with --backend={arguments.target} --data-dir={arguments.data_dir}; the"
                 f" {arguments.source} files are left as they were and can be removed once it serves")
    return lines


def run(reactor, arguments, out=sys.stdout, err=sys.stderr):
    """Migrate as C{arguments} say; a Deferred firing with the exit status."""
    say = _say(err)
    if not os.path.isdir(arguments.data_dir):
        say(f"error: data directory {arguments.data_dir} does not exist")
        return defer.succeed(1)
    store_log = StoreLog(err)
    globalLogBeginner.beginLoggingTo([store_log], redirectStandardIO=False)
    progress = None if arguments.quiet else say
    running = migrate(arguments.data_dir, arguments.source, arguments.target, arguments.leave_quarantined,
                      progress, lambda: store_log.errors, reactor=reactor)

    def succeeded(figures):
        try:
            out.write("".join(line + "\n" for line in report(arguments, figures)))
            out.flush()
        except BrokenPipeError:  # a reader such as head went away: the migration itself succeeded
            pass
        return 0

    def failed(failure):
        failure.trap(MigrationError)
        say(f"error: {failure.getErrorMessage()}")
        return 1

    return running.addCallbacks(succeeded, failed)


def main(argv=None):
    arguments = parse_arguments(argv)
    task.react(lambda reactor: run(reactor, arguments).addCallback(_exit_status))


def _exit_status(status):
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
