"""The architecture page's folder map names every folder of brokerd/, backends/
and the top level, one line each, and nothing that is not there."""

import re
import subprocess

from tests.support.paths import ROOT

MAP = re.compile(r"^\.\. code-block:: text\n   :class: folder-map\n\n((?:   .*\n)+)", re.M)


def mapped_folders():
    """The folders the page lists, in its order, as paths ending with a slash."""
    block = MAP.search((ROOT / "docs" / "architecture.rst").read_text())
    assert block is not None, "docs/architecture.rst has no folder map"
    return [line.split()[0] for line in block.group(1).splitlines() if line.strip()]


def project_folders():
    """Every folder holding a file of the project (tracked, or new and not ignored) under brokerd/ and backends/,
    and every top-level folder."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    folders = set()
    for name in files:
        parts = name.split("/")[:-1]
        if not parts or not (ROOT / name).exists():
            continue
        folders.add(parts[0] + "/")
        if parts[0] in ("brokerd", "backends"):
            folders.update("/".join(parts[:depth]) + "/" for depth in range(1, len(parts) + 1))
    return folders


def test_every_folder_is_on_the_map_once():
    mapped = mapped_folders()
    assert len(mapped) == len(set(mapped))
    assert sorted(project_folders() - set(mapped)) == []


def test_every_folder_on_the_map_exists():
    assert [folder for folder in mapped_folders() if not (ROOT / folder).is_dir()] == []
