"""Moving one store: the state a backend keeps in one directory copied into an empty
store of another backend in the same directory, then checked.

L{move_store} does the work for the broker's own store and for a vhost's store
alike; it leaves what it wrote in place on failure (the caller removes every new
file of the run at once, see L{brokerd.migrate.digest.remove_new}), so that a run
that moves several stores is undone as a whole.
"""

from twisted.internet import defer

from brokerd.interfaces import IDelayedMessageStore, StoreCorrupted, StoreInUse
from brokerd.migrate.copy import (
    FOREVER,
    MigrationError,
    Progress,
    SourceReader,
    copy_store,
    tally_store,
)
from brokerd.migrate.digest import Tallies, changed_files, snapshot
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy


def make_store(text, directory, label, reactor):
    """The (unopened) durable store C{text} describes in C{directory}; C{label} (C{--from},
    C{--to}) names what a fault is reported against."""
    try:
        store = registry.make_store(text, directory, SyncPolicy("always"), reactor=reactor)
    except registry.BackendError as problem:
        raise MigrationError(f"{label}: {problem}") from None
    if not store.durable:
        raise MigrationError(f"{label}: the {store.name} backend keeps nothing on disk")
    return store


@defer.inlineCallbacks
def _open(store, data_dir, role):
    try:
        yield store.open()
    except StoreInUse as problem:
        raise MigrationError(
            f"the broker seems to be running on {data_dir}: stop it first ({problem})"
        ) from None
    except Exception as problem:
        raise MigrationError(f"the {role} {store.name} store cannot be opened: {problem}") from None


@defer.inlineCallbacks
def _holds_something(store):
    """True if an opened store holds any topology, message or delayed message."""
    if list(store.topology()) or store.stats().get("messages", 0):
        return True
    if IDelayedMessageStore.providedBy(store):
        kept = yield store.delayed_after(None, FOREVER, 1)
        return bool(kept)
    return False


@defer.inlineCallbacks
def close_stores(*stores):
    """Close each of C{stores} that is not None, whatever the others do."""
    for store in stores:
        if store is not None:
            try:
                yield store.close()
            except Exception:
                pass


def left_behind(reader):
    """
    One line per thing of the source that cannot be carried: quarantined
    records, damaged queues.
    """
    lines = []
    for record in reader.quarantined:
        lines.append(
            f"quarantined {record.kind} {record.name!r} in vhost {record.vhost!r}"
            f" ({record.where}): {record.reason}"
        )
    for queue, damage in reader.damaged.items():
        lines.append(
            f"damaged queue {queue[1]!r} in vhost {queue[0]!r}, with its bindings and messages:"
            f" {damage}"
        )
    return lines


def _check_logged(logged_errors, leave_quarantined, when):
    count = logged_errors()
    if count and not leave_quarantined:
        raise MigrationError(
            f"the stores logged {count} errors {when} (above): what they name would be left"
            " behind; --leave-quarantined migrates the rest and leaves it in the source"
        )


@defer.inlineCallbacks
def move_store(
    data_dir, directory, source_text, target_text, *, leave_quarantined, progress_line,
    logged_errors, reactor, require_data=True, labels=("--from", "--to"),
):
    """
    Copy the state kept under C{directory} by the backend string C{source_text}
    into an empty store of C{target_text} there, then check it.

    @param data_dir: the broker's data directory (named when a broker runs on it).
    @param logged_errors: a callable giving the number of errors the stores logged
        since this move began: a store logs each message it leaves out as
        unreadable (quarantined) when it opens or reads.
    @param require_data: refuse a source that holds nothing (the broker's store:
        most likely a wrong --from); a vhost's recorded store may be empty.
    @param labels: what faults of the two backend strings are reported against.
    @return: a Deferred firing with a dict of figures and notes.
    @raise MigrationError: on any expected failure, a damaged store or one that
        cannot be read or written included; what it wrote stays for the caller
        to remove.
    """
    before = snapshot(directory)
    source = target = None
    try:
        source = make_store(source_text, directory, labels[0], reactor)
        target = make_store(target_text, directory, labels[1], reactor)
        if source.name == target.name:
            raise MigrationError(
                f"--from and --to name the same backend ({source.name}): nothing to migrate"
            )
        yield _open(source, data_dir, "source")
        if require_data and not (yield _holds_something(source)):
            raise MigrationError(f"{directory} holds no {source.name} data: nothing to migrate")
        reader = SourceReader(source)
        behind = left_behind(reader)
        if behind and not leave_quarantined:
            raise MigrationError(
                f"the source holds {len(behind)} records that cannot be carried"
                f" (the first: {behind[0]}); --leave-quarantined migrates the rest"
                " and leaves them in the source"
            )
        _check_logged(logged_errors, leave_quarantined, "as it was opened and read")
        # What the source's own recovery changed, before the target writes
        # (its files may be here already).
        source_changed = changed_files(before, snapshot(directory))
        yield _open(target, data_dir, "target")
        if (yield _holds_something(target)):
            raise MigrationError(
                f"the target {target.name} store in {directory} already holds data;"
                " migrate only into an empty store (remove its files first)"
            )
        figures = yield _copy_and_check(
            reader, target, leave_quarantined, progress_line, logged_errors
        )
        target = None  # closed by _copy_and_check
        reopened = target = make_store(target_text, directory, labels[1], reactor)
        yield _open(reopened, data_dir, "target")
        yield _verify(reopened, figures, progress_line)
        yield close_stores(target, source)
        target = source = None
    except BaseException as problem:
        yield close_stores(target, source)
        # A full disk, a file it may not read, damage:
        if isinstance(problem, (OSError, StoreCorrupted)):
            raise MigrationError(
                f"{type(problem).__name__}: {problem}; nothing was migrated"
            ) from None
        raise
    figures["changed_source_files"] = source_changed
    figures["left_behind"] = behind + [
        f"unreadable message {handle}"
        f" of queue(s) {', '.join(repr(queue[1]) for queue in queues)}: {problem}"
        for handle, queues, problem in figures.pop("unreadable")]
    figures["source_problems"] = logged_errors()
    tallies = figures.pop("tallies")
    figures["queues"] = sum(1 for kind, _ in tallies.topology if kind == "QueueRecord")
    figures["topology"] = len(tallies.topology)
    return figures


@defer.inlineCallbacks
def _copy_and_check(reader, target, leave_quarantined, progress_line, logged_errors):
    """Copy into C{target} and close it (its failure, the last commit's, fails the move)."""
    tallies = Tallies()
    progress = Progress(reader.entries(), progress_line)
    figures = yield copy_store(reader, target, tallies, progress, leave_quarantined)
    _check_logged(logged_errors, leave_quarantined, "while its messages were copied")
    figures["copy_seconds"] = progress.clock() - progress.started
    figures["bytes"] = progress.bytes
    figures["tallies"] = tallies
    if progress_line is not None:
        progress_line(progress.line())
    yield target.close()
    return figures


@defer.inlineCallbacks
def _verify(reopened, figures, progress_line):
    """Tally the reopened target and compare it with what was copied."""
    checked = Tallies()
    check_progress = Progress(figures["entries"], progress_line, verb="checked")
    yield tally_store(reopened, checked, check_progress)
    figures["verify_seconds"] = check_progress.clock() - check_progress.started
    differences = figures["tallies"].differences(checked)
    if differences:
        raise MigrationError(
            f"the target does not hold what the source does: {'; '.join(differences)}"
        )
