"""The store export: what a stopped broker's store still holds, one JSON line per
message and queue holding it, in the same format for every durable backend.

The store is read through its backend's own store class (built from the
backend string by L{brokerd.storage.registry.make_store}, opened and recovered as
a restarting broker would), never by parsing its files here: the export sees
exactly what a broker would recover, and repairs what a restart repairs (a
torn tail is cut off, and the store's warning shown). Lines are written as
they are read, so a paging store's backlog never has to fit in memory; the
file appears only once it is complete.

Run as ``brokerd-store-export --backend sqlite --data-dir D --out F`` (or
``python -m spark_jobs.export``, as L{export_store} does).
The export line fields are described in L{spark_jobs.events}.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

from twisted.internet import defer, task
from twisted.logger import (
    FileLogObserver,
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    eventAsText,
    globalLogBeginner,
)

from brokerd.interfaces import IDelayedMessageStore, IPagingStore, StoreCorrupted
from brokerd.proto import messages_pb2
from brokerd.storage import registry
from spark_jobs import events

PROGRAM = "python -m spark_jobs.export"  # as export_store runs it
SCRIPT = "brokerd-store-export"  # the console script running the same
ERROR_MARK = ": error: "
DELAYED_WINDOW = 1000  # delayed messages asked for at a time
# The latest due time a store keeps: a window up to it holds every delayed message.
LAST_DUE = (1 << 63) - 1
PARTIAL_SUFFIX = ".partial"


class ExportError(Exception):
    """The store cannot be exported; the text says why and names the backend, directory or file
    at fault."""


def build_store(backend, data_dir, reactor):
    """
    The store backend string C{backend} keeps under C{data_dir}, built but not
    opened, to commit on C{reactor}.

    @raise ExportError: if the backend is unknown or takes other options, keeps
        nothing on disk (memory), or C{data_dir} does not exist or holds no
        store of that backend (opening would create an empty one).
    """
    try:
        store = registry.make_store(backend, data_dir, reactor=reactor)
    except registry.BackendError as problem:
        raise ExportError(str(problem)) from None
    if not store.durable:
        raise ExportError(f"the {store.name} backend keeps nothing on disk:"
                          f" there is no store to export")
    if not os.path.exists(data_dir):
        raise ExportError(f"data directory {data_dir} does not exist")
    if not os.path.isdir(data_dir):
        raise ExportError(f"data directory {data_dir} is not a directory")
    location = store_location(store)
    if location is not None and not os.path.exists(location):
        raise ExportError(f"{data_dir} holds no {store.name} store: {location} does not exist")
    return store


def store_location(store):
    """The file or directory a store keeps its data in (sqlite's C{path}, a file store's
    C{directory}), or None."""
    return getattr(store, "path", None) or getattr(store, "directory", None)


def damage_text(store, data_dir, damage, where=""):
    """What to tell about C{damage} (a L{StoreCorrupted}) found in C{store}, naming the damaged
    file."""
    text = f"the {store.name} store in {data_dir} is damaged{where}: {damage}"
    if damage.path and str(damage.path) not in text:
        text += f" (in {damage.path})"
    return text


@defer.inlineCallbacks
def open_store(backend, data_dir, reactor):
    """
    Build and open the store of a stopped broker, as a restarting broker would.

    Needs C{reactor} running: stores open on a writer thread.

    @return: a Deferred firing with the open store, which the caller closes;
        it fails with L{ExportError} if the store cannot be built, is damaged,
        or is in use (locked) by a running broker.
    """
    store = build_store(backend, data_dir, reactor)
    try:
        yield store.open()
    except StoreCorrupted as damage:
        raise ExportError(damage_text(store, data_dir, damage)) from None
    except Exception as problem:
        # A running broker holds the store's lock: the store says so in its own words.
        raise ExportError(f"cannot open the {store.name} store in {data_dir}: {problem}") from None
    return store


def queue_keys(store):
    """The C{(vhost, name)} keys of the durable queues in an open store's topology, sorted."""
    return sorted({(record.vhost, record.name) for record in store.topology()
                   if isinstance(record, messages_pb2.QueueRecord)})


def queue_messages(store, queue):
    """
    The messages an open store holds for queue key C{queue}, in queue order,
    as C{(handle, message)} pairs; C{message} has C{exchange}, C{properties}
    and C{body}. A paging store reads each message only when it is reached.

    @raise StoreCorrupted: if the queue's data is damaged.
    """
    if IPagingStore.providedBy(store):
        for handle in store.recovered_handles(queue):
            yield handle, store.load(handle)
    else:
        for handle, record, _ in store.recover(queue):
            yield handle, record


def export_line(label, vhost, queue, exchange, message, state):
    """One export line (a dict with the fields of L{events.EXPORT_FIELDS}, in that order) for one
    stored message."""
    properties = message.properties
    body = message.body
    return {
        "backend": label,
        "vhost": vhost,
        "queue": queue,
        "exchange": exchange,
        "message_id": properties.message_id if properties.HasField("message_id") else "",
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "size": len(body),
        "priority": properties.priority if properties.HasField("priority") else 0,
        "state": state,
    }


def _encode(line):
    return json.dumps(line, separators=(",", ":")) + "\n"


