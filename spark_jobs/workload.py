"""The workload runner: plays one seeded workload against one backend through a
real ``twistd -n brokerd``, or against a reference broker already running
elsewhere (RabbitMQ, say), with real AMQP clients, and leaves the run directory
L{spark_jobs.events} describes (run.json, events/*.jsonl, data/, broker.log)::

    brokerd-workload --backend sqlite --out runs/sqlite --messages 100000 --crash-every 30000
    python -m spark_jobs.workload --reference amqp://guest:guest@127.0.0.1:5672/ \\
        --label rabbitmq --out runs/rabbitmq

The broker under test is one role (L{spark_jobs.brokers}): a brokerd gets its
own data directory and a free port; a reference is reached by its URL.
Publishers and consumers run in their own processes (L{spark_jobs.clients},
L{spark_jobs.client_processes});
with C{crash_every} the runner crashes the broker after every that many
publishes (SIGKILL for a brokerd, the reference's restart command for a
reference; a reference without one has no crashes) and goes on with its next
incarnation. Once the publishers are done it waits for the consumed queues to
drain, then stops a brokerd cleanly so the export can open its store, or
deletes the workload's queues and exchanges from a reference.
"""

import argparse
import json
import multiprocessing
import pathlib
import sys
import time

import pika

from brokerd.storage import registry
from spark_jobs import events
from spark_jobs.brokers import (
    BrokerdProcess,
    ExternalBroker,
    WorkloadFailed,
    connection_parameters,
    parse_amqp_url,
)
from spark_jobs.client_processes import ClientProcesses
from spark_jobs.cluster_broker import ClusterBrokerd
from spark_jobs.clients import ClientConfig
from spark_jobs.control import BROKER_NACKED, CONFIRMED, DELIVERED, PUBLISHED, RunControl
from spark_jobs.plan import build_topology, check_settings
from spark_jobs.progress import WorkloadCounts, summary_line, workload_meter
from spark_jobs.settings import WorkloadSettings, add_workload_arguments, settings_from_arguments

WATCH_INTERVAL = 0.1  # seconds between the runner's looks at its clients while they publish
DRAIN_POLL = 0.2  # seconds between looks at the consumed queues once publishing is over
DRAIN_STABLE_LOOKS = 3  # consecutive looks that must find the queues drained and nothing moving
CLIENT_START_TIMEOUT = 120.0  # seconds for every client process to start, connect and get ready
# Seconds without any publish, confirm or delivery before a run is declared stuck.
STALL_TIMEOUT = 300.0
NO_RESTART_NOTE = ("crash runs skipped: no --reference-restart command to crash and restart this"
                   " broker")


def default_label(backend):
    """The label a run's events carry by default: the backend's name without its options."""
    return backend.split(":", 1)[0]


def run_workload(backend, settings, run_dir, progress=None, label=None):
    """
    Play the workload C{settings} against backend C{backend} (a C{--backend}
    string, e.g. C{sqlite} or C{chunked:chunk_size=64M}) and write the run
    directory C{run_dir}; returns the contents of its run.json.

    @param progress: C{True} for progress on stderr (a line rewritten in place
        on a terminal, else a line every few seconds), a
        L{spark_jobs.progress.ProgressPrinter} to show it, a callable to
        receive plain lines instead, or C{None} for none.
    @param label: the C{backend} field of every event; the backend's name by default.
    @raise WorkloadFailed: the run could not complete; the broker and every
        client process are stopped by then.
    """
    if not isinstance(settings, WorkloadSettings):
        raise TypeError(f"settings must be a WorkloadSettings, not {type(settings).__name__}")
    check_settings(settings)
    _check_backend(backend)
    run_dir, label = pathlib.Path(run_dir), label or default_label(backend)
    broker = BrokerdProcess(backend, (run_dir / events.DATA_DIRECTORY).resolve(), run_dir, label)
    return _play(broker, settings, run_dir, label, progress)


