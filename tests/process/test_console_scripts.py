"""Every command a user runs is a console script of the install: each one the install declares is in
this environment's scripts directory and answers --help with status 0 and its own name in the usage."""

import importlib.metadata
import pathlib
import subprocess
import sysconfig

import pytest

EXPECTED = {"brokerd-admin", "brokerd-native", "brokerd-validate", "brokerd-workload", "brokerd-store-export",
            "brokerd-report"}


def declared_scripts():
    return sorted(entry.name for entry in importlib.metadata.distribution("brokerd").entry_points
                  if entry.group == "console_scripts")


def test_the_install_declares_the_users_commands():
    assert set(declared_scripts()) >= EXPECTED


@pytest.mark.parametrize("name", declared_scripts())
def test_each_console_script_answers_help(name, tmp_path):
    script = pathlib.Path(sysconfig.get_path("scripts")) / name
    assert script.is_file(), f"{name} is declared but not installed in {script.parent}"
    done = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    assert done.stdout.startswith(f"usage: {name} "), done.stdout
