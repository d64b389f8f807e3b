"""The command line of the cross-backend validation (L{spark_jobs.validate_backends}):
its options, and the checks that refuse a bad one before anything runs. Each
backend must be registered and durable and take the options given
(L{parse_backends}); each reference needs a plain name and an C{amqp://} URL,
and a restart command must name one (L{parse_references}); each cluster one or
three durable backends and a label of its own (L{parse_clusters});
C{--reuse-runs} needs every run already there, of the kind the command line
makes it, and C{--keep-exports} each backend or cluster run's export. A
refused command line exits with status 2, as argparse's own errors do.
"""

import argparse
import json
import pathlib
import re
import tempfile

from twisted.internet.task import Clock

from brokerd.storage.registry import BackendError, make_store, split_backend_string
from spark_jobs import events
from spark_jobs.brokers import parse_amqp_url
from spark_jobs.cluster_broker import DEFAULT_LEASE_TTL, DEFAULT_MIN_ISR, ClusterSpec
from spark_jobs.cluster_broker import NODES as CLUSTER_NODES
from spark_jobs.etcd_server import INSTALL_HINT, etcd_command
from spark_jobs.settings import add_workload_arguments

DEFAULT_BACKENDS = "sqlite,filelog,chunked"
REFERENCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def durable_backend(item):
    """
    The name of backend string C{item}, once it is known to be registered, durable and given
    only options it has, with values it takes.

    @raise BackendError: naming the problem.
    """
    name, _ = split_backend_string(item)
    with tempfile.TemporaryDirectory() as scratch:
        # Built, never opened (a Clock stands in for the reactor): checks the name, options
        # and values.
        store = make_store(item, scratch, reactor=Clock())
    if not store.durable:
        raise BackendError(f"backend {name!r} keeps nothing on disk, so there is no store to"
                           " export and check after the run; pick durable backends")
    return name


