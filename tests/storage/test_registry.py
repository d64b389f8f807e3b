"""Backends found by name, backend strings parsed like Twisted endpoint strings."""

import pytest
from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from brokerd.interfaces import IMessageStore, IStoreBackend
from brokerd.storage import registry
from brokerd.storage.registry import BackendError, make_store, split_backend_string


def test_memory_backend_is_registered_and_provides_the_interface():
    backends = registry.available_backends()
    assert "memory" in backends
    assert verifyObject(IStoreBackend, registry.load_backend("memory"))


def test_make_store_builds_an_unopened_store(tmp_path):
    store = make_store("memory", str(tmp_path), reactor=Clock())
    assert verifyObject(IMessageStore, store)
    assert store.name == "memory"


def test_unknown_backend_names_itself_and_the_known_ones():
    with pytest.raises(BackendError) as raised:
        make_store("nosuch", "/tmp", reactor=Clock())
    assert "unknown backend 'nosuch'" in str(raised.value)
    assert "memory" in str(raised.value)


def test_unknown_option_names_itself_and_the_backend_options():
    with pytest.raises(BackendError) as raised:
        make_store("memory:colour=blue", "/tmp", reactor=Clock())
    assert "'memory' has no option 'colour'" in str(raised.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("memory", ("memory", {})),
        ("sqlite:path=/var/lib/brokerd/db.sqlite", ("sqlite", {"path": "/var/lib/brokerd/db.sqlite"})),
        ("chunked:chunk_size=64M:cache=1000", ("chunked", {"chunk_size": "64M", "cache": "1000"})),
        (r"sqlite:path=C\:\\data\\db", ("sqlite", {"path": r"C:\data\db"})),
        ("filelog:empty=", ("filelog", {"empty": ""})),
    ],
)
def test_backend_strings_split_like_endpoint_strings(text, expected):
    assert split_backend_string(text) == expected


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("", "does not start with a backend name"),
        (":path=x", "does not start with a backend name"),
        ("sqlite:path", "is not of the form key=value"),
        ("sqlite:=x", "is not of the form key=value"),
        ("sqlite:path=a:path=b", "'path' is given twice"),
    ],
)
def test_malformed_backend_strings_say_what_is_wrong(text, complaint):
    with pytest.raises(BackendError) as raised:
        split_backend_string(text)
    assert complaint in str(raised.value)


def test_help_lines_describe_every_backend():
    lines = registry.describe_backends()
    assert any(line.startswith("memory: ") for line in lines)