def run_reference(url, settings, run_dir, label, restart_command=None, progress=None):
    """
    Play the workload C{settings} against the AMQP 0-9-1 broker at C{url}
    (C{amqp://USER:PASSWORD@HOST:PORT/VHOST}, already running) and write the
    run directory C{run_dir} (no data, no export); returns its run.json.

    The workload's queues and exchanges (C{wl.*}) are deleted from the broker
    before the run and after it. With C{settings.crash_every}, the shell
    command C{restart_command} crashes and restarts the broker at each crash
    point; without one the run has no crashes and run.json's C{notes} say so.

    @raise ValueError: C{url} is not an C{amqp://} URL.
    @raise WorkloadFailed: as L{run_workload}; also when the broker takes no
        connection, or the restart command fails.
    """
    if not isinstance(settings, WorkloadSettings):
        raise TypeError(f"settings must be a WorkloadSettings, not {type(settings).__name__}")
    check_settings(settings)
    broker = ExternalBroker(parse_amqp_url(url), restart_command, label)
    return _play(broker, settings, pathlib.Path(run_dir), label, progress)


def run_cluster(spec, settings, run_dir, progress=None):
    """
    Play the workload C{settings} against a three-node brokerd cluster
    (L{spark_jobs.cluster_broker.ClusterSpec} C{spec}: a backend per node) and
    write the run directory C{run_dir}, C{spec.label} being the events' label;
    each crash point SIGKILLs the leader. Returns its run.json.

    @raise WorkloadFailed: as L{run_workload}; also when etcd cannot start.
    """
    if not isinstance(settings, WorkloadSettings):
        raise TypeError(f"settings must be a WorkloadSettings, not {type(settings).__name__}")
    check_settings(settings)
    for backend in spec.backends:
        _check_backend(backend)
    run_dir = pathlib.Path(run_dir)
    broker = ClusterBrokerd(spec, (run_dir / events.DATA_DIRECTORY).resolve(), run_dir)
    return _play(broker, settings, run_dir, spec.label, progress)


def _play(broker, settings, run_dir, label, progress):
    """One run against C{broker}, showing its progress as L{run_workload} says."""
    meter = workload_meter(progress, label, settings.messages)
    try:
        return _Run(broker, settings, run_dir, label, meter).play()
    finally:
        if meter:
            meter.close()


def declare_topology(channel, topology):
    """Declare C{topology}'s durable exchanges, queues and bindings on a pika BlockingChannel."""
    for exchange, kind in topology.exchanges.items():
        channel.exchange_declare(exchange, kind, durable=True)
    for queue in topology.all_queues:
        channel.queue_declare(queue, durable=True,
                              arguments=topology.queue_arguments[queue] or None)
    for binding in topology.bindings:
        channel.queue_bind(binding.queue, binding.exchange, binding.routing_key,
                           arguments=binding.arguments or None)


def _check_backend(backend):
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"backend must be a backend string such as 'sqlite', not {backend!r}")
    try:
        name, _ = registry.split_backend_string(backend)
    except registry.BackendError as problem:
        raise ValueError(str(problem)) from None
    known = registry.available_backends()
    if name not in known:
        raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(known) or 'none'}")


