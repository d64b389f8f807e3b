"""The validation's Spark job at scale, alone: millions of events per backend
through staging, the checks and the report, without the workload's clients.

    python -m benchmarks.validation_spark [--messages 2000000] [--backends sqlite,filelog,chunked]
        [--out DIR] [--keep] [--driver-memory 8g] [--master URL]

Writes clean synthetic runs (L{benchmarks.synthetic_runs}; about five events a
message, so the default is some 10 million events per backend) under --out
(runs already there for every label are reused as they are), then runs C{python -m spark_jobs.validate_backends
--reuse-runs --keep-exports} over them as a child process. While it runs, the
resident memory of that process and all it started (the Python driver, the
Spark JVM, its Python workers; in local mode the executors are in that JVM) is
added up every quarter second and the largest sum kept. Prints one JSON
object: the verdict, the events per backend (as the job counted them), the
seconds spent generating, the job's wall time, the Spark job's own time (from
session start to the summary) and its steps', and the peak driver-side RSS in MiB. Without
--out, everything goes to a temporary directory, deleted at the end (the runs
take gigabytes) unless --keep is given; an --out directory is left as it is.
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.synthetic_runs import DEFAULT_BACKENDS, write_runs
from brokerd.loadgen.process_memory import PeakResidentMemory
from spark_jobs import events

MIB = 1 << 20
# The summary's run counts that are each one kind of event.
EVENT_COUNTS = ("published", "confirmed", "nacked_by_broker", "delivered", "acked", "nacked", "rejected")


def have_runs(out, labels):
    """Whether C{out} holds a run with events and an export for every label."""
    runs = pathlib.Path(out) / "runs"
    return all((runs / label / events.EVENTS_DIRECTORY).is_dir() and (runs / label / events.EXPORT_FILE).is_file()
               for label in labels)


def run_job(out, labels, job_arguments):
    """
    Runs the Spark job alone over the runs in C{out}, its output passed through.

    @return: C{(exit status, wall seconds, peak resident bytes of it and its descendants)}.
    """
    command = [sys.executable, "-m", "spark_jobs.validate_backends", "--backends", ",".join(labels),
               "--out", str(out), "--reuse-runs", "--keep-exports", "--progress", *job_arguments]
    started = time.monotonic()
    job = subprocess.Popen(command, stdout=sys.stderr)
    memory = PeakResidentMemory(job.pid).start()
    try:
        status = job.wait()
    finally:
        peak = memory.stop()
    return status, time.monotonic() - started, peak


def figures_of(summary):
    """The events per backend the job counted, from its summary."""
    return {label: sum(backend["run"][count] for count in EVENT_COUNTS)
            for label, backend in summary["backends"].items()}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.validation_spark", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2_000_000, help="messages per backend (about 5 events each)")
    parser.add_argument("--backends", default=DEFAULT_BACKENDS, help="run labels, comma-separated")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="the runs and the report, kept (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--driver-memory", default=None, help="passed to the job")
    parser.add_argument("--master", default=None, help="passed to the job")
    arguments = parser.parse_args(argv)
    labels = arguments.backends.split(",")
    temporary = arguments.out is None
    out = pathlib.Path(tempfile.mkdtemp(prefix="brokerd-validation-spark-")) if temporary else arguments.out
    job_arguments = [flag for name in ("driver_memory", "master") if getattr(arguments, name)
                     for flag in (f"--{name.replace('_', '-')}", getattr(arguments, name))]
    try:
        generate_seconds = 0.0
        if not have_runs(out, labels):
            print(f"writing {arguments.messages} messages' events per backend under {out}", file=sys.stderr)
            started = time.monotonic()
            write_runs(out, labels, arguments.messages)
            generate_seconds = time.monotonic() - started
        status, job_seconds, peak = run_job(out, labels, job_arguments)
        if status not in (0, 1):
            print(f"the Spark job failed with status {status}", file=sys.stderr)
            return status
        with open(out / "summary.json", encoding="utf-8") as summary_file:
            summary = json.load(summary_file)
        print(json.dumps({
            "out": None if temporary and not arguments.keep else str(out),
            "verdict": summary["verdict"],
            "events_per_backend": figures_of(summary),
            "generate_seconds": round(generate_seconds, 1),
            "job_wall_seconds": round(job_seconds, 1),
            "spark_seconds": summary["timings"]["spark_seconds"],
            "spark_step_seconds": summary["timings"].get("spark_step_seconds", {}),
            "total_seconds": round(generate_seconds + job_seconds, 1),
            "peak_driver_rss_mib": round(peak / MIB),
        }, indent=2))
        return status
    finally:
        if temporary and not arguments.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
