"""The broker a workload run plays against, one role (L{IBrokerUnderTest}) with
two implementations here, and a third, a three-node cluster, in
L{spark_jobs.cluster_broker}:

  - L{BrokerdProcess}: a ``twistd -n brokerd`` the runner starts on the run's
    data directory and a free port, SIGKILLs at each crash point and starts
    again on the same data directory, and stops cleanly at the end so that the
    export can open its store;
  - L{ExternalBroker}: an AMQP 0-9-1 broker that is already running (RabbitMQ,
    say), reached by an C{amqp://} URL (L{parse_amqp_url}). Each run starts and
    ends with the workload's queues and exchanges deleted from it; a crash point
    runs the restart command the user gave, then waits until the URL takes AMQP
    connections again; nothing of its store is exported.
"""

import os
import signal
import subprocess
import time
import urllib.parse
from dataclasses import dataclass

import pika
from zope.interface import Attribute, Interface, implementer

from brokerd.loadgen.process_cpu import cpu_seconds
from brokerd.testing import BrokerProcess
from spark_jobs.events import BACKEND_RUN, REFERENCE_RUN
from spark_jobs.plan import CONSUMED_QUEUE_PREFIX, EXCHANGE_PREFIX, PARKED_QUEUE_PREFIX
from spark_jobs.settings import EXCHANGE_TYPES

BROKER_START_TIMEOUT = 300.0  # seconds for a brokerd to recover its store and listen
BROKER_STOP_TIMEOUT = 120.0  # seconds for a clean stop (the store flushes and closes)
REACH_TIMEOUT = 30.0  # seconds a reference broker has to take a connection when the run starts
# Seconds for a reference's restart command, and again for the broker to take connections.
RESTART_TIMEOUT = 300.0
REACH_POLL = 0.2  # seconds between attempts to connect to a reference broker that is coming back
NOT_FOUND = 404  # the AMQP reply code of a passive declare of something that does not exist


class WorkloadFailed(RuntimeError):
    """The run could not complete: a client failed, the broker died, or the queues did not drain
    in time."""


class IBrokerUnderTest(Interface):
    """
    The broker of one workload run, through its incarnations: the runner
    starts it (L{start}), may crash it and start it again at each crash point
    (L{crash}, then L{start}), and ends the run with L{finish}. Every client
    connects to C{login}'s host and the port the latest L{start} returned.
    """

    kind = Attribute("What the run's run.json and summary call it: 'backend' (a brokerd the runner"
                     " starts), 'cluster' (three brokerd nodes the runner starts,"
                     " spark_jobs.cluster_broker) or 'reference' (a broker reached by URL).")
    login = Attribute("A dict of host, username, password and virtual_host: what clients and the"
                      " runner's admin connection log in with (the fields of"
                      " spark_jobs.clients.ClientConfig).")
    can_crash = Attribute("True when the runner can crash and restart it; without, crash points are"
                          " skipped.")

    def start(log):
        """
        Bring up the next incarnation and wait until it takes AMQP connections.

        @param log: the run's broker log, an open text file.
        @return: the AMQP port of the incarnation.
        @raise WorkloadFailed: it did not come up in time.
        """

    def crash():
        """End the current incarnation as a crash would (L{start} brings up the next one)."""

    def prepare(topology):
        """Before the workload's L{spark_jobs.plan.Topology} is declared on the first
        incarnation."""

    def finish(topology):
        """After the run: leave the broker as the run's end calls for (stopped cleanly, or
        cleared)."""

    def check():
        """Raise L{WorkloadFailed} when the current incarnation is known to be gone."""

    def abandon():
        """After a failure: leave running nothing that the runner started."""

    def tail():
        """The broker's last lines of output, for error messages; a sentence saying why when there
        are none."""

    def describe():
        """The run.json fields about the broker: C{kind} and what tells this broker apart."""

    def cpu_seconds():
        """CPU seconds the current incarnation (its threads and children) used so far; None when it
        cannot be read here (a broker on another machine) or the incarnation is gone."""


def connection_parameters(login, port, name, **options):
    """pika connection parameters for C{login} (see L{IBrokerUnderTest.login}) at C{port}, named
    C{name}."""
    return pika.ConnectionParameters(
        host=login["host"], port=port, virtual_host=login["virtual_host"],
        credentials=pika.PlainCredentials(login["username"], login["password"]),
        client_properties={"connection_name": name}, **options)


def broker_arguments(backend, data_dir):
    """The brokerd options of a workload's broker on C{data_dir}: AMQP on a free loopback port, no
    native listener."""
    return [f"--backend={backend}", "--data-dir", str(data_dir), "--amqp",
            "tcp:0:interface=127.0.0.1", "--native", "none"]


