"""Real ``twistd -n brokerd`` subprocesses, for the tests, the benchmarks and the
cross-backend validation runs (as Twisted ships C{twisted.internet.testing}).

L{BrokerProcess} starts the broker with the ``twistd`` script installed beside
this Python, as users start it, with AMQP on a free port and no Prometheus
metrics listener unless told otherwise;
a thread drains its output (so a chatty broker never blocks on a full pipe),
keeps every line, copies it to a log file if given one, and reads the ports the
broker says it listens on. L{native_cli} runs the native command line.

Only the standard library is imported here: this module ships with the broker.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

WAIT_SECONDS = 30.0  # default time for a broker to listen, print a line, or stop on SIGTERM
TAIL_LINES = 40  # lines of output L{BrokerProcess.tail} gives by default

LISTENING = re.compile(r"(?P<label>[\w ]+) listening on (?P<host>[^\s:]+):(?P<port>\d+)")


class BrokerFailed(AssertionError):
    """
    The broker exited, did not listen, print or stop in time; the message ends
    with its last lines. An AssertionError, so that a test reports it as a failure.
    """


def poll_until(found, timeout, what, interval=0.05):
    """
    Blocks until C{found()} gives something other than None and returns it,
    looking every C{interval} seconds: the one poll-with-a-deadline for
    waits on things that cannot signal (a port that starts listening, a line
    in another process's log). Raises AssertionError naming C{what} after
    C{timeout} seconds; C{found} may raise to end the wait early.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = found()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)


def twistd_command():
    """The twistd installed beside this interpreter, or the same program through C{-c}."""
    script = pathlib.Path(sys.executable).with_name("twistd")
    if script.exists():
        return [str(script)]
    return [
        sys.executable, "-c",
        "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()",
    ]


def parse_endpoint(endpoint):
    """
    C{(host, port)} of a C{tcp:HOST:PORT} endpoint string as
    L{BrokerProcess.wait_listening} gives it.
    """
    _, host, port = endpoint.split(":")
    return host, int(port)


