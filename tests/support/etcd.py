"""A private etcd for tests: Debian's etcd-server on loopback, on free ports, its own data directory,
waited for until healthy, killed at the end; restartable on the same data directory and ports."""

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request

import pytest
from twisted.internet import defer, task

from brokerd.testing import poll_until

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
needs_etcd = pytest.mark.skipif(ETCD is None, reason="etcd (Debian's etcd-server) is not installed here")
START_SECONDS = 30.0
PORT_ATTEMPTS = 5


def free_port():
    """A loopback port nothing listens on right now (etcd cannot be told port 0): another process
    may take it before etcd does, which L{EtcdProcess} answers by trying other ports."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class EtcdProcess:
    """
    One etcd member, running from L{start} until L{kill} or L{stop}.

    @ivar url: its client URL, C{http://127.0.0.1:PORT}.
    @ivar data_dir: its data directory, kept across L{restart}s, removed by L{stop}.
    """

    def __init__(self, tls=None):
        """
        @param tls: None for plain HTTP, or (certificate chain file, key file, CA file) to serve its
            clients over TLS only (the CA file is what the health check trusts).
        """
        self._tls = tls
        self._root = tempfile.mkdtemp(prefix="brokerd-etcd-")
        self.data_dir = os.path.join(self._root, "data")
        self._log_path = os.path.join(self._root, "etcd.log")
        self.process = None
        self.url = None

    def start(self):
        """Starts etcd on free ports (other ones when they were taken meanwhile) and waits for its
        health; returns self."""
        for _ in range(PORT_ATTEMPTS):
            self._ports = (free_port(), free_port())
            if self._launch():
                return self
        raise AssertionError(f"etcd found no free ports in {PORT_ATTEMPTS} attempts:\n{self.tail()}")

    def restart(self):
        """Starts it again on the same data directory and ports (after L{kill} or L{stop})."""
        if not self._launch():
            raise AssertionError(f"etcd could not take its ports again:\n{self.tail()}")
        return self

    def _launch(self):
        client, peer = self._ports
        self.url = f"{'https' if self._tls else 'http'}://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        command = [
            ETCD, "--name", "test", "--data-dir", self.data_dir,
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}", "--log-level", "warn",
        ]
        if self._tls:
            command += ["--cert-file", self._tls[0], "--key-file", self._tls[1]]
        with open(self._log_path, "ab") as log:
            log.write(f"--- {' '.join(command)}\n".encode())
            self._log_start = log.tell()
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            poll_until(self._healthy, START_SECONDS, f"healthy etcd at {self.url}")
        except PortTaken:
            return False
        except AssertionError as error:
            self.kill()
            raise AssertionError(f"{error}; its last lines:\n{self.tail()}") from None
        return True

    def _healthy(self):
        if self.process.poll() is not None:
            if "address already in use" in self.tail():
                raise PortTaken()
            raise AssertionError(f"etcd exited with status {self.process.returncode}:\n{self.tail()}")
        try:
            context = ssl.create_default_context(cafile=self._tls[2]) if self._tls else None
            # The test certificates name localhost; the URL names the address.
            health = self.url.replace("127.0.0.1", "localhost") if self._tls else self.url
            with urllib.request.urlopen(health + "/health", timeout=1, context=context) as answer:
                return True if json.load(answer).get("health") == "true" else None
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def tail(self, lines=20):
        with open(self._log_path, "rb") as log:
            log.seek(getattr(self, "_log_start", 0))
            return "\n".join(log.read().decode("utf-8", "replace").splitlines()[-lines:])

    def kill(self):
        """SIGKILL, and waits for it to be gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(START_SECONDS)

    def pause(self):
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self):
        """Ends it (SIGCONT first, should it be paused) and removes its files."""
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self._root, ignore_errors=True)


class PortTaken(Exception):
    """etcd exited because a port was taken between choosing it and binding it."""


def start_etcd(testcase):
    """An L{EtcdProcess} started for C{testcase} and stopped at its cleanup."""
    etcd = EtcdProcess()
    testcase.addCleanup(etcd.stop)
    return etcd.start()


def connections_to(url):
    """The sockets of this process's reactor connected to C{url}'s port: a test waits for them to be
    gone (a TLS connection takes a few turns of the reactor to close) before trial checks it is clean."""
    from twisted.internet import reactor

    port = int(url.rpartition(":")[2])
    return [selectable for selectable in set(reactor.getReaders()) | set(reactor.getWriters())
            if getattr(getattr(selectable, "getPeer", lambda: None)(), "port", None) == port]


@defer.inlineCallbacks
def eventually(read, predicate, timeout=10.0, interval=0.1):
    """Calls C{read()} (a Deferred) every C{interval} seconds until C{predicate} holds for what it gave,
    and gives that; fails after C{timeout} seconds. One read at a time, none left running."""
    from twisted.internet import reactor

    deadline = reactor.seconds() + timeout
    while True:
        value = yield read()
        if predicate(value):
            return value
        if reactor.seconds() > deadline:
            raise AssertionError(f"not so within {timeout} s: {value!r}")
        yield task.deferLater(reactor, interval, lambda: None)