class _Run:
    """One run of the workload: the broker's incarnations (an
    L{IBrokerUnderTest<spark_jobs.brokers.IBrokerUnderTest>}), the client processes
    (L{ClientProcesses}) and what they did."""

    def __init__(self, broker, settings, run_dir, label, say):
        self.settings = settings
        self.run_dir = run_dir
        self.label = label
        self.say = say
        self.topology = build_topology(settings)
        self.data_dir = run_dir / events.DATA_DIRECTORY
        self.events_dir = run_dir / events.EVENTS_DIRECTORY
        context = multiprocessing.get_context("spawn")
        self.control = RunControl(context, settings.publishers + settings.consumers)
        self.clients = ClientProcesses(context, self.control, label)
        self.broker = broker
        self.broker_log = None
        self.epoch = -1
        self.epochs = []
        self.crashes = []
        self.started = None
        self.workload_started = None  # the gate opened: every client was ready
        self.workload_ended = None  # the consumed queues were drained
        # The current incarnation's CPU seconds when the workload began (0 after a restart).
        self.broker_cpu_from = 0.0
        # CPU seconds of the incarnations before the current one, during the workload.
        self.broker_cpu_used = 0.0

    # -- the run

    def play(self):
        self._prepare_directory()
        self.started = time.time()
        self.broker_log = open(self.run_dir / events.BROKER_LOG, "a", encoding="utf-8")
        try:
            self._start_broker()
            self.broker.prepare(self.topology)
            self._declare_topology()
            self._start_clients()
            self._publish_phase()
            drain_seconds = self._drain_phase()
            self.workload_ended = time.time()
            self._add_broker_cpu()
            self.clients.stop_consumers()
            self._check_clients()
            self.broker.finish(self.topology)
        except BaseException:
            self._abandon()
            raise
        finally:
            self.broker_log.close()
        ended = time.time()
        result = self._describe(ended, drain_seconds)
        (self.run_dir / events.RUN_FILE).write_text(json.dumps(result, indent=2) + "\n",
                                                    encoding="utf-8")
        if self.say:
            self.say(self._progress_line(final=True))
        return result

    def _prepare_directory(self):
        if (self.run_dir / events.RUN_FILE).exists() or any(self.events_dir.glob("*.jsonl")) or (
                self.data_dir.exists() and any(self.data_dir.iterdir())):
            raise ValueError(f"run directory {self.run_dir} already holds a run;"
                             f" give an empty or new directory")
        self.events_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def _start_broker(self):
        self.epoch += 1
        began = time.time()
        self.broker_log.write(f"--- {self.label} epoch {self.epoch} starting at {began:.6f}\n")
        self.broker_log.flush()
        port = self.broker.start(self.broker_log)
        self.epochs.append({"epoch": self.epoch, "port": port, "started": began,
                            "listening_seconds": time.time() - began})
        self.control.set_broker(self.epoch, port)

    def _declare_topology(self):
        try:
            with self._admin_connection() as connection:
                declare_topology(connection.channel(), self.topology)
        except pika.exceptions.AMQPError as problem:
            raise WorkloadFailed(f"{self.label}: declaring the workload's exchanges and queues"
                                 f" failed: {problem!r}") from None

    def _admin_connection(self):
        parameters = connection_parameters(self.broker.login, self.epochs[-1]["port"],
                                           "workload-runner", connection_attempts=3,
                                           retry_delay=0.2)
        return pika.BlockingConnection(parameters)

    def _start_clients(self):
        """Start every client process and open the gate once all of them are connected and
        ready."""
        config = ClientConfig(self.label, self.settings.to_json(), str(self.events_dir),
                              **self.broker.login)
        self.clients.start(config, self.settings)
        deadline = time.monotonic() + CLIENT_START_TIMEOUT
        while not self.control.all_ready.wait(WATCH_INTERVAL):
            self._check_clients()
            if time.monotonic() > deadline:
                raise WorkloadFailed(f"{self.label}: only {self.control.ready_clients}"
                                     f" of {self.control.clients} clients were ready"
                                     f" after {CLIENT_START_TIMEOUT:.0f} s")
        self.workload_started = time.time()
        self.broker_cpu_from = self._broker_cpu()
        self.control.open_gate(self._next_limit())

    def _next_limit(self):
        """The publish count of the next crash, or every message when no crash is left (or the
        broker cannot crash)."""
        every = self.settings.crash_every if self.broker.can_crash else 0
        if not every:
            return self.settings.messages
        return min((self.control.published_total // every + 1) * every, self.settings.messages)

    def _publish_phase(self):
        """Watch the publishers to their end, crashing the broker at each boundary of the gate."""
        moved, last_counts = time.monotonic(), None
        while self.clients.publishing():
            if self.control.published_total < self.settings.messages:
                if self.control.gate_reached.wait(WATCH_INTERVAL) and \
                        self.control.published_total < self.settings.messages:
                    self._crash()
            else:
                # Every publish made (the gate stays reached): wait for a publisher to end, not
                # spin.
                self.clients.wait_for_a_publisher(WATCH_INTERVAL)
            self._check_clients()
            self._maybe_progress()
            counts = tuple(self.control.total(counter)
                           for counter in (PUBLISHED, CONFIRMED, BROKER_NACKED, DELIVERED))
            if counts != last_counts:
                moved, last_counts = time.monotonic(), counts
            elif time.monotonic() - moved > STALL_TIMEOUT:
                raise WorkloadFailed(f"{self.label}: nothing was published, confirmed or delivered"
                                     f" for {STALL_TIMEOUT:.0f} s ({self._progress_line()});"
                                     f" is the broker blocking publishers (memory watermark)"
                                     f" or stuck? Its last lines:\n{self.broker.tail()}")
        self._check_clients()

    def _crash(self):
        published = self.control.published_total
        self._add_broker_cpu()
        killed_at = time.time()
        # No address until the next incarnation takes connections.
        self.control.set_broker(self.epoch, 0)
        self.broker.crash()
        self.crashes.append({"epoch": self.epoch, "t": killed_at, "published_before": published})
        self._start_broker()
        self.control.open_gate(self._next_limit())

    def _broker_cpu(self):
        """CPU seconds the current broker incarnation used so far; None when it cannot be read (see
        L{spark_jobs.brokers.IBrokerUnderTest.cpu_seconds})."""
        return self.broker.cpu_seconds()

    def _add_broker_cpu(self):
        """Counts the current incarnation's CPU during the workload (before it is killed or
        stopped)."""
        used = self._broker_cpu()
        if used is None or self.broker_cpu_from is None or self.broker_cpu_used is None:
            # Not measurable, or it died unseen: a figure would be short.
            self.broker_cpu_used = None
        else:
            self.broker_cpu_used += used - self.broker_cpu_from
        self.broker_cpu_from = 0.0

    def _check_clients(self):
        """@raise WorkloadFailed: a client process or the broker failed."""
        self.clients.check()
        self.broker.check()

    def _drain_phase(self):
        """Wait until every message in the consumed queues was settled for good; returns the
        seconds it took."""
        if not self.settings.consumers:
            return 0.0
        try:
            return self._wait_drained()
        except pika.exceptions.AMQPError as problem:
            raise WorkloadFailed(f"{self.label}: looking at the consumed queues failed:"
                                 f" {problem!r}") from None

    def _wait_drained(self):
        began = time.monotonic()
        deadline = began + 60.0 + 2 * (time.time() - self.started)
        stable, last = 0, None
        with self._admin_connection() as connection:
            channel = connection.channel()
            while True:
                ready = sum(channel.queue_declare(queue, passive=True).method.message_count
                            for queue in self.topology.queues)
                delivered = self.control.total(DELIVERED)
                settled = sum(self.control.counters(row)[name]
                              for row in range(self.control.clients)
                              for name in ("acked", "nacked", "rejected"))
                state = (ready, delivered, settled)
                stable = stable + 1 if ready == 0 and delivered == settled and state == last else 0
                last = state
                if stable >= DRAIN_STABLE_LOOKS - 1:
                    return time.monotonic() - began
                self._check_clients()
                self._maybe_progress()
                if time.monotonic() > deadline:
                    raise WorkloadFailed(
                        f"{self.label}: the consumed queues did not drain"
                        f" within {deadline - began:.0f} s:"
                        f" {ready} messages ready, {delivered} delivered, {settled} settled")
                connection.sleep(DRAIN_POLL)

    def _abandon(self):
        """After a failure: end every client process and the broker, so nothing outlives the run."""
        self.clients.abandon()
        self.broker.abandon()

    # -- what it says

    def _maybe_progress(self):
        """Hands the meter the current counts; it decides whether a line is due."""
        if self.say:
            self.say.update(self._progress_counts())

    def _progress_counts(self):
        """The run's counters now, summed over its clients."""
        return WorkloadCounts(self.control.total(PUBLISHED), self.control.total(CONFIRMED),
                              self.control.total(DELIVERED), len(self.crashes))

    def _progress_line(self, final=False):
        """The run's counts and mean publish rate so far (C{final}: the line a finished run
        leaves)."""
        elapsed = (self.workload_ended or time.time()) - (self.workload_started or self.started)
        return summary_line(self.label, self._progress_counts(), self.settings.messages, elapsed,
                            done=final)

    def _describe(self, ended, drain_seconds):
        clients = self.clients.counters()
        client_cpu_ms = sum(client["cpu_ms"] for client in clients.values())
        notes = [NO_RESTART_NOTE] if self.settings.crash_every and not self.broker.can_crash else []
        return {
            **self.broker.describe(),
            "label": self.label,
            "notes": notes,
            "seed": self.settings.seed,
            "settings": self.settings.to_json(),
            "started": self.started,
            "ended": ended,
            "workload_started": self.workload_started,
            "workload_ended": self.workload_ended,
            "wall_seconds": self.workload_ended - self.workload_started,
            "drain_seconds": drain_seconds,
            "crashes": self.crashes,
            "epochs": self.epochs,
            "topology": self.topology.to_json(),
            "ports": {"amqp": [epoch["port"] for epoch in self.epochs]},
            "clients": clients,
            "cpu": {
                "broker_seconds": (None if self.broker_cpu_used is None
                                   else round(self.broker_cpu_used, 3)),
                "client_seconds": round(client_cpu_ms / 1000, 3),
                "wall_seconds": round(self.workload_ended - self.workload_started, 3),
            },
        }


PROGRAM = "brokerd-workload"  # the console script; python -m spark_jobs.workload runs the same


def build_parser(prog=PROGRAM):
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Play one seeded workload against one brokerd backend, or a reference AMQP"
                    " broker already running, and write its run directory.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--backend", help="backend string as twistd brokerd --backend takes it")
    target.add_argument("--reference", metavar="URL",
                        help="amqp://USER:PASSWORD@HOST:PORT/VHOST of a running broker to play"
                             " against instead")
    parser.add_argument("--reference-restart", metavar="COMMAND",
                        help="shell command that crashes and restarts the --reference broker at"
                             " each crash point (without one, --crash-every does not apply to it)")
    parser.add_argument("--out", required=True, help="the run directory to write (empty or new)")
    parser.add_argument("--label",
                        help="the backend label events carry (default: the backend's name, or"
                             " 'reference')")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress line on stderr every few seconds (default: when stderr"
                             " is a terminal)")
    add_workload_arguments(parser)
    return parser


def main(argv=None, prog=PROGRAM):
    """Play one workload as C{prog} (the name its usage lines give); the exit status."""
    parser = build_parser(prog)
    arguments = parser.parse_args(argv)
    if arguments.reference_restart is not None and arguments.reference is None:
        parser.error("--reference-restart restarts a --reference broker; there is none")
    progress = sys.stderr.isatty() if arguments.progress is None else arguments.progress
    settings = settings_from_arguments(arguments)
    try:
        if arguments.reference is not None:
            result = run_reference(arguments.reference, settings, arguments.out,
                                   arguments.label or "reference",
                                   restart_command=arguments.reference_restart,
                                   progress=progress or None)
        else:
            result = run_workload(arguments.backend, settings, arguments.out,
                                  progress=progress or None, label=arguments.label)
    except (WorkloadFailed, ValueError) as problem:
        print(f"workload: {problem}", file=sys.stderr)
        return 1
    names = ("published", "confirmed", "nacked_by_broker", "delivered", "acked", "nacked",
             "rejected")
    counts = {name: sum(client[name] for client in result["clients"].values()) for name in names}
    print(json.dumps({"run_dir": str(arguments.out),
                      "wall_seconds": round(result["wall_seconds"], 3),
                      "crashes": len(result["crashes"]), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m spark_jobs.workload"))
