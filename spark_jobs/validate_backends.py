"""The one command of the cross-backend validation: for each backend, play the
seeded workload against a real broker (L{spark_jobs.workload}), export what its
store still holds (L{spark_jobs.export}); then run the Spark job over all of
them (L{spark_jobs.analysis}) and write the report (L{spark_jobs.report})::

    python -m spark_jobs.validate_backends --backends sqlite,filelog,chunked --messages 2000 --out report/
    spark-submit spark_jobs/validate_backends.py --backends sqlite,chunked --out report/

Each C{--backends} item is a backend string (C{chunked:chunk_size=1M}); its
run lives in C{<out>/runs/<label>/}, the label being the name before any
colon, so labels must differ. A fresh run replaces an earlier run directory of
the same label; C{--reuse-runs} keeps the runs there and only exports their
stores again (for stores changed after their run) before the Spark job, and
C{--reuse-runs --keep-exports} runs the Spark job alone, over the runs'
C{export.jsonl} as they are (runs whose broker data is gone, or generated ones
such as L{benchmarks.synthetic_runs} writes).

Exit status: 0 when every check passes, 1 when any fails (the summary's
verdict is "fail"), 2 for a bad command line, 3 when the validation could not
be carried out (a run, export or input failed; the message names it).
"""

import argparse
import pathlib
import shutil
import sys
import time
import tempfile

from twisted.internet.task import Clock

from brokerd.storeregistry import BackendError, make_store, split_backend_string
from spark_jobs import events
from spark_jobs.settings import WorkloadSettings, add_workload_arguments, settings_from_arguments

DEFAULT_BACKENDS = "sqlite,filelog,chunked"
PASSED, FAILED, USAGE_ERROR, NOT_CARRIED_OUT = 0, 1, 2, 3


class ValidationError(Exception):
    """A step of the validation could not be carried out."""


def parse_backends(text):
    """
    C{"sqlite,chunked:chunk_size=1M"} -> C{[("sqlite", "sqlite"), ("chunked", "chunked:chunk_size=1M")]}:
    (label, backend string) pairs, each backend registered, durable, and given only options it has,
    with values it takes.

    @raise BackendError: naming the item at fault.
    """
    items = [item.strip() for item in text.split(",")]
    if not any(items) or not all(items):
        raise BackendError(f"--backends needs comma-separated backend names, not {text!r}")
    pairs = []
    for item in items:
        name, _ = split_backend_string(item)
        with tempfile.TemporaryDirectory() as scratch:
            # Built, never opened (a Clock stands in for the reactor): checks the name, options and values.
            store = make_store(item, scratch, reactor=Clock())
        if not store.durable:
            raise BackendError(f"backend {name!r} keeps nothing on disk, so there is no store to export and"
                               " check after the run; pick durable backends")
        pairs.append((name, item))
    labels = [label for label, _ in pairs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise BackendError(f"backend {repeated[0]!r} is given twice in --backends; each run needs its own label")
    return pairs


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.validate_backends",
        description="Play one seeded workload against each storage backend, then check with Spark that"
                    " every backend kept its promises and that they all agree; writes summary.json,"
                    " report.html and charts.",
        epilog="Exit status: 0 every check passed, 1 a check failed, 2 bad command line,"
               " 3 a run, export or the analysis could not be carried out.",
    )
    parser.add_argument("--backends", default=DEFAULT_BACKENDS,
                        help="backend strings, comma-separated (NAME[:key=value...]; default %(default)s)")
    parser.add_argument("--out", required=True, type=pathlib.Path,
                        help="directory for the runs (OUT/runs/LABEL/) and the report")
    parser.add_argument("--master", default=None,
                        help="Spark master URL (default local[*], or the one spark-submit was given)")
    parser.add_argument("--driver-memory", default=None,
                        help="Spark driver memory for a locally started JVM (default: half of this machine's RAM)")
    parser.add_argument("--reuse-runs", action="store_true",
                        help="do not run the workload: take OUT/runs/LABEL/ as they are (their stores are"
                             " exported again)")
    parser.add_argument("--keep-exports", action="store_true",
                        help="with --reuse-runs: take each run's export.jsonl as it is instead of exporting its"
                             " store again, so only the Spark job runs")
    parser.add_argument("--progress", action="store_true", help="report each step on stderr")
    add_workload_arguments(parser)
    return parser


