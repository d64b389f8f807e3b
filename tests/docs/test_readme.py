"""The README's quick start is exactly two commands, CI runs the test one, and
the run one installs a broker that starts and answers."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import urllib.request

import pytest

from brokerd.testing import WAIT_SECONDS, poll_until
from tests.support.paths import ROOT

pytestmark = pytest.mark.long_module(seconds=40)  # started early (tests/conftest.py)


def quick_start_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_quick_start_has_a_run_command_and_a_test_command():
    run, test = quick_start_commands()
    assert "twistd -n brokerd" in run
    assert "pytest" in test


def test_ci_runs_the_readme_test_command():
    _, test = quick_start_commands()
    ci_script = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci_script[-1] == test


def _copy_source(destination):
    ignored = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "dropin.cache",
                                     "_build")
    shutil.copytree(ROOT, destination, ignore=ignored)
    return destination


def test_the_quick_start_installs_a_broker_that_starts_and_answers(tmp_path):
    """
    The quick start's run command, in a temporary location: C{pip install .}
    of a copy of the checkout (with C{--no-deps --target}, its dependencies
    being this environment's, as tests/process/test_twistd.py installs), then
    C{twistd -n brokerd} from that install alone, its listeners moved to free
    ports; the broker starts, answers the management API, and stops on SIGTERM.
    """
    run, _ = quick_start_commands()
    assert run.split(" && ") == ["python3 -m venv .venv", ".venv/bin/pip install .", ".venv/bin/twistd -n brokerd"]
    target = tmp_path / "installed"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
         str(_copy_source(tmp_path / "source"))], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]]),
               PYTHONUNBUFFERED="1")
    log_path = tmp_path / "broker.log"
    listeners = ["--amqp", "tcp:0:interface=127.0.0.1", "--native", "tcp:0:interface=127.0.0.1",
                 "--http", "tcp:0:interface=127.0.0.1", "--prometheus", "tcp:0:interface=127.0.0.1"]
    # -S keeps this checkout (installed editable here) off sys.path: only the fresh install and the dependencies.
    twistd = [sys.executable, "-S", "-c", "import sys; from twisted.scripts.twistd import run; run()"]
    with open(log_path, "w") as log:
        broker = subprocess.Popen([*twistd, "-n", "--pidfile=", "brokerd", *listeners], cwd=tmp_path, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        def http_address():
            if broker.poll() is not None:
                raise AssertionError(f"the broker exited with {broker.returncode}:\n{log_path.read_text()}")
            match = re.search(r"HTTP API listening on ([\d.]+):(\d+)", log_path.read_text())
            return match.groups() if match else None

        host, port = poll_until(http_address, WAIT_SECONDS, "HTTP API listener")
        request = urllib.request.Request(f"http://{host}:{port}/api/overview")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(request, timeout=WAIT_SECONDS) as answer:
            overview = json.load(answer)
        assert overview["product_name"] == "brokerd"
    finally:
        broker.terminate()
        status = broker.wait(WAIT_SECONDS)
    assert status == 0, log_path.read_text()
    assert "brokerd stopped cleanly" in log_path.read_text()
