"""The house's rules, read from the sources: a backend sees only the store contract
(brokerd.interfaces), the records (brokerd.proto) and small shared utilities, never
the model or a protocol; the model and the protocol-free channel and connection
import no protocol, and the protocol adapters (AMQP, native, the HTTP API) do not import each other;
brokerd-admin (brokerd/admin) is a client of the HTTP API and imports nothing else of brokerd, nor
does the broker import it; nothing in brokerd/ imports a backend by name; nothing
outside tests/ imports tests (what benchmarks and spark_jobs share with the tests
ships as brokerd.testing); and no module is over 500 lines."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
# Where the house's Python lives; tests/ is the one that may import tests.
PACKAGES = ("brokerd", "backends", "benchmarks", "spark_jobs", "tests")
ABOVE_THE_STORE = ("brokerd.model", "brokerd.amqp", "brokerd.native", "brokerd.channel", "brokerd.connection",
                   "brokerd.migrate", "brokerd.service", "brokerd.tap")


def imported_modules(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def sources(folder):
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", sources("backends"), ids=lambda path: str(path.relative_to(ROOT)))
def test_a_backend_imports_neither_the_model_nor_a_protocol(path):
    above = [name for name in imported_modules(path)
             if any(name == layer or name.startswith(layer + ".") for layer in ABOVE_THE_STORE)]
    assert above == [], f"{path.relative_to(ROOT)} imports {above}"


def names_under(path, layers):
    return [name for name in imported_modules(path)
            if any(name == layer or name.startswith(layer + ".") for layer in layers)]


PROTOCOL_FREE = [*sources("brokerd/model"), ROOT / "brokerd/channel.py", ROOT / "brokerd/connection.py",
                 ROOT / "brokerd/consumer.py"]


@pytest.mark.parametrize("path", PROTOCOL_FREE, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_model_channel_and_connection_import_no_protocol(path):
    assert names_under(path, ("brokerd.amqp", "brokerd.native")) == []


@pytest.mark.parametrize("protocol, other", [("amqp", "native"), ("native", "amqp"), ("amqp", "http"),
                                             ("native", "http"), ("http", "amqp"), ("http", "native")])
def test_one_protocol_adapter_does_not_import_the_other(protocol, other):
    found = [(str(path.relative_to(ROOT)), name) for path in sources(f"brokerd/{protocol}")
             for name in names_under(path, (f"brokerd.{other}",))]
    assert found == []


@pytest.mark.parametrize("path", sources("brokerd/admin"), ids=lambda path: str(path.relative_to(ROOT)))
def test_brokerd_admin_is_a_client_of_the_http_api_only(path):
    """It talks to the broker over HTTP; the model, the protocols and the API's server are not its to import."""
    others = [name for name in imported_modules(path)
              if (name == "brokerd" or name.startswith("brokerd.")) and not name.startswith("brokerd.admin")]
    assert others == []


def test_nothing_in_brokerd_imports_brokerd_admin():
    found = [(str(path.relative_to(ROOT)), name) for path in sources("brokerd") if "admin" not in path.parts
             for name in imported_modules(path) if name == "brokerd.admin" or name.startswith("brokerd.admin.")]
    assert found == []


def test_nothing_in_brokerd_imports_a_backend_by_name():
    found = [(str(path.relative_to(ROOT)), name) for path in sources("brokerd") for name in imported_modules(path)
             if name == "backends" or name.startswith("backends.")]
    assert found == []


def test_nothing_outside_tests_imports_tests():
    found = [(str(path.relative_to(ROOT)), name) for folder in PACKAGES if folder != "tests"
             for path in sources(folder) for name in imported_modules(path)
             if name == "tests" or name.startswith("tests.")]
    found += [(str(path.relative_to(ROOT)), name) for path in [ROOT / "setup.py", *sources("twisted")]
              for name in imported_modules(path) if name == "tests" or name.startswith("tests.")]
    assert found == []


def test_no_module_is_over_500_lines():
    """Past that a module holds more than one concern; split it by concern, not by size."""
    long = {str(path.relative_to(ROOT)): lines for folder in PACKAGES for path in sources(folder)
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    listed = "\n".join(f"{path}: {lines}" for path, lines in sorted(long.items()))
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines:\n{listed}"
