"""Finds storage backends by name and builds stores from backend strings.

A backend string names a backend and its options the way Twisted endpoint
strings do: ``sqlite:path=/var/lib/brokerd/db.sqlite:cache=64M``. A colon or
backslash inside a value is escaped with a backslash. Backends register under
the ``brokerd.backends`` entry-point group, so nothing here names one.
"""

from importlib.metadata import entry_points

from zope.interface.exceptions import Invalid
from zope.interface.verify import verifyObject

from brokerd.interfaces import IMessageStore, IStoreBackend
from brokerd.storage.durability import SyncPolicy

ENTRY_POINT_GROUP = "brokerd.backends"


class BackendError(ValueError):
    """A backend string names an unknown backend, an unknown option or a bad value."""


def available_backends():
    """Registered backends: a dict of name to entry point, sorted by name."""
    found = {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}
    return dict(sorted(found.items()))


def load_backend(name):
    """The L{IStoreBackend} registered as C{name}, checked against the interface."""
    registered = available_backends()
    entry = registered.get(name)
    if entry is None:
        known = ", ".join(registered) or "none (is brokerd installed?)"
        raise BackendError(f"unknown backend {name!r}; known backends: {known}")
    backend = entry.load()
    try:
        verifyObject(IStoreBackend, backend)
    except Invalid as problem:
        raise BackendError(f"backend {name!r} ({entry.value}) does not provide IStoreBackend:"
                           f" {problem}") from None
    return backend


def split_backend_string(text):
    """Splits C{name:key=value:...} into the name and a dict of options."""
    parts, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            current.append(next(chars, "\\"))
        elif char == ":":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    name, options = parts[0], {}
    if not name:
        raise BackendError(f"backend string {text!r} does not start with a backend name")
    for part in parts[1:]:
        key, equals, value = part.partition("=")
        if not equals or not key:
            raise BackendError(f"backend option {part!r} in {text!r} is not of the form key=value")
        if key in options:
            raise BackendError(f"backend option {key!r} is given twice in {text!r}")
        options[key] = value
    return name, options


def make_store(text, data_dir, sync_policy=None, *, reactor, replica=False):
    """
    Build (without opening) the store a backend string describes, keeping its
    data under C{data_dir} and committing by C{sync_policy} (a
    L{brokerd.storage.durability.SyncPolicy}; the default is C{always}), its timers
    and writer thread's results run by C{reactor}. A C{replica} store (one that
    only a replication stream writes) takes the backend's C{replica_options}
    over the string's.

    @raise BackendError: naming the backend, option or value at fault.
    """
    name, options = split_backend_string(text)
    backend = load_backend(name)
    unknown = sorted(set(options) - set(backend.options))
    if unknown:
        known = ", ".join(sorted(backend.options)) or "none"
        raise BackendError(f"backend {name!r} has no option {unknown[0]!r};"
                           f" its options are: {known}")
    if replica:
        options.update(getattr(backend, "replica_options", {}))
    try:
        store = backend.make_store(data_dir, sync_policy or SyncPolicy(), reactor=reactor,
                                   **options)
    except ValueError as problem:
        raise BackendError(f"backend {name!r}: {problem}") from None
    try:
        verifyObject(IMessageStore, store)
    except Invalid as problem:
        raise BackendError(f"backend {name!r} made a store that does not provide IMessageStore:"
                           f" {problem}") from None
    return store


def describe_backends():
    """Human-readable lines describing every backend and its options (for --help-backends)."""
    lines = []
    for name in available_backends():
        backend = load_backend(name)
        lines.append(f"{name}: {backend.description}")
        for option, (default, text) in sorted(backend.options.items()):
            lines.append(f"    {option}={default!s:<12} {text}")
    return lines