class BrokerProcess:
    """
    A broker subprocess, running from construction until L{stop} or L{kill}.

    @ivar command: the full command line.
    @ivar process: the C{subprocess.Popen} of the current incarnation.
    @ivar output: every line the current incarnation printed so far (stdout
        and stderr together, without line ends).
    @ivar listening: listener label (C{"AMQP"}, C{"native protocol"}, C{"HTTP API"}) -> the
        client endpoint string C{tcp:HOST:PORT} it printed.
    """

    def __init__(self, args, cwd, env=None, twistd_args=(), log=None, pidfile=""):
        """
        @param args: the options of the brokerd subcommand; without an
            C{--amqp} option AMQP listens on a free loopback port, never on the
            shared default one; without C{--prometheus} there are no metrics, and
            the HTTP API listens on a free port without C{--http}.
        @param cwd: the directory it runs in.
        @param env: its environment (default: this process's).
        @param twistd_args: options of twistd itself (e.g. C{--profile=FILE}).
        @param log: an open text file that receives every line of every
            incarnation as it arrives (flushed when the broker exits).
        @param pidfile: twistd's C{--pidfile} (default none); None gives no
            C{--pidfile}, so the broker's default applies (in its data directory).
        """
        if not any(arg.startswith("--amqp") for arg in args):
            args = [*args, "--amqp", "tcp:0:interface=127.0.0.1"]
        if not any(arg.startswith("--prometheus") for arg in args):
            # Brokers run side by side: none takes the default port.
            args = [*args, "--prometheus", "none"]
        if not any(arg.startswith("--http") for arg in args):
            args = [*args, "--http", "tcp:0:interface=127.0.0.1"]
        pid_option = [] if pidfile is None else [f"--pidfile={pidfile}"]
        self.command = [*twistd_command(), *twistd_args, "-n", *pid_option, "brokerd", *args]
        self._cwd = cwd
        # Unbuffered: brokerd exits 0 on SIGTERM, but twistd ends by re-raising
        # SIGINT, and a SIGKILL ends it at once; either would drop buffered log lines.
        self._env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self._log = log
        self._changed = threading.Condition()
        self._start()

    def _start(self):
        self.output = []
        self.listening = {}
        self.process = subprocess.Popen(
            self.command, cwd=self._cwd, env=self._env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        self._reader = threading.Thread(
            target=self._drain, args=(self.process, self.output, self.listening), daemon=True,
            name="brokerd-output",
        )
        self._reader.start()

    def _drain(self, process, output, listening):
        for line in process.stdout:
            if self._log is not None:
                self._log.write(line)
            with self._changed:
                output.append(line.rstrip("\n"))
                match = LISTENING.search(line)
                if match:
                    listening[match["label"].strip()] = f"tcp:{match['host']}:{match['port']}"
                self._changed.notify_all()
        if self._log is not None:
            self._log.flush()
        # Its output ends a moment before it can be reaped: the waiters' last wake-up must
        # see it gone.
        try:
            process.wait(WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            pass  # it closed its output and lives on: the waiters' timeouts decide
        with self._changed:
            self._changed.notify_all()

    def _failed(self, what):
        return BrokerFailed(
            f"the broker ({' '.join(self.command)}) {what}; its last lines:\n{self.tail()}"
        )

    def wait_listening(self, label, timeout=WAIT_SECONDS):
        """The client endpoint string (C{tcp:HOST:PORT}) of listener C{label} once it is up."""
        with self._changed:
            self._changed.wait_for(
                lambda: label in self.listening or self.process.poll() is not None, timeout
            )
            if label in self.listening:
                return self.listening[label]
        if self.process.poll() is not None:
            raise self._failed(
                f"exited with status {self.process.returncode} before {label} listened"
            )
        raise self._failed(f"had no {label} listener after {timeout:.0f} s")

    def wait_address(self, label, timeout=WAIT_SECONDS):
        """C{(host, port)} of listener C{label} once it is up."""
        return parse_endpoint(self.wait_listening(label, timeout))

    def wait_for_output(self, pattern, timeout=WAIT_SECONDS):
        """The first output line matching regex C{pattern}, waiting for it if needed."""
        compiled = re.compile(pattern)

        def found():
            return next((line for line in self.output if compiled.search(line)), None)

        with self._changed:
            self._changed.wait_for(
                lambda: found() is not None or self.process.poll() is not None, timeout
            )
            line = found()
        if line is None:
            raise self._failed(f"printed no line matching {pattern!r}")
        return line

    def tail(self, lines=TAIL_LINES):
        """The last C{lines} lines of output, as one string."""
        with self._changed:
            return "\n".join(self.output[-lines:])

    def stop(self, timeout=WAIT_SECONDS):
        """
        SIGTERM, then wait; returns the exit status (SIGKILL and
        L{BrokerFailed} after C{timeout}).
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self._failed(f"did not stop within {timeout:.0f} s of SIGTERM") from None
        self._reader.join(timeout)
        return status

    def kill(self, timeout=WAIT_SECONDS):
        """
        SIGKILL: a crash, as far as the broker can tell; it gets no chance to
        flush or close anything.
        """
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout)
        self._reader.join(timeout)

    def restart(self, crash=False, timeout=WAIT_SECONDS):
        """
        Stop the broker (SIGTERM, or SIGKILL when C{crash}) and start the same
        command again; returns the old incarnation's exit status. L{output}
        and L{listening} then describe the new incarnation; the log file goes
        on receiving every line.
        """
        if crash:
            self.kill(timeout)
            status = self.process.returncode
        else:
            status = self.stop(timeout)
        self._start()
        return status


def native_cli(endpoint, *args, input=None, timeout=60):
    """Run ``python -m brokerd.native --connect ENDPOINT ARGS...``; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "brokerd.native", "--connect", endpoint, *args],
        input=input,
        capture_output=True,
        timeout=timeout,
    )