def parse_backends(text):
    """
    C{"sqlite,chunked:chunk_size=1M"} ->
    C{[("sqlite", "sqlite"), ("chunked", "chunked:chunk_size=1M")]}: (label, backend string)
    pairs, each backend registered, durable, and given only options it has, with values it takes.

    @raise BackendError: naming the item at fault.
    """
    items = [item.strip() for item in text.split(",")]
    if not any(items) or not all(items):
        raise BackendError(f"--backends needs comma-separated backend names, not {text!r}")
    pairs = [(durable_backend(item), item) for item in items]
    labels = [label for label, _ in pairs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise BackendError(f"backend {repeated[0]!r} is given twice in --backends;"
                           f" each run needs its own label")
    return pairs


class Reference:
    """A C{--reference NAME=URL}: its label, the URL, and its C{--reference-restart} command
    (None without)."""

    def __init__(self, label, url, restart_command=None):
        self.label = label
        self.url = url
        self.restart_command = restart_command


def _name_and_value(item, option, value_name):
    name, equals, value = item.partition("=")
    name, value = name.strip(), value.strip()
    if not equals or not name or not value:
        raise ValueError(f"{option} takes NAME={value_name}, not {item!r}")
    return name, value


def parse_references(references, restarts, backend_labels):
    """
    The C{--reference NAME=URL} items as L{Reference}s, each given its
    C{--reference-restart NAME=COMMAND} (the text after the first C{=} is the
    shell command, spaces and all).

    @raise ValueError: naming the item at fault: not NAME=URL, a name that is
        not a plain label or clashes with a backend's or another reference's,
        a URL that is not C{amqp://...}, a restart command for no reference or
        two for one.
    """
    found = {}
    for item in references:
        name, url = _name_and_value(item, "--reference", "URL")
        if not REFERENCE_NAME.fullmatch(name):
            raise ValueError(f"--reference name {name!r} must be letters, digits, '.', '_' or '-'"
                             " (it names the run directory)")
        if name in backend_labels:
            raise ValueError(f"--reference name {name!r} is also a backend in --backends;"
                             " each run needs its own label")
        if name in found:
            raise ValueError(f"--reference {name!r} is given twice; each run needs its own label")
        parse_amqp_url(url)
        found[name] = Reference(name, url)
    for item in restarts:
        name, command = _name_and_value(item, "--reference-restart", "COMMAND")
        if name not in found:
            raise ValueError(f"--reference-restart {name!r} names no --reference"
                             f" (references: {', '.join(found) or 'none'})")
        if found[name].restart_command is not None:
            raise ValueError(f"--reference-restart {name!r} is given twice")
        found[name].restart_command = command
    return list(found.values())


def parse_clusters(items, lease_ttl, min_isr, taken):
    """
    The C{--cluster [NAME=]BACKEND[,BACKEND,BACKEND]} items as
    L{ClusterSpec<spark_jobs.cluster_broker.ClusterSpec>}s: one backend for
    every node, or one per node (a mixed cluster), each durable; the label is
    NAME, or C{cluster} for a cluster given without one.

    @param taken: the labels of the other runs, which a cluster's may not repeat.
    @raise BackendError: a backend is unknown or keeps nothing on disk.
    @raise ValueError: naming the item at fault: not one or three backends, a
        label that is not a plain name or is taken.
    """
    specs, labels = [], list(taken)
    for item in items:
        name, equals, backends = item.partition("=")
        if not equals or ":" in name:  # a backend option's '=' (chunked:chunk_size=1M)
            name, backends = events.CLUSTER_RUN, item
        name = name.strip()
        nodes = [backend.strip() for backend in backends.split(",")]
        if len(nodes) not in (1, len(CLUSTER_NODES)) or not all(nodes):
            raise ValueError(f"--cluster takes one backend for every node or one per node"
                             f" ({len(CLUSTER_NODES)}), comma-separated, not {item!r}")
        for backend in nodes:
            durable_backend(backend)
        if not REFERENCE_NAME.fullmatch(name):
            raise ValueError(f"--cluster name {name!r} must be letters, digits, '.', '_' or '-'"
                             " (it names the run directory)")
        if name in labels:
            raise ValueError(f"--cluster label {name!r} is taken by another run; give each"
                             " cluster its own: --cluster NAME=BACKENDS")
        labels.append(name)
        nodes = nodes * len(CLUSTER_NODES) if len(nodes) == 1 else nodes
        specs.append(ClusterSpec(name, tuple(nodes), lease_ttl, min_isr))
    return specs


def run_labels(arguments):
    """Every run's label in report order: the backends, the clusters, then the references."""
    return ([label for label, _ in arguments.backends]
            + [cluster.label for cluster in arguments.clusters]
            + [reference.label for reference in arguments.references])


# The console script; python -m spark_jobs.validate_backends runs the same.
PROGRAM = "brokerd-validate"


def build_parser(prog=PROGRAM):
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Play one seeded workload against each storage backend, then check with Spark"
                    " that every backend kept its promises and that they all agree; writes"
                    " summary.json, report.html and charts.",
        epilog="Exit status: 0 every check passed, 1 a check failed, 2 bad command line,"
               " 3 a run, export or the analysis could not be carried out,"
               " 4 no Java runtime for Spark (Java 17+; Debian: openjdk-17-jre-headless).",
    )
    parser.add_argument("--backends", default=DEFAULT_BACKENDS,
                        help="backend strings, comma-separated (NAME[:key=value...];"
                             " default %(default)s)")
    parser.add_argument("--reference", action="append", default=[], metavar="NAME=URL",
                        help="also play the workload against the AMQP 0-9-1 broker running at URL"
                             " (amqp://USER:PASSWORD@HOST:PORT/VHOST, vhost / as %%2F or an empty"
                             " path) and report it as NAME beside the backends; its queues and"
                             " exchanges named wl.* are deleted before and after its run;"
                             " repeatable")
    parser.add_argument("--reference-restart", action="append", default=[], metavar="NAME=COMMAND",
                        help="shell command that crashes and restarts reference NAME at each"
                             " --crash-every point (e.g. 'rabbitmq=docker restart -t 0 rabbit');"
                             " the run goes on once its URL takes connections again. Without one,"
                             " that reference runs without crashes; repeatable")
    parser.add_argument("--cluster", action="append", default=[],
                        metavar="[NAME=]BACKEND[,BACKEND,BACKEND]",
                        help="also play the workload against a cluster of three brokerd nodes and"
                             " an etcd the run starts (etcd must be installed), on this backend,"
                             " or one backend per node; each --crash-every point SIGKILLs the"
                             " leader and starts it again. Reported as NAME (default"
                             " 'cluster') beside the backends; repeatable")
    parser.add_argument("--cluster-lease-ttl", type=float, default=DEFAULT_LEASE_TTL,
                        metavar="SECONDS",
                        help="the cluster nodes' --cluster-lease-ttl: a failover takes about"
                             " this long, plus a second (default %(default)g)")
    parser.add_argument("--cluster-min-isr", type=int, default=DEFAULT_MIN_ISR, metavar="K",
                        help="the cluster nodes' --cluster-min-isr: the fewest nodes holding a"
                             " persistent message before it is confirmed (default %(default)s)")
    parser.add_argument("--out", required=True, type=pathlib.Path,
                        help="directory for the runs (OUT/runs/LABEL/) and the report")
    parser.add_argument("--master", default=None,
                        help="Spark master URL (default local[*], or the one spark-submit was"
                             " given)")
    parser.add_argument("--driver-memory", default=None,
                        help="Spark driver memory for a locally started JVM (default: half of this"
                             " machine's RAM)")
    parser.add_argument("--reuse-runs", action="store_true",
                        help="do not run the workload: take OUT/runs/LABEL/ as they are (their"
                             " stores are exported again)")
    parser.add_argument("--keep-exports", action="store_true",
                        help="with --reuse-runs: take each run's export.jsonl as it is instead of"
                             " exporting its store again, so only the Spark job runs")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true",
                       help="show progress on stderr, the default (in place on a terminal, else a"
                            " line every few seconds)")
    shown.add_argument("--quiet", action="store_true",
                       help="show no progress: print only the results on stdout (summary table,"
                            " wall times, report path, verdict)")
    add_workload_arguments(parser)
    return parser