def parse_arguments(argv=None):
    """The parsed command line plus C{backends} as (label, string) pairs; exits with status 2 on a bad one."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        arguments.backends = parse_backends(arguments.backends)
    except BackendError as problem:
        parser.error(str(problem))
    if arguments.keep_exports and not arguments.reuse_runs:
        parser.error("--keep-exports only goes with --reuse-runs: a fresh run has no export to keep")
    if arguments.reuse_runs:
        for label, _ in arguments.backends:
            run_dir = arguments.out / "runs" / label
            if not (run_dir / events.EVENTS_DIRECTORY).is_dir():
                parser.error(f"--reuse-runs: there is no run of {label} in {run_dir}; run without --reuse-runs first")
            if arguments.keep_exports and not (run_dir / events.EXPORT_FILE).is_file():
                parser.error(f"--keep-exports: the run of {label} in {run_dir} has no {events.EXPORT_FILE};"
                             " leave --keep-exports out to export its store")
    return arguments


def _progress_printer(enabled):
    """A callable taking one progress line: printed on stderr when C{enabled}, else dropped."""
    def progress(line):
        if enabled:
            print(line, file=sys.stderr, flush=True)
    return progress


def _fresh_run_dir(run_dir):
    """Removes an earlier run of the same label, so its broker data cannot leak into the new run."""
    if run_dir.exists():
        if not (run_dir / events.RUN_FILE).exists() and not (run_dir / events.EVENTS_DIRECTORY).exists():
            if any(run_dir.iterdir()):
                raise ValidationError(f"{run_dir} exists and is not a run directory; not replacing it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def _run_settings(arguments):
    """The settings the runs played: the command line's, or with --reuse-runs the first run's run.json."""
    settings = settings_from_arguments(arguments)
    if arguments.reuse_runs:
        from spark_jobs.tables import RunInputError, read_run_facts

        for label, _ in arguments.backends:
            try:
                recorded = read_run_facts(arguments.out / "runs" / label).get("settings")
                if isinstance(recorded, dict):
                    return WorkloadSettings.from_json(recorded)
            except (RunInputError, TypeError) as problem:
                raise ValidationError(f"the settings in the run.json of {label} are unreadable: {problem}") from None
    return settings


def produce_runs(arguments, progress, timings):
    """Runs the workload (unless reusing runs) and the export (unless keeping the exports) for every
    backend, noting each one's wall time in C{timings} (C{workload_seconds} and C{export_seconds}, per label)."""
    from spark_jobs.export import ExportError, export_store

    settings = settings_from_arguments(arguments)
    for number, (label, backend) in enumerate(arguments.backends, start=1):
        run_dir = arguments.out / "runs" / label
        step = f"[{number}/{len(arguments.backends)}] {label}:"
        if not arguments.reuse_runs:
            from spark_jobs.workload import WorkloadFailed, run_workload

            _fresh_run_dir(run_dir)
            progress(f"{step} workload")
            started = time.monotonic()
            try:
                run_workload(backend, settings, run_dir, progress=progress if arguments.progress else None,
                             label=label)
            except (WorkloadFailed, ValueError) as problem:
                raise ValidationError(f"the workload on {backend} failed: {problem}") from None
            timings.setdefault("workload_seconds", {})[label] = round(time.monotonic() - started, 3)
        if arguments.keep_exports:
            progress(f"{step} keeping its {events.EXPORT_FILE}")
            continue
        progress(f"{step} export")
        started = time.monotonic()
        try:
            lines = export_store(backend, run_dir / events.DATA_DIRECTORY, run_dir / events.EXPORT_FILE, label=label)
        except ExportError as problem:
            raise ValidationError(f"exporting the {backend} store of {run_dir} failed: {problem}") from None
        timings.setdefault("export_seconds", {})[label] = round(time.monotonic() - started, 3)
        progress(f"{step} exported {lines} stored messages")


