"""The one command of the cross-backend validation: for each backend, play the
seeded workload against a real broker (L{spark_jobs.workload}), export what its
store still holds (L{spark_jobs.export}); then run the Spark job over all of
them (L{spark_jobs.analysis}) and write the report (L{spark_jobs.report})::

    brokerd-validate --backends sqlite,filelog,chunked --messages 2000 --out report/
    python -m spark_jobs.validate_backends --backends sqlite --messages 200 --out report/
    spark-submit spark_jobs/validate_backends.py --backends sqlite,chunked --out report/
    python -m spark_jobs.validate_backends --backends sqlite --out report/ \\
        --reference rabbitmq=amqp://guest:guest@127.0.0.1:5672/ \\
        --reference-restart "rabbitmq=docker restart -t 0 rabbit" --crash-every 1000
    brokerd-validate --backends chunked --cluster mixed=chunked,sqlite,chunked --crash-every 1500 \\
        --out report/

Each C{--backends} item is a backend string (C{chunked:chunk_size=1M}); its run
lives in C{<out>/runs/<label>/}, the label being the name before any colon, so
labels must differ. Each C{--reference NAME=URL} adds a run of the same
workload against an AMQP 0-9-1 broker already running at URL, in
C{<out>/runs/NAME/}, reported beside the backends
(L{spark_jobs.validation_options.parse_references}); its store is not exported,
so the checks that read an export do not apply to it. Each C{--cluster
[NAME=]BACKENDS} adds a run against three brokerd nodes of one cluster and an
etcd the run starts (L{spark_jobs.cluster_broker}), whose crash points SIGKILL
the leader; its final leader's store is exported. A fresh run replaces an
earlier run directory of the same label; C{--reuse-runs} keeps the runs there
and only exports the backends' stores again (for stores changed after their
run) before the Spark job, and C{--reuse-runs --keep-exports} runs the Spark
job alone, over the runs' C{export.jsonl} as they are (runs whose broker data
is gone, or generated ones such as C{benchmarks.synthetic_runs} writes).

Exit status: 0 when every check passes, 1 when any fails (the summary's
verdict is "fail"), 2 for a bad command line, 3 when the validation could not
be carried out (a run, export or input failed; the message names it), 4 when
no Java runtime the Spark job can start is found (one line says what is
needed and how to install it; checked before any run starts,
L{spark_jobs.java_runtime}).
"""

import shutil
import sys
import time

from spark_jobs import events
from spark_jobs.brokers import parse_amqp_url
from spark_jobs.java_runtime import (
    is_gateway_failure,
    java_command,
    java_problem,
    missing_java_line,
)
from spark_jobs.progress import ProgressPrinter
from spark_jobs.settings import WorkloadSettings, settings_from_arguments
from spark_jobs.validation_options import PROGRAM, parse_arguments, run_labels

# In --out: with --quiet, what the Spark JVM says on stderr goes here instead.
SPARK_LOG = "spark.log"
PASSED, FAILED, USAGE_ERROR, NOT_CARRIED_OUT, NO_JAVA = 0, 1, 2, 3, 4
NOT_APPLICABLE = "n/a"


class ValidationError(Exception):
    """A step of the validation could not be carried out."""


class JavaMissing(Exception):
    """Spark's JVM could not be started; C{str()} says why."""


def _progress_printer(quiet):
    """What the validation shows on stderr while it runs (L{spark_jobs.progress}): nothing when
    C{quiet}."""
    return ProgressPrinter() if quiet else ProgressPrinter.to_stream(sys.stderr)


