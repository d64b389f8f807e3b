"""A brokerd standing in for a reference broker (RabbitMQ, say) in the
validation's tests: it runs apart from the workload runner, detached from
whoever started it, on a fixed loopback port and data directory, so that a
restart command can SIGKILL it and start it again on the same port and data
directory, as ``docker restart -t 0 rabbit`` does to a RabbitMQ container::

    python -m tests.support.reference_broker restart STATE_DIR

STATE_DIR holds its settings (C{broker.json}: port and backend), C{data/},
C{broker.log} (every incarnation's output) and C{broker.pid} (the running
incarnation's process id).
"""

import json
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys

from brokerd.testing import poll_until, twistd_command

SETTINGS_FILE, PID_FILE, LOG_FILE = "broker.json", "broker.pid", "broker.log"
WAIT_SECONDS = 30.0  # for an incarnation to end after SIGKILL, or to listen
POLL_SECONDS = 0.02


def free_port():
    """A loopback port nothing listens on now: bound to port 0, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class DetachedBroker:
    """The broker of one state directory: its incarnations are started and killed by process id."""

    def __init__(self, state_dir):
        self.state_dir = pathlib.Path(state_dir)
        settings = json.loads((self.state_dir / SETTINGS_FILE).read_text())
        self.port, self.backend = settings["port"], settings["backend"]

    @classmethod
    def create(cls, state_dir, backend="sqlite"):
        """A new state directory for a broker on C{backend} and a free port (not started)."""
        state_dir = pathlib.Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / SETTINGS_FILE).write_text(json.dumps({"port": free_port(), "backend": backend}))
        return cls(state_dir)

    @property
    def url(self):
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def log(self):
        return self.state_dir / LOG_FILE

    def start(self):
        """Starts an incarnation in a session of its own, noting its process id; returns without waiting."""
        command = [*twistd_command(), "-n", "--pidfile=", "brokerd", f"--backend={self.backend}",
                   "--data-dir", str(self.state_dir / "data"), "--amqp", f"tcp:{self.port}:interface=127.0.0.1",
                   "--native", "none", "--http", "none", "--prometheus", "none"]
        with open(self.log, "a", encoding="utf-8") as log:
            process = subprocess.Popen(command, cwd=self.state_dir, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
        (self.state_dir / PID_FILE).write_text(str(process.pid))

    def kill(self):
        """SIGKILLs the running incarnation, if any, and waits until it is gone."""
        pid_file = self.state_dir / PID_FILE
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not _ended_within(pid, WAIT_SECONDS):
            raise RuntimeError(f"the reference broker {pid} did not end within {WAIT_SECONDS:.0f} s of SIGKILL")
        pid_file.unlink()

    def restart(self):
        self.kill()
        self.start()

    def wait_listening(self):
        """Returns once the port takes TCP connections; RuntimeError after L{WAIT_SECONDS}."""
        def listening():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return None

        try:
            poll_until(listening, WAIT_SECONDS, f"listener on port {self.port}", interval=POLL_SECONDS)
        except AssertionError as problem:
            raise RuntimeError(f"the reference broker: {problem}; its log:\n{self.log.read_text()[-3000:]}") from None


def _ended_within(pid, seconds):
    """Waits for process C{pid} (not necessarily our child) to end, on a pidfd that becomes readable when
    it does (a zombie has ended); whether it ended within C{seconds}."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        watcher = select.poll()
        watcher.register(pidfd, select.POLLIN)
        return bool(watcher.poll(seconds * 1000))
    finally:
        os.close(pidfd)


def main(argv=None):
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 2 or arguments[0] != "restart":
        print("usage: python -m tests.support.reference_broker restart STATE_DIR", file=sys.stderr)
        return 2
    DetachedBroker(arguments[1]).restart()
    print(f"restarted the reference broker of {arguments[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
