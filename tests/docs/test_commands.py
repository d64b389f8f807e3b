"""Every command the manual shows (its ``.. code-block:: console`` blocks, ``$ ``
lines) runs, page by page in the page's order, against real processes.

Each page gets a temporary working directory and, for the commands that talk to
a broker, a broker of its own on free loopback ports. A command runs as shown
except for what a test must change, all of it listed here:

- the documented default ports in a command (15672, 15692) become the test
  broker's; ``brokerd-admin`` finds that broker through ``BROKERD_URL`` and
  ``brokerd-native`` through ``--connect``, put after its name;
- ``twistd -n brokerd ...`` starts a broker as shown, with its listeners on free
  ports (the ones the command names moved to free ports, the others added),
  waits until it listens, then stops it with SIGTERM and expects status 0;
- ``etcd ...`` starts a private etcd on free loopback ports instead (the page's
  later commands reach it where they name ``http://127.0.0.1:2379``), stopped
  with the page; a cluster node (``--cluster-etcd``) started alone leads its
  cluster and listens as any broker;
- the commands of C{REDUCED} run in the reduced form given, with the reason.

A command exits 0 unless C{EXPECTED_STATUS} says otherwise, and every line the
manual shows a command printing must be in what it printed.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import trustme

from brokerd.testing import BrokerProcess
from tests.support.doc_commands import console_commands, pages
from tests.support.etcd import EtcdProcess
from tests.support.paths import ROOT

pytestmark = pytest.mark.long_module(seconds=60)  # started early (tests/conftest.py)

BIN = os.path.dirname(sys.executable)
COMMAND_SECONDS = 120

# Commands that cannot run as shown in a test, the form they run in, and why.
HELP_ONLY = "--help, and every option the command shows is in it"
REDUCED = {
    "python -m benchmarks.": (HELP_ONLY, "a benchmark runs for minutes and wants the machine to itself"),
    "python -m crashloop": (HELP_ONLY, "100 SIGKILLed brokers take minutes; tests/backends/test_crash_recovery.py runs"
                                       " a few cycles of it"),
    "python -m fuzz": (HELP_ONLY, "ten minutes of fuzzing; tests/tools/test_fuzz.py runs about 20 s of it"),
    "brokerd-validate": (HELP_ONLY, "the Spark job takes minutes (tests/spark/test_pipeline.py runs a small one),"
                                    " and the reference run needs a RabbitMQ"),
    "python -m brokerd.proto.compile": ("with --output-root in a temporary directory",
                                        "as shown it rewrites brokerd/proto/*_pb2.py in the checkout"),
    "python -m sphinx": ("into a temporary directory, by tests/docs/test_build.py", "the build takes its own test"),
    "rabbitmqadmin": ("as shown when installed, else skipped",
                      "RabbitMQ's rabbitmqadmin comes from Debian's rabbitmq-server package (.ci/run fetches it)"),
}
TLS_FILES = {"/etc/brokerd/key.pem": "key.pem", "/etc/brokerd/cert.pem": "cert.pem"}  # made with trustme

EXPECTED_STATUS = {
    "brokerd-native --user bob --password nope get jobs": 1,  # the manual's example of a refused login
}

def reduced_form(command):
    for prefix, (form, reason) in REDUCED.items():
        if command.text.startswith(prefix):
            return form, reason
    return None


def free_listener_args(args):
    """A broker's arguments with every listener on a free loopback port (port 0)."""
    moved = []
    for arg in args:
        if re.match(r"^(tcp|ssl):\d+", arg):
            arg = re.sub(r"^(tcp|ssl):\d+", r"\1:0", arg)
            if "interface=" not in arg:
                arg += ":interface=127.0.0.1"
        moved.append(arg)
    for option in ("--amqp", "--native", "--http", "--prometheus"):
        if not any(arg == option or arg.startswith(option + "=") for arg in moved):
            moved += [option, "tcp:0:interface=127.0.0.1"]
    return moved


