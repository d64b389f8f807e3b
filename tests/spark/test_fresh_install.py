"""The acceptance point "pip install '.[spark]' into a fresh environment, then from another directory
the validation's small run works": the checkout installed non-editable (with the spark extra) into a
fresh target, then, from a directory outside the checkout and with only that install and the
dependencies importable, the cross-backend validation's small run on sqlite: the real workload
against a real broker, the store export and the Spark job, to a passing verdict. The install is made
without bytecode, so the __pycache__ directories the run leaves in it show that the broker, the
backend, the export, the workload clients and the Spark job all ran from it."""

import json
import subprocess
import sys

import pytest

from tests.support.fresh_install import install_copy, isolated_environment
from tests.support.paths import ROOT
from tests.support.spark_driver import SUBMIT_ARGS

pytestmark = pytest.mark.long_module(seconds=75)  # started early (tests/conftest.py)

# What the small run imports from the install, process by process: the driver and the Spark job, the
# workload's clients (each in a process of its own), the broker (the twistd plugin, brokerd's process
# layer) with its store, and the store export (in a child of its own).
IMPORTED_FROM_THE_INSTALL = ["spark_jobs/validate_backends", "spark_jobs/analysis", "spark_jobs/fast_clients",
                             "twisted/plugins/brokerd_plugin", "brokerd/process/tap", "backends/sqlite/__init__",
                             "spark_jobs/export"]


def compiled(target, module):
    """Whether the install at C{target} holds bytecode of C{module} (a path without .py): it was imported."""
    folder, _, name = module.rpartition("/")
    return any((target / folder / "__pycache__").glob(f"{name}.*.pyc"))


def test_the_validations_small_run_works_from_a_fresh_install(tmp_path):
    target = install_copy(tmp_path, extras="[spark]", compile_bytecode=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert ROOT not in elsewhere.parents
    # Bytecode written as modules are imported (it is how the run shows what it imported from where).
    env = isolated_environment(target, PYSPARK_SUBMIT_ARGS=SUBMIT_ARGS)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    where = subprocess.run(
        [sys.executable, "-S", "-c", "import brokerd, backends, spark_jobs;"
         " print(brokerd.__file__, backends.__file__, spark_jobs.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    assert all(path.startswith(f"{target}/") for path in where.stdout.split()), where.stdout

    out = tmp_path / "report"
    run = subprocess.run(
        [sys.executable, "-S", "-m", "spark_jobs.validate_backends", "--backends", "sqlite", "--messages", "200",
         "--driver-memory", "1g", "--quiet", "--out", str(out)],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "verdict: pass", run.stdout
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["verdict"] == "pass"
    assert summary["backends"]["sqlite"]["run"]["published"] == 200
    assert (out / "report.html").is_file()
    not_imported = [module for module in IMPORTED_FROM_THE_INSTALL if not compiled(target, module)]
    assert not_imported == [], f"{not_imported} were not imported from the fresh install in {target}"
