"""brokerd-admin migrate: brokerd.migrate run in brokerd-admin's own process on a stopped broker's data
directory, its progress on stderr, its report on stdout, and a failure as brokerd-admin's one
'error: ...' line with status 1 (tests/migrate/ covers what a migration carries and checks)."""

import subprocess
import sys

from brokerd.migrate.digest import changed_files, snapshot
from tests.support.admin_cli import admin
from tests.support.paths import ROOT


def write_data_dir(backend, data_dir):
    written = subprocess.run([sys.executable, "-m", "tests.support.migrate_data", backend, str(data_dir)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr


def test_a_data_directory_is_migrated_and_checked(tmp_path):
    data_dir = tmp_path / "data"
    write_data_dir("chunked", data_dir)
    source_files = snapshot(str(data_dir))
    # No broker, and no API to log in to: the URL is one nothing listens on.
    status, out, errors = admin("http://127.0.0.1:1", "migrate", "--data-dir", str(data_dir), "--from", "chunked",
                                "--to", "sqlite")
    assert status == 0, errors
    assert out.startswith(f"migrated {data_dir} from chunked to sqlite: "), out
    assert out.splitlines()[-1].startswith(f"start the broker with --backend=sqlite --data-dir={data_dir}"), out
    assert errors and all(line.startswith("migrate: ") for line in errors.splitlines()), errors
    assert errors.splitlines()[0].startswith("migrate: copied 10/10 messages (100%)"), errors
    assert changed_files(source_files, snapshot(str(data_dir))) == []
    # What it wrote is a sqlite store holding the data: it migrates on, quietly.
    assert admin(None, "migrate", "--data-dir", str(data_dir), "--from", "sqlite", "--to", "filelog",
                 "--quiet")[::2] == (0, "")


def test_a_failure_is_one_error_line_and_status_1(tmp_path):
    missing = tmp_path / "missing"
    assert admin(None, "migrate", "--data-dir", str(missing), "--from", "chunked", "--to", "sqlite") == (
        1, "", f"error: data directory {missing} does not exist\n")
    data_dir = tmp_path / "data"
    write_data_dir("sqlite", data_dir)
    files = snapshot(str(data_dir))
    status, out, errors = admin(None, "migrate", "--data-dir", str(data_dir), "--from", "chunky", "--to", "filelog")
    assert (status, out) == (1, "")
    assert errors.splitlines()[-1].startswith("error: --from: unknown backend 'chunky'"), errors
    assert snapshot(str(data_dir)) == files