def _fresh_run_dir(run_dir):
    """Removes an earlier run of the same label, so its broker data cannot leak into the new run."""
    if run_dir.exists():
        if (not (run_dir / events.RUN_FILE).exists()
                and not (run_dir / events.EVENTS_DIRECTORY).exists()):
            if any(run_dir.iterdir()):
                raise ValidationError(f"{run_dir} exists and is not a run directory;"
                                      f" not replacing it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def _run_settings(arguments):
    """The settings the runs played: the command line's, or with --reuse-runs the first run's
    run.json."""
    settings = settings_from_arguments(arguments)
    if arguments.reuse_runs:
        from spark_jobs.tables import RunInputError, read_run_facts

        for label in run_labels(arguments):
            try:
                recorded = read_run_facts(arguments.out / "runs" / label).get("settings")
                if isinstance(recorded, dict):
                    return WorkloadSettings.from_json(recorded)
            except (RunInputError, TypeError) as problem:
                raise ValidationError(f"the settings in the run.json of {label} are unreadable:"
                                      f" {problem}") from None
    return settings


def _describe_target(backend, reference, cluster):
    """What a run plays against, as its progress and error lines name it."""
    if reference is not None:
        return f"reference {reference.label}"
    if cluster is not None:
        return f"cluster {cluster.label} ({','.join(cluster.backends)})"
    return backend


def produce_runs(arguments, progress, timings):
    """Runs the workload (unless reusing runs) for every backend, cluster and reference and the
    export (unless keeping the exports) for every backend and cluster, noting each one's wall
    time in C{timings} (C{workload_seconds} and C{export_seconds}, per label)."""
    settings = settings_from_arguments(arguments)
    runs = [(label, backend, None, None) for label, backend in arguments.backends]
    runs += [(cluster.label, None, None, cluster) for cluster in arguments.clusters]
    runs += [(reference.label, None, reference, None) for reference in arguments.references]
    for number, (label, backend, reference, cluster) in enumerate(runs, start=1):
        run_dir = arguments.out / "runs" / label
        step = f"[{number}/{len(runs)}] {label}:"
        if not arguments.reuse_runs:
            _fresh_run_dir(run_dir)
            against = f" against {parse_amqp_url(reference.url).masked_url}" if reference else ""
            if cluster is not None:
                against = f" against {len(cluster.backends)} nodes ({','.join(cluster.backends)})"
            progress(f"{step} workload started{against}")
            started = time.monotonic()
            _play(label, (backend, reference, cluster), settings, run_dir,
                  progress.for_backend(number, len(runs)))
            timings.setdefault("workload_seconds", {})[label] = round(time.monotonic() - started, 3)
        if reference is not None:
            continue
        if arguments.keep_exports:
            progress(f"{step} keeping its {events.EXPORT_FILE}")
            continue
        _export(label, backend, run_dir, step, progress, timings)


def _play(label, target, settings, run_dir, progress):
    """One run of the workload, against C{target}: C{(backend, reference, cluster)}, one of them
    given (a backend string, a reference or a cluster spec)."""
    from spark_jobs.workload import WorkloadFailed, run_cluster, run_reference, run_workload

    backend, reference, cluster = target
    try:
        if reference is not None:
            run_reference(reference.url, settings, run_dir, label,
                          restart_command=reference.restart_command, progress=progress)
        elif cluster is not None:
            run_cluster(cluster, settings, run_dir, progress=progress)
        else:
            run_workload(backend, settings, run_dir, progress=progress, label=label)
    except (WorkloadFailed, ValueError) as problem:
        raise ValidationError(f"the workload on {_describe_target(*target)} failed:"
                              f" {problem}") from None


def _export(label, backend, run_dir, step, progress, timings):
    """Exports the store of the backend run in C{run_dir} (C{backend} None: of the cluster run
    there, its final leader's store), noting the time it took."""
    from spark_jobs.cluster_broker import export_source
    from spark_jobs.export import ExportError, export_store

    data_dir = run_dir / events.DATA_DIRECTORY
    if backend is None:
        try:
            backend, data_dir = export_source(run_dir)
        except ValueError as problem:
            raise ValidationError(str(problem)) from None
    progress(f"{step} export started")
    started = time.monotonic()
    try:
        lines = export_store(backend, data_dir, run_dir / events.EXPORT_FILE, label=label)
    except ExportError as problem:
        raise ValidationError(f"exporting the {backend} store of {run_dir} failed:"
                              f" {problem}") from None
    timings.setdefault("export_seconds", {})[label] = round(time.monotonic() - started, 3)
    progress(f"{step} exported {lines} stored messages in {timings['export_seconds'][label]:.1f} s")


def analyse(arguments, settings, progress, timings):
    """Runs the Spark job over every run, noting each step's wall time in C{timings}
    (C{spark_step_seconds}, the session's start included); the summary."""
    from spark_jobs.analysis import analyse_runs
    from spark_jobs.spark_session import create_session
    from spark_jobs.tables import RunInputError

    progress(f"Spark job over {', '.join(run_labels(arguments))}")
    steps = timings.setdefault("spark_step_seconds", {})

    def step_done(name, seconds):
        steps[name] = round(seconds, 3)
        progress(f"Spark job: {name} done in {seconds:.1f} s")

    started = time.monotonic()
    try:
        spark = create_session(arguments.master, arguments.driver_memory)
    except Exception as problem:  # noqa: BLE001 - pyspark's errors share no narrower base
        if is_gateway_failure(problem):
            raise JavaMissing(java_problem() or f"{java_command() or 'java'} did not start"
                              " Spark's JVM (what it said is above, or in spark.log)") from None
        raise
    step_done("session", time.monotonic() - started)
    try:
        return analyse_runs(spark, arguments.out, run_labels(arguments), settings, step_done)
    except RunInputError as problem:
        raise ValidationError(str(problem)) from None
    finally:
        spark.stop()


def failed_checks(checks):
    """The names of the checks that apply and failed."""
    return [name for name, check in checks.items()
            if events.check_applies(check) and not check["pass"]]


def summary_table(summary):
    """A few lines: per backend or reference its counts, rates, p99 latencies, which side used more
    CPU (the limit) and failed checks (and those that do not apply, n/a); the notes on runs; then
    the cross-backend checks."""
    width = max([10, *map(len, summary["backends"])])
    header = (f"{'backend':<{width}} {'published':>9} {'confirmed':>9} {'delivered':>9}"
              f" {'stored':>7} {'crashes':>7}"
              f" {'publish/s':>10} {'deliver/s':>10}"
              f" {'confirm p99 ms':>14} {'e2e p99 ms':>10}"
              f" {'limit':>7}  checks")
    lines, notes = [header], []
    for label, backend in summary["backends"].items():
        run, rates, latency = backend["run"], backend["throughput"], backend["latency_ms"]
        checks = backend["checks"]
        failed = failed_checks(checks)
        not_applicable = [name for name, check in checks.items() if not events.check_applies(check)]
        stored = NOT_APPLICABLE if run["stored"] is None else run["stored"]
        outcome = "fail: " + ", ".join(failed) if failed else "pass"
        if not_applicable:
            outcome += f" ({NOT_APPLICABLE}: {', '.join(not_applicable)})"
        lines.append(
            f"{label:<{width}} {run['published']:>9} {run['confirmed']:>9} {run['delivered']:>9}"
            f" {stored:>7} {run['crashes']:>7}"
            f" {rates['publish_msgs_per_s']:>10.1f} {rates['deliver_msgs_per_s']:>10.1f}"
            f" {latency['confirm']['p99']:>14.2f} {latency['end_to_end']['p99']:>10.2f}"
            f" {(backend.get('cpu') or {}).get('limit', 'unknown'):>7}  {outcome}")
        kind = backend.get("kind", events.BACKEND_RUN)
        notes += [f"{label} ({kind}): {note}" for note in backend.get("notes", [])]
    lines += notes
    failed = failed_checks(summary["cross_backend"]["checks"])
    lines.append(f"cross-backend checks: {'fail: ' + ', '.join(failed) if failed else 'pass'}")
    return "\n".join(lines)


def timings_line(timings):
    """Where the wall time went: the workload and export per backend, the Spark job (and its
    steps), the report."""
    parts = [f"{step.removesuffix('_seconds')} {label} {seconds:.1f} s"
             for step in ("workload_seconds", "export_seconds")
             for label, seconds in timings.get(step, {}).items()]
    steps = ", ".join(f"{name} {seconds:.1f}"
                      for name, seconds in timings.get("spark_step_seconds", {}).items())
    parts.append(f"Spark job {timings.get('spark_seconds', 0):.1f} s"
                 + (f" ({steps})" if steps else ""))
    parts.append(f"report {timings.get('report_seconds', 0):.1f} s")
    return "wall time: " + ", ".join(parts)


def main(argv=None, prog=PROGRAM):
    """Run the validation as C{prog} (the name its usage lines give); the exit status."""
    arguments = parse_arguments(argv, prog)
    problem = java_problem()
    if problem is not None:  # before the workload: the Spark job at its end could not run
        print(missing_java_line(problem), file=sys.stderr)
        return NO_JAVA
    progress = _progress_printer(arguments.quiet)
    timings = {}
    try:
        arguments.out.mkdir(parents=True, exist_ok=True)
        produce_runs(arguments, progress, timings)
        settings = _run_settings(arguments)
        started = time.monotonic()
        with progress.quieted(arguments.out / SPARK_LOG):
            summary = analyse(arguments, settings, progress, timings)
        timings["spark_seconds"] = round(time.monotonic() - started, 3)
        progress(f"Spark job done in {timings['spark_seconds']:.1f} s")
        summary["timings"] = timings
        from spark_jobs.report import SummaryError, write_report

        progress("report started")
        started = time.monotonic()
        try:
            summary = write_report(summary, arguments.out)
        except SummaryError as problem:
            raise ValidationError(f"the report could not be written: {problem}") from None
        # Printed; summary.json is written by then.
        timings["report_seconds"] = round(time.monotonic() - started, 3)
        progress(f"report written in {timings['report_seconds']:.1f} s")
    except JavaMissing as problem:
        print(missing_java_line(problem), file=sys.stderr)
        return NO_JAVA
    except (ValidationError, OSError) as problem:
        print(f"validation not carried out: {problem}", file=sys.stderr)
        return NOT_CARRIED_OUT
    print(summary_table(summary))
    print(timings_line(timings))
    print(f"report: {arguments.out / 'report.html'} (summary: {arguments.out / 'summary.json'})")
    print(f"verdict: {summary['verdict']}")
    return PASSED if summary["verdict"] == "pass" else FAILED


if __name__ == "__main__":
    sys.exit(main(prog="python -m spark_jobs.validate_backends"))