@implementer(IBrokerUnderTest)
class BrokerdProcess:
    """A ``twistd -n brokerd --backend=BACKEND`` on the run's data directory, on a free loopback
    port each start."""

    kind = BACKEND_RUN
    can_crash = True

    def __init__(self, backend, data_dir, cwd, label):
        self.backend = backend
        self.data_dir = data_dir
        self.cwd = cwd
        self.label = label
        self.login = {"host": "127.0.0.1", "username": "guest", "password": "guest",
                      "virtual_host": "/"}
        self.process = None
        self.stop_status = None

    def start(self, log):
        self.process = BrokerProcess(broker_arguments(self.backend, self.data_dir), self.cwd,
                                     log=log)
        _, port = self.process.wait_address("AMQP", BROKER_START_TIMEOUT)
        return port

    def crash(self):
        self.process.kill()

    def prepare(self, topology):
        """Nothing to do: a new data directory holds nothing."""

    def finish(self, topology):
        """A clean stop, so that the export can open the store."""
        status = self.process.stop(BROKER_STOP_TIMEOUT)
        if status not in (0, -signal.SIGTERM):
            raise WorkloadFailed(f"{self.label}: the broker stopped with status {status};"
                                 f" its last lines:\n{self.tail()}")
        self.stop_status = status

    def check(self):
        if self.process.process.poll() is not None:
            raise WorkloadFailed(f"{self.label}: the broker exited with status"
                                 f" {self.process.process.returncode};"
                                 f" its last lines:\n{self.tail()}")

    def abandon(self):
        if self.process is not None:
            self.process.kill()

    def tail(self):
        return self.process.tail() if self.process is not None else "(the broker was not started)"

    def describe(self):
        return {"kind": self.kind, "backend": self.backend, "broker_command": self.process.command,
                "broker_stop_status": self.stop_status}

    def cpu_seconds(self):
        return cpu_seconds(self.process.process.pid)


@dataclass(frozen=True)
class AmqpAddress:
    """Where an external broker takes AMQP connections and how to log in, as an C{amqp://} URL
    says."""

    url: str
    host: str
    port: int
    username: str
    password: str
    virtual_host: str

    @property
    def login(self):
        return {"host": self.host, "username": self.username, "password": self.password,
                "virtual_host": self.virtual_host}

    @property
    def masked_url(self):
        """The URL with its password replaced by C{****}, for run.json, the summary and messages."""
        parts = urllib.parse.urlsplit(self.url)
        if parts.password is None:
            return self.url
        user, _, host = parts.netloc.rpartition("@")
        name = user.split(":", 1)[0]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{name}:****@{host}"))


