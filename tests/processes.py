"""Real ``twistd brokerd`` subprocesses for tests and benchmarks.

The broker is started with the ``twistd`` script installed beside this Python
(as users start it) on port 0; the port it bound is read from its log.
A thread drains its output so a chatty broker never blocks on a full pipe.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading

def twistd_command():
    """The twistd installed beside this interpreter, or the same program through -c."""
    script = pathlib.Path(sys.executable).with_name("twistd")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"]


LISTENING = re.compile(r"(?P<label>[\w ]+) listening on (?P<host>[^\s:]+):(?P<port>\d+)")


class BrokerProcess:
    """
    A broker subprocess.

    @ivar output: every line it printed so far (stdout and stderr together).
    """

    def __init__(self, args, cwd, env=None, twistd_args=()):
        """C{args} go to the brokerd subcommand, C{twistd_args} to twistd itself (e.g. C{--profile=FILE})."""
        if not any(arg.startswith("--amqp") for arg in args):
            args = [*args, "--amqp", "tcp:0:interface=127.0.0.1"]  # never the shared default port in tests
        command = [*twistd_command(), *twistd_args, "-n", "--pidfile=", "brokerd", *args]
        self.command = command
        self.output = []
        self.listening = {}  # label -> "tcp:host:port"
        self._changed = threading.Condition()
        # Unbuffered: brokerd exits 0 on SIGTERM, but twistd ends by re-raising SIGINT, and a SIGKILL
        # ends it at once; either would drop buffered log lines.
        env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for line in self.process.stdout:
            with self._changed:
                self.output.append(line.rstrip("\n"))
                match = LISTENING.search(line)
                if match:
                    self.listening[match["label"].strip()] = f"tcp:{match['host']}:{match['port']}"
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_listening(self, label="native protocol", timeout=30):
        """The client endpoint string of listener C{label}, once it is up."""
        with self._changed:
            finished = self._changed.wait_for(
                lambda: label in self.listening or self.process.poll() is not None, timeout
            )
            if label in self.listening:
                return self.listening[label]
        state = "exited with %s" % self.process.returncode if finished else f"not listening after {timeout} s"
        raise AssertionError(f"broker {state}; its output:\n" + "\n".join(self.output))

    def wait_for_output(self, pattern, timeout=30):
        """The first output line matching regex C{pattern}, waiting for it if needed."""
        compiled = re.compile(pattern)

        def found():
            return next((line for line in self.output if compiled.search(line)), None)

        with self._changed:
            self._changed.wait_for(lambda: found() is not None or self.process.poll() is not None, timeout)
            line = found()
        if line is None:
            raise AssertionError(f"no output line matches {pattern!r}; output:\n" + "\n".join(self.output))
        return line

    def stop(self, timeout=30):
        """SIGTERM, then wait; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout)
        self._reader.join(timeout)
        return status

    def kill(self):
        """SIGKILL: a crash, as far as the broker can tell."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._reader.join(30)


def native_cli(endpoint, *args, input=None, timeout=60):
    """Run ``python -m brokerd.native --connect ENDPOINT ARGS...``; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "brokerd.native", "--connect", endpoint, *args],
        input=input,
        capture_output=True,
        timeout=timeout,
    )
