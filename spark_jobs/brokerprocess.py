"""One ``twistd -n brokerd`` subprocess of a workload run: started on a data
directory with the AMQP listener on a free port, its output appended to the
run's broker log, stopped with SIGTERM or killed with SIGKILL.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading

AMQP_LISTENING = re.compile(r"AMQP listening on (?P<host>[^\s:]+):(?P<port>\d+)")
START_TIMEOUT = 300.0  # seconds for a broker to recover its store and listen
STOP_TIMEOUT = 120.0  # seconds for a clean stop (the store flushes and closes)


class BrokerFailed(RuntimeError):
    """The broker exited or did not listen in time; the message ends with its last log lines."""


def twistd_command():
    """The twistd installed beside this interpreter, or the same program through C{-c}."""
    script = pathlib.Path(sys.executable).with_name("twistd")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"]


def broker_command(backend, data_dir):
    """The command line of a broker on C{data_dir}: AMQP on a free loopback port, no native listener."""
    return [*twistd_command(), "-n", "--pidfile=", "brokerd", f"--backend={backend}", "--data-dir", str(data_dir),
            "--amqp", "tcp:0:interface=127.0.0.1", "--native", "none"]


class BrokerProcess:
    """
    A running broker. A thread copies its output line by line to C{log} (an
    open text file shared by every incarnation of a run) and watches for the
    line that names the AMQP port.

    @ivar port: the AMQP port, once L{wait_listening} returned.
    """

    def __init__(self, command, cwd, log):
        self.command = command
        self.port = None
        self._log = log
        self._tail = []
        self._changed = threading.Condition()
        # Unbuffered: brokerd exits 0 on SIGTERM, but twistd ends by re-raising SIGINT, and a SIGKILL
        # ends it at once; either would drop buffered log lines.
        self.process = subprocess.Popen(command, cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._drain, daemon=True, name="broker-output")
        self._reader.start()

    def _drain(self):
        for line in self.process.stdout:
            self._log.write(line)
            with self._changed:
                self._tail = (self._tail + [line.rstrip("\n")])[-40:]
                match = AMQP_LISTENING.search(line)
                if match and self.port is None:
                    self.port = int(match["port"])
                self._changed.notify_all()
        self._log.flush()
        with self._changed:
            self._changed.notify_all()

    def wait_listening(self, timeout=START_TIMEOUT):
        """The AMQP port, once the broker listens; L{BrokerFailed} if it exits or takes too long."""
        with self._changed:
            self._changed.wait_for(lambda: self.port is not None or self.process.poll() is not None, timeout)
            if self.port is not None:
                return self.port
        state = f"exited with status {self.process.poll()}" if self.process.poll() is not None else \
            f"did not listen within {timeout:.0f} s"
        raise BrokerFailed(f"the broker ({' '.join(self.command)}) {state}; its last lines:\n{self.tail()}")

    def tail(self):
        with self._changed:
            return "\n".join(self._tail)

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM, then wait; returns the exit status (SIGKILL and L{BrokerFailed} after C{timeout})."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BrokerFailed(f"the broker did not stop within {timeout:.0f} s of SIGTERM; its last lines:\n"
                               f"{self.tail()}") from None
        self._reader.join(timeout)
        return status

    def kill(self):
        """SIGKILL, as a crash: the broker gets no chance to flush or close anything."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT)
        self._reader.join(STOP_TIMEOUT)