def parse_arguments(argv=None, prog=PROGRAM):
    """The parsed command line plus C{backends} as (label, string) pairs and C{references} as
    L{Reference}s; exits with status 2 on a bad one."""
    parser = build_parser(prog)
    arguments = parser.parse_args(argv)
    try:
        arguments.backends = parse_backends(arguments.backends)
        arguments.references = parse_references(arguments.reference, arguments.reference_restart,
                                                 [label for label, _ in arguments.backends])
        if arguments.cluster_lease_ttl < 1:
            raise ValueError(f"--cluster-lease-ttl takes at least 1 second, not"
                             f" {arguments.cluster_lease_ttl:g}")
        if not 1 <= arguments.cluster_min_isr <= len(CLUSTER_NODES):
            raise ValueError(f"--cluster-min-isr takes 1 to {len(CLUSTER_NODES)} nodes, not"
                             f" {arguments.cluster_min_isr}")
        arguments.clusters = parse_clusters(
            arguments.cluster, arguments.cluster_lease_ttl, arguments.cluster_min_isr,
            [label for label, _ in arguments.backends]
            + [reference.label for reference in arguments.references])
    except (BackendError, ValueError) as problem:
        parser.error(str(problem))
    if arguments.clusters and not arguments.reuse_runs and etcd_command() is None:
        parser.error(f"--cluster runs need etcd, and none is installed here: {INSTALL_HINT}")
    if arguments.keep_exports and not arguments.reuse_runs:
        parser.error("--keep-exports only goes with --reuse-runs:"
                     " a fresh run has no export to keep")
    if arguments.reuse_runs:
        kinds = {**{reference.label: events.REFERENCE_RUN for reference in arguments.references},
                 **{cluster.label: events.CLUSTER_RUN for cluster in arguments.clusters}}
        for label in run_labels(arguments):
            run_dir = arguments.out / "runs" / label
            if not (run_dir / events.EVENTS_DIRECTORY).is_dir():
                parser.error(f"--reuse-runs: there is no run of {label} in {run_dir};"
                             f" run without --reuse-runs first")
            wanted = kinds.get(label, events.BACKEND_RUN)
            recorded = _recorded_kind(run_dir)
            if recorded != wanted:
                parser.error(f"--reuse-runs: the run in {run_dir} is a {recorded} run,"
                             f" and the command line makes {label} a {wanted}")
            exported = (run_dir / events.EXPORT_FILE).is_file()
            if arguments.keep_exports and wanted != events.REFERENCE_RUN and not exported:
                parser.error(f"--keep-exports: the run of {label} in {run_dir}"
                             f" has no {events.EXPORT_FILE};"
                             " leave --keep-exports out to export its store")
    return arguments


def _recorded_kind(run_dir):
    """The C{kind} a run's run.json records (a backend run when it records none or cannot be
    read)."""
    try:
        facts = json.loads((run_dir / events.RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return events.BACKEND_RUN
    return facts.get("kind", events.BACKEND_RUN) if isinstance(facts, dict) else events.BACKEND_RUN
