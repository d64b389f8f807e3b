"""Moving a data directory's durable state from one backend to another.

Its command line (L{brokerd.migrate.__main__})::

    python -m brokerd.migrate --data-dir D --from chunked --to sqlite

With the broker stopped, the source store is opened through its own backend
and the target through its own; topology, persistent messages (in queue
order, with delivery counts, publish times and redelivered flags) and delayed
messages are copied; the target is closed, opened again and compared with
the source (per-queue counts and checksums). The source is only read.
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
from brokerd.migrate.digest import Tallies, changed_files, remove_new, snapshot
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy

__all__ = ["MigrationError", "migrate"]


def _make(text, data_dir, role, reactor):
    try:
        store = registry.make_store(text, data_dir, SyncPolicy("always"), reactor=reactor)
    except registry.BackendError as problem:
        raise MigrationError(f"--{role}: {problem}") from None
    if not store.durable:
        raise MigrationError(f"--{role}: the {store.name} backend keeps nothing on disk")
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
def _close(*stores):
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
def migrate(
    data_dir, source_text, target_text, leave_quarantined=False, progress_line=None,
    source_problems=None, *, reactor,
):
    """
    Copy the state kept under C{data_dir} by the backend string
    C{source_text} into an empty store of C{target_text}, then check it.

    @param leave_quarantined: go on when the source holds records that
        cannot be carried (quarantined or damaged); they stay in the source
        alone and are named in the result's C{left_behind}.
    @param progress_line: called with a progress line now and then, or None.
    @param source_problems: a callable giving the number of errors the
        stores logged so far: a store logs each message it leaves out as
        unreadable (quarantined) when it opens or reads.
    @param reactor: the reactor the stores' commits run on.
    @return: a Deferred firing with a dict of figures and notes.
    @raise MigrationError: on any expected failure; anything the run created
        under C{data_dir} is removed by then.
    """
    before = snapshot(data_dir)
    first_errors = source_problems() if source_problems else 0

    def logged_errors():
        return (source_problems() if source_problems else 0) - first_errors

    source = target = None
    try:
        source, target = (
            _make(source_text, data_dir, "from", reactor),
            _make(target_text, data_dir, "to", reactor),
        )
        if source.name == target.name:
            raise MigrationError(
                f"--from and --to name the same backend ({source.name}): nothing to migrate"
            )
        yield _open(source, data_dir, "source")
        if not (yield _holds_something(source)):
            raise MigrationError(f"{data_dir} holds no {source.name} data: nothing to migrate")
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
        source_changed = changed_files(before, snapshot(data_dir))
        yield _open(target, data_dir, "target")
        if (yield _holds_something(target)):
            raise MigrationError(
                f"the target {target.name} store in {data_dir} already holds data;"
                " migrate only into an empty store (remove its files first)"
            )
        tallies = Tallies()
        progress = Progress(reader.entries(), progress_line)
        figures = yield copy_store(reader, target, tallies, progress, leave_quarantined)
        _check_logged(logged_errors, leave_quarantined, "while its messages were copied")
        figures["copy_seconds"] = progress.clock() - progress.started
        figures["bytes"] = progress.bytes
        if progress_line is not None:
            progress_line(progress.line())
        yield target.close()  # its failure (the last commit's) fails the run
        target = None
        checked = Tallies()
        check_progress = Progress(figures["entries"], progress_line, verb="checked")
        reopened = target = _make(target_text, data_dir, "to", reactor)
        yield _open(reopened, data_dir, "target")
        yield tally_store(reopened, checked, check_progress)
        figures["verify_seconds"] = check_progress.clock() - check_progress.started
        differences = tallies.differences(checked)
        if differences:
            raise MigrationError(
                f"the target does not hold what the source does: {'; '.join(differences)}"
            )
        yield _close(target, source)
        target = source = None
    except BaseException as problem:
        yield _close(target, source)
        remove_new(before, data_dir)
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
    figures["queues"] = sum(1 for kind, _ in tallies.topology if kind == "QueueRecord")
    figures["topology"] = len(tallies.topology)
    return figures
