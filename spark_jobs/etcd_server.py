"""A private etcd for a cluster run (L{spark_jobs.cluster_broker}): Debian's ``etcd`` binary
on free loopback ports with its own data directory, waited for until healthy, stopped at the
end of the run. One member is enough: the run tests brokerd's failover, not etcd's.
"""

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

START_SECONDS = 30.0  # for etcd to answer its health check
STOP_SECONDS = 10.0  # for etcd to end on SIGTERM before it is killed
PORT_ATTEMPTS = 5  # a port chosen free may be taken before etcd binds it: try others
HEALTH_POLL = 0.1  # seconds between health checks while etcd starts
INSTALL_HINT = "install etcd (Debian: apt-get install etcd-server)"


class EtcdFailed(RuntimeError):
    """etcd is not installed, did not start, or exited; the text says which, with its last
    lines."""


def free_port():
    """A loopback port nothing listens on right now (another process may take it before its
    user binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def etcd_command():
    """The path of the etcd binary; None when none is installed."""
    return shutil.which("etcd") or shutil.which("etcd", path="/usr/bin:/usr/sbin")


class EtcdServer:
    """
    One etcd member in C{directory} (its data and its log, C{etcd.log}), running from
    L{start} until L{stop}.

    @ivar url: its client URL, C{http://127.0.0.1:PORT}, once started.
    """

    def __init__(self, directory):
        self.directory = directory
        self.url = None
        self.process = None
        self._log_path = directory / "etcd.log"

    def start(self):
        """Starts etcd on free ports (others when one was taken meanwhile) and waits for its
        health; returns its URL.

        @raise EtcdFailed: no etcd here, or it did not become healthy.
        """
        binary = etcd_command()
        if binary is None:
            raise EtcdFailed(f"a cluster run needs etcd, and none is installed: {INSTALL_HINT}")
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(PORT_ATTEMPTS):
            if self._launch(binary, free_port(), free_port()):
                return self.url
        raise EtcdFailed(f"etcd found no free ports in {PORT_ATTEMPTS} attempts;"
                         f" its last lines:\n{self.tail()}")

    def _launch(self, binary, client, peer):
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        command = [binary, "--name", "validation", "--data-dir", str(self.directory / "data"),
                   "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                   "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                   "--initial-cluster", f"validation={peer_url}", "--log-level", "warn"]
        with open(self._log_path, "ab") as log:
            log.write(f"--- {' '.join(command)}\n".encode())
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_SECONDS
        while not self._healthy():
            if self.process.poll() is not None:
                if "address already in use" in self.tail():
                    return False
                raise EtcdFailed(f"etcd exited with status {self.process.returncode};"
                                 f" its last lines:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise EtcdFailed(f"etcd at {self.url} was not healthy within"
                                 f" {START_SECONDS:.0f} s; its last lines:\n{self.tail()}")
            time.sleep(HEALTH_POLL)
        return True

    def _healthy(self):
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as answer:
                return json.load(answer).get("health") == "true"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def tail(self, lines=20):
        """The last C{lines} lines of its log."""
        try:
            text = self._log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no etcd log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self):
        """SIGTERM, then SIGKILL if it does not end in time; its data directory is kept."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_SECONDS)