def parse_amqp_url(url):
    """
    C{amqp://USER:PASSWORD@HOST:PORT/VHOST} as an L{AmqpAddress}, read as
    C{pika.URLParameters} reads it: guest/guest, port 5672 and vhost C{/} by
    default; the vhost C{/} is C{%2F} (or an empty path).

    @raise ValueError: not an C{amqp://} URL with a host (C{amqps} is refused:
        the workload's clients do not speak TLS).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "amqp":
        raise ValueError(f"{url!r} is not an amqp:// URL (amqp://USER:PASSWORD@HOST:PORT/VHOST;"
                         " the workload's clients do not speak TLS, so amqps:// is not taken)")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host (amqp://USER:PASSWORD@HOST:PORT/VHOST)")
    try:
        parameters = pika.URLParameters(url)
    except (ValueError, IndexError, TypeError) as problem:
        raise ValueError(f"{url!r} is not a usable AMQP URL: {problem}") from None
    return AmqpAddress(url, parameters.host, parameters.port, parameters.credentials.username,
                       parameters.credentials.password, parameters.virtual_host)


def workload_names(topology, exists):
    """
    The queues and exchanges a workload run may have left on a broker: every
    workload exchange type's exchange, this topology's queues, and further
    C{wl.q<N>} and C{wl.parked<N>} while C{exists(queue)} finds them (a run
    with more queues left those; names are numbered from 0 without gaps).

    @return: C{(queues, exchanges)}.
    """
    queues = list(topology.all_queues)
    for prefix, count in ((CONSUMED_QUEUE_PREFIX, len(topology.queues)),
                          (PARKED_QUEUE_PREFIX, len(topology.parked))):
        while exists(f"{prefix}{count}"):
            queues.append(f"{prefix}{count}")
            count += 1
    return queues, [f"{EXCHANGE_PREFIX}{kind}" for kind in EXCHANGE_TYPES]


class _Deleter:
    """Deletes queues and exchanges that exist, on one connection, reopening its channel after a
    404."""

    def __init__(self, connection):
        self.connection = connection
        self.channel = connection.channel()
        self.deleted = []

    def _exists(self, declare):
        try:
            declare(self.channel)
            return True
        except pika.exceptions.ChannelClosedByBroker as closed:
            if closed.reply_code != NOT_FOUND:
                raise
            self.channel = self.connection.channel()
            return False

    def queue_exists(self, queue):
        return self._exists(lambda channel: channel.queue_declare(queue, passive=True))

    def delete_queue(self, queue):
        if self.queue_exists(queue):
            self.channel.queue_delete(queue)
            self.deleted.append(queue)

    def delete_exchange(self, exchange):
        if self._exists(lambda channel: channel.exchange_declare(exchange, passive=True)):
            self.channel.exchange_delete(exchange)
            self.deleted.append(exchange)


@implementer(IBrokerUnderTest)
class ExternalBroker:
    """
    An AMQP 0-9-1 broker already running, reached by URL. Its restart command
    (a shell command line, or None) crashes it and brings it back, as
    ``docker restart -t 0 rabbit`` does; the runner then waits until it takes
    connections again.
    """

    kind = REFERENCE_RUN

    def __init__(self, address, restart_command, label, reach_timeout=REACH_TIMEOUT,
                 restart_timeout=RESTART_TIMEOUT):
        self.address = address
        self.restart_command = restart_command
        self.label = label
        self.login = address.login
        self.reach_timeout = reach_timeout
        self.restart_timeout = restart_timeout
        self.log = None
        self.restarts = 0

    @property
    def can_crash(self):
        return self.restart_command is not None

    def start(self, log):
        self.log = log
        timeout = self.restart_timeout if self.restarts else self.reach_timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._connect(socket_timeout=5).close()
                return self.address.port
            except (pika.exceptions.ProbableAuthenticationError,
                    pika.exceptions.ProbableAccessDeniedError,
                    pika.exceptions.AuthenticationError) as refused:
                raise WorkloadFailed(f"{self.label}: {self.address.masked_url} refused the login:"
                                     f" {refused!r}") from None
            except pika.exceptions.AMQPError as problem:
                if time.monotonic() > deadline:
                    raise WorkloadFailed(f"{self.label}: {self.address.masked_url} took no AMQP"
                                         f" connection within {timeout:.0f} s:"
                                         f" {problem!r}") from None
            time.sleep(REACH_POLL)

    def crash(self):
        """Runs the restart command; its failure or a timeout fails the run with the command's
        output."""
        self.restarts += 1
        self.log.write(f"--- {self.label}: running the restart command: {self.restart_command}\n")
        self.log.flush()
        command = subprocess.Popen(self.restart_command, shell=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = command.communicate(timeout=self.restart_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(command.pid, signal.SIGKILL)  # its own session: the shell and what it started
            output, _ = command.communicate()
            self._log_output(output)
            raise WorkloadFailed(f"{self.label}: the restart command {self.restart_command!r}"
                                 f" did not end within {self.restart_timeout:.0f} s;"
                                 f" its output:\n{output.rstrip()}") from None
        self._log_output(output)
        if command.returncode != 0:
            raise WorkloadFailed(f"{self.label}: the restart command {self.restart_command!r}"
                                 f" exited with status {command.returncode};"
                                 f" its output:\n{output.rstrip()}")

    def _log_output(self, output):
        self.log.write(output if output.endswith("\n") or not output else output + "\n")
        self.log.flush()

    def prepare(self, topology):
        """Deletes what an earlier run left, so the run starts without old messages or
        declarations."""
        self._clear(topology, "before the run")

    def finish(self, topology):
        """Deletes the run's queues and exchanges: its parked queues would keep their messages on
        the broker."""
        self._clear(topology, "after the run")

    def _clear(self, topology, when):
        try:
            with self._connect() as connection:
                deleter = _Deleter(connection)
                queues, exchanges = workload_names(topology, deleter.queue_exists)
                for queue in queues:
                    deleter.delete_queue(queue)
                for exchange in exchanges:
                    deleter.delete_exchange(exchange)
        except pika.exceptions.AMQPError as problem:
            raise WorkloadFailed(f"{self.label}: deleting the workload's queues and exchanges"
                                 f" {when} failed: {problem!r}") from None
        if deleter.deleted:
            self.log.write(f"--- {self.label}: deleted {when}: {', '.join(deleter.deleted)}\n")
            self.log.flush()

    def _connect(self, **options):
        parameters = connection_parameters(self.login, self.address.port, "workload-runner",
                                           **options)
        return pika.BlockingConnection(parameters)

    def check(self):
        """Nothing to watch: a broker that stays away makes the clients fail."""

    def abandon(self):
        """Nothing was started here; the broker keeps running."""

    def tail(self):
        return f"(an external broker at {self.address.masked_url}: its output is not here)"

    def describe(self):
        return {"kind": self.kind, "url": self.address.masked_url,
                "restart_command": self.restart_command}

    def cpu_seconds(self):
        return None  # it may run anywhere; its CPU is not measured

