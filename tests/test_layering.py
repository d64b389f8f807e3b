"""The house's rules, read from the sources (imports anywhere in a file count, those inside
functions too):

  - brokerd's packages stand in layers (L{LAYERS}); a module imports its own package and the
    layers below it, never a layer above, nor a sibling package of its own layer;
  - a backend sees only the base layer (the store contract in brokerd.interfaces, the records
    in brokerd.proto, errors and units) and brokerd.storage.durability, never the model or a
    protocol; nothing in brokerd/ imports a backend by name;
  - brokerd-admin is a client of the HTTP API (and of brokerd.migrate for offline migration),
    and nothing else in brokerd imports it;
  - no import cycle anywhere, between modules or through a package's __init__;
  - shipped code (what setup.py installs) imports only shipped code, and nothing outside tests/
    imports tests;
  - a test imports neither a conftest.py nor another test module: what tests share is in
    tests/support;
  - no module is over 500 lines, no line of shipped code over 100 characters, none of the tools'
    or the tests' over 120.
"""

import ast
import importlib.metadata
import pathlib

import pytest

from tests.support.paths import ROOT

MAX_MODULE_LINES = 500
# Every folder of the house's Python; tests/ is the one that may import tests.
PACKAGES = ("brokerd", "backends", "spark_jobs", "benchmarks", "fuzz", "crashloop", "tests")

# brokerd's layers, bottom first; each a group of sibling packages that do not import each other.
BASE = ("brokerd", "brokerd.interfaces", "brokerd.errors", "brokerd.units", "brokerd.proto")
LAYERS = (
    {"base": BASE},
    {"brokerd.model": ("brokerd.model",), "brokerd.storage": ("brokerd.storage",),
     "brokerd.wire": ("brokerd.wire",), "brokerd.cluster": ("brokerd.cluster",)},
    # Replication wraps the stores (storage's layer) and will answer to leadership in etcd
    # (cluster's); nothing below it knows that a store is replicated.
    {"brokerd.access": ("brokerd.access",), "brokerd.replication": ("brokerd.replication",)},
    {"brokerd.session": ("brokerd.session",)},
    {"brokerd.amqp": ("brokerd.amqp",), "brokerd.native": ("brokerd.native",), "brokerd.http": ("brokerd.http",)},
    {"brokerd.process": ("brokerd.process",)},
)
# Tools beside the broker: each imports what it needs from the layers, and the broker imports none of them.
TOOLS = ("brokerd.admin", "brokerd.migrate", "brokerd.loadgen", "brokerd.testing")
BACKENDS_MAY_IMPORT = (*BASE, "brokerd.storage.durability")
ADMIN_MAY_IMPORT = ("brokerd.admin", "brokerd.migrate")


def imported_modules(path):
    """Every module C{path} imports, as written, at any depth (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # a submodule, when it is one


def module_name(path):
    relative = path.relative_to(ROOT).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def sources(folder):
    return sorted(path for path in (ROOT / folder).rglob("*.py") if not path.name.endswith("_pb2.py"))


def under(name, prefixes):
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def project_modules():
    """Every module of the house, by dotted name."""
    return {module_name(path): path for folder in PACKAGES for path in sources(folder)}


MODULES = project_modules()


def known_module(name):
    """The project module C{name} names (C{pkg.mod.Class} -> C{pkg.mod}), or None for an outside one."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def project_imports(path):
    own = module_name(path)
    return {found for name in imported_modules(path) if (found := known_module(name)) and found != own}


def group_of(name):
    """(layer number, sibling group) of a brokerd module; None for a tool or a module of no layer."""
    if under(name, TOOLS):
        return None
    best = None
    for number, groups in enumerate(LAYERS):
        for group, prefixes in groups.items():
            for prefix in prefixes:
                matches = name == prefix if prefix == "brokerd" else under(name, (prefix,))
                if matches and (best is None or len(prefix) > best[2]):
                    best = (number, group, len(prefix))
    return None if best is None else best[:2]


LAYERED = [path for path in sources("brokerd") if not under(module_name(path), TOOLS)]


