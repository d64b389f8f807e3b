"""Moving a data directory's durable state from one backend to another.

Its command line (L{brokerd.migrate.cli}, run as C{brokerd-admin migrate})::

    brokerd-admin migrate --data-dir D --from chunked --to sqlite \\
        --vhost-backend team=filelog

With the broker stopped, each store moved (the broker's own, holding every
vhost made without a backend of its own, and the stores of the vhosts
C{--vhost-backend} names: L{brokerd.migrate.vhosts}) is opened through its
own backend and its target through its own; topology, persistent messages
(in queue order, with delivery counts, publish times and redelivered flags)
and delayed messages are copied; the target is closed, opened again and
compared with the source (per-queue counts and checksums). Only once every
store is moved and checked are the vhosts' new backends recorded in the
access database; a failure anywhere removes everything the run wrote. The
sources are only read.
"""

from twisted.internet import defer

from brokerd.migrate.copy import MigrationError
from brokerd.migrate.digest import remove_new, snapshot
from brokerd.migrate.move import move_store
from brokerd.migrate.vhosts import plan, record_backends

__all__ = ["MigrationError", "migrate", "migrate_broker"]


def _errors_since(source_problems):
    """A callable giving how many errors C{source_problems} counted since this call."""
    if source_problems is None:
        return lambda: 0
    first = source_problems()
    return lambda: source_problems() - first


@defer.inlineCallbacks
def migrate(
    data_dir, source_text, target_text, leave_quarantined=False, progress_line=None,
    source_problems=None, *, reactor,
):
    """
    Copy the state kept under C{data_dir} by the backend string
    C{source_text} into an empty store of C{target_text}, then check it: the
    broker's own store alone (L{migrate_broker} moves the vhosts' stores too).

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
    try:
        figures = yield move_store(
            data_dir, data_dir, source_text, target_text, leave_quarantined=leave_quarantined,
            progress_line=progress_line, logged_errors=_errors_since(source_problems),
            reactor=reactor,
        )
    except BaseException:
        remove_new(before, data_dir)
        raise
    return figures


@defer.inlineCallbacks
def migrate_broker(
    data_dir, source_text, target_text, vhost_backends=(), leave_quarantined=False,
    progress_line=None, source_problems=None, *, reactor,
):
    """
    Move the broker's store from C{source_text} to C{target_text} (both None:
    it stays) and the store of each vhost C{vhost_backends} names
    (C{VHOST=BACKEND} texts) to its backend, check each, then record the
    vhosts' new backends. Parameters as L{migrate}'s.

    @return: a Deferred firing with C{(plan, results, backup)}: the
        L{brokerd.migrate.vhosts.MigrationPlan}, C{(move, figures)} for each
        store moved, and the copy of the access database as it was (None if
        no vhost moved).
    @raise MigrationError: on any expected failure, naming the vhost whose
        store failed; anything the run created under C{data_dir} is removed
        by then and the access database is as it was.
    """
    migration_plan = plan(data_dir, source_text, target_text, vhost_backends, reactor)
    before = snapshot(data_dir)
    results = []
    try:
        for move in migration_plan.moves:
            figures = yield _move(data_dir, move, leave_quarantined, progress_line,
                                  source_problems, reactor)
            results.append((move, figures))
        backup = record_backends(migration_plan)
    except BaseException as problem:
        remove_new(before, data_dir)
        if isinstance(problem, OSError):  # the access database could not be written
            raise MigrationError(
                f"{type(problem).__name__}: {problem}; nothing was migrated"
            ) from None
        raise
    return migration_plan, results, backup


@defer.inlineCallbacks
def _move(data_dir, move, leave_quarantined, progress_line, source_problems, reactor):
    """Move one store of the plan; a failure of a vhost's store names the vhost."""
    say = progress_line
    if progress_line is not None and move.vhost is not None:
        def say(line):
            progress_line(f"{move.name()}: {line}")
    try:
        figures = yield move_store(
            data_dir, move.directory, move.source, move.target,
            leave_quarantined=leave_quarantined, progress_line=say,
            logged_errors=_errors_since(source_problems), reactor=reactor,
            require_data=move.vhost is None, labels=move.labels(),
        )
    except MigrationError as problem:
        if move.vhost is None or str(problem).startswith(move.name()):
            raise
        store = move.source.partition(":")[0]
        raise MigrationError(f"{move.name()} (its {store} store): {problem}") from None
    return figures
