"""What the broker says about itself at start-up, for an operator reading the log.

L{StartupReport} logs the version, the data directory, the backend with every
option it runs with (defaults included) and the sync mode, before the store
opens; each listener logs the address it bound once it is up. After recovery it
warns when the chosen backend found nothing while another backend's data sits
in the same data directory: the broker would otherwise start empty without a
word (the data is left untouched, and C{brokerd-admin migrate} carries it over).
"""

import os
import shlex

from twisted.logger import Logger

import brokerd
from brokerd.storage import registry

log = Logger()

DATA_DIR_PLACEHOLDER = "<data-dir>"  # how a backend's option defaults refer to --data-dir


def _store_location(store):
    """Where a durable store keeps its data (a directory or a database file), if it says."""
    return getattr(store, "directory", None) or getattr(store, "path", None)


def _holds_data(location):
    """True if C{location} is a non-empty file or a directory holding one."""
    if os.path.isfile(location):
        return os.path.getsize(location) > 0
    for directory, _, files in os.walk(location):
        for name in files:
            try:
                # A directory tree of empty files is what an empty store leaves behind, not data.
                if os.path.getsize(os.path.join(directory, name)) > 0:
                    return True
            except OSError:
                continue
    return False


class StartupReport:
    """The settings a broker runs with, as given on the command line."""

    def __init__(self, backend, data_dir, sync_policy, reactor):
        self.backend = backend  # the --backend string
        self.data_dir = os.path.abspath(data_dir)
        self.sync_policy = sync_policy
        self.reactor = reactor  # what the other backends' stores are built with (never opened)

    def backend_options(self):
        """The backend's name and every option it runs with (given ones, then defaults), as text."""
        name, given = registry.split_backend_string(self.backend)
        defaults = registry.load_backend(name).options
        options = {key: given.get(key, default) for key, (default, _) in sorted(defaults.items())}
        shown = " ".join(f"{key}={value.replace(DATA_DIR_PLACEHOLDER, self.data_dir)}"
                         for key, value in options.items())
        return name, shown

    def log_settings(self):
        name, options = self.backend_options()
        log.info(
            "brokerd {version} starting: data directory {data_dir},"
            " backend {backend}{options}, sync {sync}",
            version=brokerd.__version__,
            data_dir=self.data_dir,
            backend=name,
            options=f" ({options})" if options else "",
            sync=self.sync_policy,
        )

    def other_backends_data(self, store):
        """C{(backend name, location)} of each other backend whose default
        location under the data directory holds data."""
        own = _store_location(store)
        found = []
        for name in registry.available_backends():
            if name == store.name:
                continue
            try:
                other = registry.make_store(
                    name, self.data_dir, self.sync_policy, reactor=self.reactor
                )
            except registry.BackendError:
                continue
            location = _store_location(other)
            if (
                not other.durable
                or location is None
                or location == own
                or not os.path.exists(location)
            ):
                continue
            if _holds_data(location):
                found.append((name, location))
        return found

    def warn_of_other_backends_data(self, store, recovered):
        """After recovery: warn if the store came up empty beside another backend's data."""
        if not store.durable or any(
            recovered.get(kind) for kind in ("exchanges", "queues", "quarantined")
        ):
            return
        for name, location in self.other_backends_data(store):
            log.warn(
                "the data directory holds the {other} backend's files ({location}),"
                " which the {backend} backend does not read: this broker starts without"
                " what they hold (they are left untouched). To carry their queues and"
                " messages over, stop the broker and run: {command}",
                other=name,
                location=location,
                backend=store.name,
                command=migrate_command(self.data_dir, name, store.name),
            )


def migrate_command(data_dir, source, target):
    """
    The command line that carries a data directory's C{source} backend's data
    over to C{target}.
    """
    return f"brokerd-admin migrate --data-dir {shlex.quote(data_dir)} --from {source} --to {target}"