@defer.inlineCallbacks
def write_lines(store, out_file, label, data_dir):
    """
    Write the export lines of an open store to the text file C{out_file}:
    every durable queue's messages (state C{ready}, queues sorted, each in
    queue order), then the delayed messages (state C{delayed}, queue C{""}, in
    due order).

    @return: a Deferred firing with the number of lines written, or failing
        with L{ExportError} naming the damaged file if the store is damaged.
    """
    written = 0
    for vhost, name in queue_keys(store):
        try:
            for _, message in queue_messages(store, (vhost, name)):
                line = export_line(label, vhost, name, message.exchange, message, events.READY)
                out_file.write(_encode(line))
                written += 1
        except StoreCorrupted as damage:
            where = f" (queue {name!r} of vhost {vhost!r})"
            raise ExportError(damage_text(store, data_dir, damage, where)) from None
    if IDelayedMessageStore.providedBy(store):
        cursor = None
        while True:
            try:
                window = yield store.delayed_after(cursor, LAST_DUE, DELAYED_WINDOW)
            except StoreCorrupted as damage:
                raise ExportError(
                    damage_text(store, data_dir, damage, " (delayed messages)")) from None
            if not window:
                break
            for delayed in window:
                vhost, exchange = delayed.exchange
                line = export_line(label, vhost, "", exchange, delayed.record, events.DELAYED)
                out_file.write(_encode(line))
            written += len(window)
            cursor = (window[-1].due, window[-1].handle)
    return written


@defer.inlineCallbacks
def export_store_deferred(backend, data_dir, out_path, label=None, *, reactor):
    """
    L{export_store} for code that runs the reactor itself (a twistd service,
    a trial test, L{main}): the store is opened and read in this process.

    @return: a Deferred firing with the number of lines written, or failing
        with L{ExportError}.
    """
    label = backend if label is None else label
    store = yield open_store(backend, data_dir, reactor)
    partial = os.fspath(out_path) + PARTIAL_SUFFIX
    closing = False
    try:
        os.makedirs(os.path.dirname(os.path.abspath(partial)), exist_ok=True)
        with open(partial, "w", encoding="utf-8") as out_file:
            written = yield write_lines(store, out_file, label, data_dir)
        closing = True
        yield store.close()
        os.replace(partial, out_path)
    except Exception:
        if os.path.exists(partial):
            os.remove(partial)
        if not closing:
            yield _close_quietly(store)
        raise
    return written


@defer.inlineCallbacks
def _close_quietly(store):
    """Close a store on the way out of a failed export; the export's own error is the one to
    report."""
    try:
        yield store.close()
    except Exception:  # noqa: BLE001 - the first error wins
        pass


def export_store(backend, data_dir, out_path, label=None):
    """
    Write what the stopped broker's store under C{data_dir} holds to
    C{out_path} as export lines (see L{spark_jobs.events}); the file appears
    only once the export is complete.

    The export runs in a child process (``python -m spark_jobs.export``): a
    store needs a running reactor for its writer thread, and Twisted's reactor
    can run only once per process, so running it here would take it from
    anything else in the calling process (and a second export could not run).
    Code that already runs the reactor calls L{export_store_deferred}.

    @param backend: a backend string (C{sqlite}, C{chunked:chunk_size=1M}).
    @param label: the C{backend} field of every line; the backend string if None.
    @return: the number of lines written.
    @raise ExportError: naming what is wrong (the backend, the directory, a
        store in use by a running broker, a damaged file).
    """
    command = [sys.executable, "-m", "spark_jobs.export", "--backend", backend,
               "--data-dir", str(data_dir), "--out", str(out_path)]
    if label is not None:
        command += ["--label", label]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        raise ExportError(_error_of(finished.stderr)
                          or f"{PROGRAM} exited with status {finished.returncode}")
    if finished.stderr:
        sys.stderr.write(finished.stderr)  # the store's warnings, e.g. a torn tail it cut off
    with open(out_path, encoding="utf-8") as exported:
        return sum(1 for _ in exported)


def _error_of(stderr):
    """The text of the last error line the command printed, else all it printed."""
    for line in reversed(stderr.splitlines()):
        if ERROR_MARK in line:
            return line.split(ERROR_MARK, 1)[1]
    return stderr.strip()


def _log_warnings_to_stderr(prog):
    """Show what the store logs at warning level and above (a torn tail cut off, say) on stderr."""
    def as_line(event):
        return f"{prog}: {eventAsText(event, includeTimestamp=False, includeSystem=False)}\n"

    observer = FileLogObserver(sys.stderr, as_line)
    only_warnings = LogLevelFilterPredicate(defaultLogLevel=LogLevel.warn)
    globalLogBeginner.beginLoggingTo([FilteringLogObserver(observer, [only_warnings])],
                                     redirectStandardIO=False)


def argument_parser(prog=SCRIPT):
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write what a stopped broker's store holds as JSON lines, one per message and"
                    " queue holding it (and one per delayed message), read through the backend's"
                    " own store.",
    )
    parser.add_argument("--backend", required=True,
                        help="the backend string the broker ran with: sqlite, filelog,"
                             " chunked[:key=value...]")
    parser.add_argument("--data-dir", required=True, help="the stopped broker's --data-dir")
    parser.add_argument("--out", required=True,
                        help="the export file to write (replaced if it exists)")
    parser.add_argument("--label",
                        help="the backend field of every line (default: the backend string)")
    return parser


@defer.inlineCallbacks
def _run(reactor, arguments, prog):
    try:
        written = yield export_store_deferred(arguments.backend, arguments.data_dir, arguments.out,
                                              arguments.label, reactor=reactor)
    except ExportError as problem:
        print(f"{prog}{ERROR_MARK}{problem}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"exported {written} lines from the {arguments.backend} store in {arguments.data_dir}"
          f" to {arguments.out}")


def main(argv=None, prog=SCRIPT):
    """Export one store as C{prog} (the name its usage, warning and error lines give); exits with
    the status."""
    arguments = argument_parser(prog).parse_args(argv)
    _log_warnings_to_stderr(prog)
    task.react(_run, (arguments, prog))


if __name__ == "__main__":
    main(prog=PROGRAM)
