"""brokerd-admin as the tests run it: a subprocess (python -m brokerd.admin) against one broker's HTTP API."""

import os
import subprocess
import sys

from tests.support.paths import ROOT


def http_url(broker):
    """The base URL of a L{brokerd.testing.BrokerProcess}'s management API."""
    _, host, port = broker.wait_listening("HTTP API").split(":")
    return f"http://{host}:{port}"


def admin(url, *args, user="guest", password="guest", input=None, env=None, cwd=ROOT):
    """
    C{(exit status, stdout, stderr)} of one brokerd-admin run logged in as C{user}; C{url} None leaves
    out C{--url} (the environment's C{BROKERD_URL} or the default then), and C{env} adds variables.
    """
    login = ([] if url is None else ["--url", url]) + ["--user", user, "--password", password]
    done = subprocess.run([sys.executable, "-m", "brokerd.admin", *login, *args], input=input,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}, cwd=cwd)
    return done.returncode, done.stdout, done.stderr