def analyse(arguments, settings, progress):
    """Runs the Spark job over every run; the summary."""
    from spark_jobs.analysis import create_session, analyse_runs
    from spark_jobs.tables import RunInputError

    progress(f"Spark job over {', '.join(label for label, _ in arguments.backends)}")
    spark = create_session(arguments.master, arguments.driver_memory)
    try:
        return analyse_runs(spark, arguments.out, [label for label, _ in arguments.backends], settings)
    except RunInputError as problem:
        raise ValidationError(str(problem)) from None
    finally:
        spark.stop()


def failed_checks(checks):
    return [name for name, check in checks.items() if not check["pass"]]


def summary_table(summary):
    """A few lines: per backend its counts, rates, p99 latencies and failed checks; then the cross-backend checks."""
    header = (f"{'backend':<10} {'published':>9} {'confirmed':>9} {'delivered':>9} {'stored':>7} {'crashes':>7}"
              f" {'publish/s':>10} {'deliver/s':>10} {'confirm p99 ms':>14} {'e2e p99 ms':>10}  checks")
    lines = [header]
    for label, backend in summary["backends"].items():
        run, rates, latency = backend["run"], backend["throughput"], backend["latency_ms"]
        failed = failed_checks(backend["checks"])
        lines.append(
            f"{label:<10} {run['published']:>9} {run['confirmed']:>9} {run['delivered']:>9} {run['stored']:>7}"
            f" {run['crashes']:>7} {rates['publish_msgs_per_s']:>10.1f} {rates['deliver_msgs_per_s']:>10.1f}"
            f" {latency['confirm']['p99']:>14.2f} {latency['end_to_end']['p99']:>10.2f}"
            f"  {'fail: ' + ', '.join(failed) if failed else 'pass'}")
    failed = failed_checks(summary["cross_backend"]["checks"])
    lines.append(f"cross-backend checks: {'fail: ' + ', '.join(failed) if failed else 'pass'}")
    return "\n".join(lines)


def timings_line(timings):
    """Where the wall time went: the workload and export per backend, then the Spark job."""
    parts = [f"{step.removesuffix('_seconds')} {label} {seconds:.1f} s"
             for step in ("workload_seconds", "export_seconds") for label, seconds in timings.get(step, {}).items()]
    parts.append(f"Spark job {timings.get('spark_seconds', 0):.1f} s")
    return "wall time: " + ", ".join(parts)


def main(argv=None):
    arguments = parse_arguments(argv)
    progress = _progress_printer(arguments.progress)
    timings = {}
    try:
        arguments.out.mkdir(parents=True, exist_ok=True)
        produce_runs(arguments, progress, timings)
        settings = _run_settings(arguments)
        started = time.monotonic()
        summary = analyse(arguments, settings, progress)
        timings["spark_seconds"] = round(time.monotonic() - started, 3)
        summary["timings"] = timings
        from spark_jobs.report import SummaryError, write_report

        progress("report")
        try:
            summary = write_report(summary, arguments.out)
        except SummaryError as problem:
            raise ValidationError(f"the report could not be written: {problem}") from None
    except (ValidationError, OSError) as problem:
        print(f"validation not carried out: {problem}", file=sys.stderr)
        return NOT_CARRIED_OUT
    print(summary_table(summary))
    print(timings_line(timings))
    print(f"report: {arguments.out / 'report.html'} (summary: {arguments.out / 'summary.json'})")
    print(f"verdict: {summary['verdict']}")
    return PASSED if summary["verdict"] == "pass" else FAILED


if __name__ == "__main__":
    sys.exit(main())