@pytest.mark.parametrize("path", LAYERED, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_brokerd_module_stands_in_a_layer_or_is_a_tool(path):
    assert group_of(module_name(path)) is not None, f"{module_name(path)} is in no layer of LAYERS and no tool"


@pytest.mark.parametrize("path", LAYERED, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_arrow_runs_up_or_sideways(path):
    """A module imports its own group and the layers below it only."""
    own = group_of(module_name(path))
    wrong = []
    for name in sorted(project_imports(path)):
        if not under(name, ("brokerd",)):
            continue
        theirs = group_of(name)
        if theirs is None:
            wrong.append(f"{name} (a tool)")
        elif theirs[0] > own[0]:
            wrong.append(f"{name} (layer {theirs[0]}, above {own[0]})")
        elif theirs[0] == own[0] and theirs[1] != own[1]:
            wrong.append(f"{name} (a sibling of {own[1]})")
    assert wrong == [], f"{path.relative_to(ROOT)} imports {wrong}"


@pytest.mark.parametrize("path", sources("backends"), ids=lambda path: str(path.relative_to(ROOT)))
def test_a_backend_sees_only_the_store_contract_and_durability(path):
    wrong = [name for name in project_imports(path)
             if under(name, ("brokerd",)) and not under(name, BACKENDS_MAY_IMPORT)]
    assert wrong == [], f"{path.relative_to(ROOT)} imports {wrong}"


def test_nothing_in_brokerd_imports_a_backend_by_name():
    found = [(str(path.relative_to(ROOT)), name) for path in sources("brokerd") for name in project_imports(path)
             if under(name, ("backends",))]
    assert found == []


@pytest.mark.parametrize("path", sources("brokerd/admin"), ids=lambda path: str(path.relative_to(ROOT)))
def test_brokerd_admin_is_a_client_of_the_http_api_and_of_offline_migration(path):
    """It talks to a running broker over HTTP; the model, the protocols and the API's server are not its to import."""
    others = [name for name in project_imports(path) if under(name, ("brokerd",)) and not under(name, ADMIN_MAY_IMPORT)]
    assert others == []


def test_the_broker_imports_none_of_its_tools():
    found = [(str(path.relative_to(ROOT)), name) for path in LAYERED for name in project_imports(path)
             if under(name, TOOLS)]
    assert found == []


def strongly_connected(graph):
    """Tarjan's strongly connected components of C{graph} (node -> successors), those of more than one node."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_anywhere():
    """
    Between modules, imports inside functions included, and from a package's __init__ to its modules.
    C{from pkg import sibling} inside pkg names the package only to reach a sibling module, so a
    module's arrows to its own ancestor packages are not counted.
    """
    graph = {name: {imported for imported in project_imports(path) if not name.startswith(imported + ".")}
             for name, path in MODULES.items()}
    assert strongly_connected(graph) == []


def test_a_cycle_is_found_when_there_is_one():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def shipped_packages():
    """The top-level packages the install ships, from its own metadata."""
    return set(importlib.metadata.distribution("brokerd").read_text("top_level.txt").split())


def test_the_install_ships_the_broker_its_backends_and_the_validation():
    assert shipped_packages() >= {"brokerd", "backends", "spark_jobs"}
    assert not shipped_packages() & {"tests", "benchmarks", "fuzz", "crashloop"}


@pytest.mark.parametrize("folder", ["brokerd", "backends", "spark_jobs", "twisted"])
def test_shipped_code_imports_only_shipped_code(folder):
    shipped = shipped_packages()
    unshipped = {name.partition(".")[0] for name in MODULES} - shipped
    found = [(str(path.relative_to(ROOT)), name) for path in sources(folder) for name in imported_modules(path)
             if name.partition(".")[0] in unshipped]
    assert found == []


def test_nothing_outside_tests_imports_tests():
    found = [(str(path.relative_to(ROOT)), name) for folder in PACKAGES if folder != "tests"
             for path in sources(folder) for name in imported_modules(path) if under(name, ("tests",))]
    found += [(str(path.relative_to(ROOT)), name) for path in [ROOT / "setup.py", *sources("twisted")]
              for name in imported_modules(path) if under(name, ("tests",))]
    assert found == []


def is_test_module(name):
    return name.rpartition(".")[2].startswith("test_") or name.rpartition(".")[2] == "conftest"


@pytest.mark.parametrize("path", sources("tests"), ids=lambda path: str(path.relative_to(ROOT)))
def test_a_test_imports_no_conftest_and_no_other_test_module(path):
    """What tests share lives in tests/support; a conftest may import from there, nothing imports a conftest."""
    found = [name for name in project_imports(path) if is_test_module(name)]
    assert found == []


def test_no_module_is_over_500_lines():
    """Past that a module holds more than one concern; split it by concern, not by size."""
    long = {str(path.relative_to(ROOT)): lines for folder in PACKAGES for path in sources(folder)
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    listed = "\n".join(f"{path}: {lines}" for path, lines in sorted(long.items()))
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines:\n{listed}"


LINE_LIMITS = {"brokerd": 100, "backends": 100, "spark_jobs": 100, "benchmarks": 120, "fuzz": 120,
               "crashloop": 120, "tests": 120}


@pytest.mark.parametrize("folder", sorted(LINE_LIMITS))
def test_no_line_is_longer_than_its_folders_limit(folder):
    """Long lines are the other face of squeezing a module under its limit; wrap, do not cram."""
    limit = LINE_LIMITS[folder]
    long = [f"{path.relative_to(ROOT)}:{number}" for path in sources(folder)
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > limit]
    assert long == [], f"lines over {limit} characters:\n" + "\n".join(long)
