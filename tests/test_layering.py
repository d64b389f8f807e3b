"""The house's rule, read from the sources: a backend sees only the store contract
(brokerd.interfaces), the records (brokerd.proto) and small shared utilities, never
the model or a protocol; and nothing in brokerd/ imports a backend by name."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
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


def test_nothing_in_brokerd_imports_a_backend_by_name():
    found = [(str(path.relative_to(ROOT)), name) for path in sources("brokerd") for name in imported_modules(path)
             if name == "backends" or name.startswith("backends.")]
    assert found == []
