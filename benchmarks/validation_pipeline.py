"""The cross-backend validation at scale: a million messages per backend through
the whole pipeline (workload, export, Spark job, report).

    python -m benchmarks.validation_pipeline [--messages 1000000] [--out DIR]
        [any other python -m spark_jobs.validate_backends flag]

Runs C{spark_jobs.validate_backends} with those flags (the report goes to
--out, a fresh temporary directory by default, kept), then prints one JSON
object: the verdict, the wall time of each backend's workload and export and
of the Spark job, and per backend the throughput and latency figures of the
report. Its small version is C{tests/spark/test_pipeline.py}.
"""

import argparse
import json
import sys
import tempfile

from spark_jobs import validate_backends


def figures_of(summary):
    """The benchmark's figures, out of a validation summary."""
    backends = {}
    for label, backend in summary["backends"].items():
        rates, latency = backend["throughput"], backend["latency_ms"]
        backends[label] = {
            **{key: backend["run"][key] for key in ("published", "confirmed", "delivered", "stored", "crashes")},
            **{key: rates[key] for key in ("publish_msgs_per_s", "deliver_msgs_per_s", "publish_mb_per_s",
                                           "deliver_mb_per_s")},
            **{f"{kind}_p{point}_ms": latency[kind][f"p{point}"] for kind in ("confirm", "end_to_end")
               for point in (50, 99)},
        }
    return {"verdict": summary["verdict"], "timings": summary.get("timings", {}), "backends": backends}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.validation_pipeline", add_help=False)
    parser.add_argument("--messages", default="1000000")
    parser.add_argument("--out", default=None)
    known, rest = parser.parse_known_args(argv)
    out = known.out or tempfile.mkdtemp(prefix="brokerd-validation-")
    status = validate_backends.main(["--messages", known.messages, "--out", out, "--progress", *rest])
    if status in (validate_backends.PASSED, validate_backends.FAILED):
        with open(f"{out}/summary.json", encoding="utf-8") as summary:
            print(json.dumps({"out": out, **figures_of(json.load(summary))}, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