class Page:
    """What the commands of one page share: a working directory, an environment and a broker, started when needed."""

    def __init__(self, directory, tls_directory):
        self.directory = directory / "work"
        self.directory.mkdir()
        self.broker_directory = directory / "broker"
        self.broker_directory.mkdir()
        self.tls_directory = tls_directory
        self.env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
        for name in ("BROKERD_USER", "BROKERD_PASSWORD", "BROKERD_URL"):
            self.env.pop(name, None)
        self.broker = None
        self.etcd = None

    def shared_broker(self):
        if self.broker is None:
            self.broker = BrokerProcess(
                free_listener_args(["--data-dir", str(self.broker_directory / "data"), "--backend", "memory"]),
                cwd=self.broker_directory)
            self.broker.wait_listening("AMQP")
            self.env["BROKERD_URL"] = "http://{}:{}".format(*self.broker.wait_address("HTTP API"))
        return self.broker

    def close(self):
        if self.broker is not None:
            self.broker.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def run(self, command):
        words = command.words
        if words[0] == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = value
            return
        if words[0] == "etcd":
            self.etcd = EtcdProcess().start()
            return None
        if words[:3] == ["twistd", "-n", "brokerd"]:
            return self.start_and_stop(words[3:])
        reduced = reduced_form(command)
        if reduced is not None and reduced[0] == HELP_ONLY:
            return self.check_help(command)
        if words[0] == "rabbitmqadmin" and shutil.which("rabbitmqadmin", path=self.env["PATH"]) is None:
            return
        if words[0] == "python" and words[1:3] == ["-m", "sphinx"]:
            return
        text = command.text
        if words[:3] == ["python", "-m", "brokerd.proto.compile"]:
            text += f" --output-root {shlex.quote(str(self.directory / 'generated'))}"
        if words[0] in ("brokerd-admin", "brokerd-native", "curl", "rabbitmqadmin"):
            broker = self.shared_broker()
            host, http_port = broker.wait_address("HTTP API")
            text = text.replace("127.0.0.1:15672", f"{host}:{http_port}").replace("-P 15672", f"-P {http_port}")
            text = text.replace("127.0.0.1:15692", "{}:{}".format(*broker.wait_address("Prometheus metrics")))
            if words[0] == "brokerd-native":
                text = f"brokerd-native --connect {broker.wait_listening('native protocol')}" + text[len(words[0]):]
        result = subprocess.run(["bash", "-c", text], cwd=self.directory, env=self.env,
                                capture_output=True, text=True, timeout=COMMAND_SECONDS)
        printed = result.stdout + result.stderr
        expected = EXPECTED_STATUS.get(command.text, 0)
        assert result.returncode == expected, f"{command.text}: status {result.returncode}, not {expected}\n{printed}"
        for line in command.output:
            assert line in printed, f"{command.text}: the manual shows {line!r}; it printed:\n{printed}"

    def check_help(self, command):
        words = command.words
        program = shlex.split(command.text)
        program = program[:3] if program[0] == "python" else program[:1]
        result = subprocess.run([*program, "--help"], cwd=self.directory, env=self.env, capture_output=True,
                                text=True, timeout=COMMAND_SECONDS)
        assert result.returncode == 0, f"{command.text}: --help exited {result.returncode}\n{result.stderr}"
        for option in [word.partition("=")[0] for word in words if word.startswith("--")]:
            assert option in result.stdout, f"{command.text}: {option} is not in its --help"

    def start_and_stop(self, args):
        args = [with_tls_files(self.tls_directory, arg) for arg in args]
        if self.etcd is not None:
            args = [arg.replace("http://127.0.0.1:2379", self.etcd.url) for arg in args]
        broker = BrokerProcess(free_listener_args(args), cwd=self.directory, env=self.env)
        try:
            labels = ["AMQP over TLS"] if any(arg.startswith("ssl:") for arg in args) else ["AMQP"]
            for label in labels + ["HTTP API"]:
                broker.wait_listening(label)
        finally:
            status = broker.stop()
        assert status == 0, f"twistd -n brokerd {' '.join(args)} exited {status}:\n{broker.tail()}"


def with_tls_files(directory, arg):
    """C{arg} with the key and certificate paths the manual shows replaced by files made here."""
    for shown, made in TLS_FILES.items():
        arg = arg.replace(shown, str(directory / made))
    return arg


@pytest.fixture(scope="module")
def tls_directory(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    server = trustme.CA().issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(directory / "key.pem"))
    server.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
    return directory


@pytest.mark.parametrize("page", pages(), ids=lambda path: path.name)
def test_every_command_of_the_page_runs(page, tmp_path, tls_directory):
    commands = console_commands(page)
    runner = Page(tmp_path, tls_directory)
    try:
        for command in commands:
            runner.run(command)
    finally:
        runner.close()


def test_every_reduced_command_is_still_shown():
    """The reduced forms above name only commands the manual shows (none left over from an old page)."""
    shown = [command.text for path in pages() for command in console_commands(path)]
    for prefix in REDUCED:
        assert any(text.startswith(prefix) for text in shown), prefix
    for text in EXPECTED_STATUS:
        assert text in shown, text


def test_the_manual_shows_commands_only_in_console_blocks():
    """A command example outside a console block would escape these tests."""
    for path in sorted((ROOT / "docs").glob("*.rst")):
        text = path.read_text()
        assert ".. code:: sh" not in text and ".. code-block:: sh" not in text, path.name
        assert ".. code-block:: shell" not in text and ".. code-block:: bash" not in text, path.name
