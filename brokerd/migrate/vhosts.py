"""Which stores a migration moves, read from the access database, and the vhosts'
new backends recorded there once every store is moved and checked.

A broker keeps its vhosts in two kinds of store: the broker's own (its
C{--backend}, in the data directory), which holds every vhost made without a
backend of its own, and a store per vhost made with one (C{add-vhost NAME
--backend ...}, under C{vhosts/<name>/}, its backend string kept in the
vhost's entry of C{access.json}). C{--from}/C{--to} move the broker's store,
with every vhost on it; C{--vhost-backend VHOST=BACKEND} moves a vhost's own
store. A vhost with a store of its own that no C{--vhost-backend} names
keeps its store and its files untouched: its backend was chosen for it alone.
"""

import os
import shutil
import time
from typing import NamedTuple, Optional

from brokerd.access.database import ACCESS_FILE, AccessDatabase, AccessDatabaseDamaged
from brokerd.migrate.copy import MigrationError
from brokerd.migrate.move import make_store
from brokerd.storage.vhost_stores import VHOSTS_DIRECTORY, directory_name

BACKUP_SUFFIX = ".before-migration-"


class StoreMove(NamedTuple):
    """One store to move: C{vhost} None for the broker's own store."""

    vhost: Optional[str]
    source: str
    target: str
    directory: str

    def name(self):
        """How the messages of a run name this store."""
        return "the broker's store" if self.vhost is None else f"vhost {self.vhost!r}"

    def labels(self):
        """What a fault of the source's and of the target's backend string is reported against."""
        if self.vhost is None:
            return "--from", "--to"
        return f"{self.name()}: its recorded backend", f"{self.name()}: --vhost-backend"


class MigrationPlan(NamedTuple):
    """
    What a run moves: C{moves} in the order they are made (the broker's store
    first, then the vhosts in the access database's order); C{kept} the vhosts
    with stores of their own left as they are, vhost -> backend string;
    C{access} the access database, or None when no vhost's record changes.
    """

    moves: list
    kept: dict
    access: Optional[AccessDatabase]


def parse_vhost_backend(text):
    """
    C{VHOST=BACKEND[:options]} split at its first C{=} (a C{=} in the vhost's
    name is written C{\\=}, a backslash C{\\\\}): C{(vhost, backend string)}.
    """
    name, escaped = [], False
    for position, char in enumerate(text):
        if escaped:
            name.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "=":
            vhost, backend = "".join(name), text[position + 1:]
            if vhost and backend:
                return vhost, backend
            break
        else:
            name.append(char)
    raise MigrationError(
        f"--vhost-backend {text!r} is not of the form VHOST=BACKEND[:options]"
    )


def plan(data_dir, source, target, vhost_backends, reactor):
    """
    The L{MigrationPlan} for C{--from} C{source} and C{--to} C{target} (both
    None: the broker's store stays) and the C{--vhost-backend} texts
    C{vhost_backends}; every backend string is checked here, before any store
    is opened.

    @raise MigrationError: naming the option, vhost or file at fault.
    """
    if (source is None) != (target is None):
        raise MigrationError("--from and --to go together: the broker's store moves from one"
                             " backend to the other")
    targets = {}
    for text in vhost_backends or ():
        vhost, backend = parse_vhost_backend(text)
        if vhost in targets:
            raise MigrationError(f"vhost {vhost!r} is given twice with --vhost-backend")
        targets[vhost] = backend
    access = _read_access(data_dir, needed=bool(targets))
    if target is None and not targets:
        raise MigrationError(
            "nothing to migrate: --from and --to move the broker's store,"
            " --vhost-backend VHOST=BACKEND a vhost's own store"
        )
    moves = [] if target is None else [StoreMove(None, source, target, data_dir)]
    kept = {}
    own = {} if access is None else access.vhost_backends
    for vhost in targets:
        if access is None or not access.vhost_exists(vhost):
            raise MigrationError(f"--vhost-backend: no vhost {vhost!r} in {_access_path(data_dir)}")
        if vhost not in own:
            raise MigrationError(
                f"--vhost-backend: vhost {vhost!r} is on the broker's store, not a store of its"
                " own: it moves with the broker's store (--from and --to)"
            )
    for vhost in (access.vhosts if access is not None else ()):
        if vhost not in own:
            continue
        if vhost not in targets:
            kept[vhost] = own[vhost]
            continue
        directory = os.path.join(data_dir, VHOSTS_DIRECTORY, directory_name(vhost))
        moves.append(StoreMove(vhost, own[vhost], targets[vhost], directory))
    for move in moves:
        _check_backends(move, reactor)
    return MigrationPlan(moves, kept, access if targets else None)


def _check_backends(move, reactor):
    """Both backend strings name a durable backend and its options rightly (the stores are
    built, not opened), and name two backends."""
    names = [
        make_store(text, move.directory, label, reactor).name
        for text, label in zip((move.source, move.target), move.labels())
    ]
    if names[0] == names[1]:
        if move.vhost is None:
            raise MigrationError(
                f"--from and --to name the same backend ({names[0]}): nothing to migrate"
            )
        raise MigrationError(
            f"{move.name()}: --vhost-backend names the same backend as its store ({names[0]}):"
            " nothing to migrate"
        )


def _access_path(data_dir):
    return os.path.join(data_dir, ACCESS_FILE)


def _read_access(data_dir, needed):
    """The data directory's access database, or None if it has none (C{needed}: refuse that)."""
    path = _access_path(data_dir)
    if not os.path.exists(path):
        if needed:
            raise MigrationError(f"--vhost-backend: {data_dir} has no access database ({path}):"
                                 " no vhost has a store of its own")
        return None
    access = AccessDatabase(path)
    try:
        access.open(default_user=None)
    except AccessDatabaseDamaged as damage:
        raise MigrationError(str(damage)) from None
    return access


def record_backends(migration_plan, now=time.gmtime):
    """
    Record each moved vhost's new backend string in the access database, in one
    durable change, after keeping the database as it was beside it; the path of
    that copy (None when no vhost moved).
    """
    access = migration_plan.access
    changes = {move.vhost: move.target for move in migration_plan.moves if move.vhost is not None}
    if access is None or not changes:
        return None
    backup = first = access.path + BACKUP_SUFFIX + time.strftime("%Y%m%dT%H%M%SZ", now())
    number = 1
    while os.path.exists(backup):  # a run within the same second keeps the earlier copy
        number += 1
        backup = f"{first}-{number}"
    shutil.copyfile(access.path, backup)
    with open(backup, "rb") as copy:
        os.fsync(copy.fileno())
    access.set_vhost_backends(changes)
    return backup
