"""A regular (non-editable) install of this checkout into a fresh directory, as pip makes it from a
copy of the sources, and the environment in which a C{python -S} sees only that install and the
test environment's dependencies (-S keeps this checkout, installed editable here, off sys.path)."""

import os
import shutil
import subprocess
import sys
import sysconfig

from tests.support.paths import ROOT

NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "dropin.cache")


def copy_checkout(destination):
    """A copy of the checkout's sources (no git, venv, build output or caches) at C{destination}."""
    shutil.copytree(ROOT, destination, ignore=NOT_SOURCES)
    return destination


def install_copy(directory, extras="", compile_bytecode=True):
    """
    Copy the checkout under C{directory} and pip-install it (no dependencies) into C{directory/installed},
    which it returns; C{extras} as pip takes them (C{"[spark]"}). Without C{compile_bytecode} the install
    has no C{__pycache__}, so one found there later shows what a run imported from it.
    """
    source = copy_checkout(directory / "source")
    target = directory / "installed"
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), f"{source}{extras}"]
    if not compile_bytecode:
        command.insert(4, "--no-compile")
    install = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    return target


def isolated_environment(target, **variables):
    """This process's environment with C{PYTHONPATH} the fresh install C{target}, then the dependencies."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]]),
                **variables)
