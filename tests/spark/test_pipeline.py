"""The cross-backend validation as a user runs it, end to end: the one command
plays a small seeded workload against every durable backend with a SIGKILL in
the middle, exports the stores, runs the Spark job and writes the report; then
one backend's stored data loses a confirmed message and the job must say
exactly that."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from spark_jobs import events
from tests.support.paths import ROOT
from tests.support.spark_driver import spark_environment
from tests.support.store_damage import drop_stored_message

pytestmark = pytest.mark.long_module(seconds=195)  # started early (tests/conftest.py)

BACKENDS = ("sqlite", "filelog", "chunked")
PER_BACKEND_CHECKS, CROSS_CHECKS = events.BACKEND_CHECKS, events.CROSS_BACKEND_CHECKS


def validate(out, *arguments):
    """Runs C{python -m spark_jobs.validate_backends} on every durable backend; the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "spark_jobs.validate_backends", "--backends", ",".join(BACKENDS), "--out", str(out),
         *arguments],
        cwd=ROOT, env=spark_environment(), capture_output=True, text=True, timeout=900,
    )


def summary_of(out):
    with open(out / "summary.json", encoding="utf-8") as summary:
        return json.load(summary)


def read_lines(path):
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("validation")
    finished = validate(out, "--messages", "1500", "--publishers", "1", "--crash-every", "900", "--parked-queues", "2")
    return out, finished


def test_the_whole_pipeline_passes_on_every_backend_with_a_crash_in_the_middle(passing_run):
    out, finished = passing_run
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "verdict: pass" in finished.stdout
    summary = summary_of(out)
    assert summary["verdict"] == "pass"
    assert sorted(summary["backends"]) == sorted(BACKENDS)
    for label, backend in summary["backends"].items():
        assert backend["run"]["crashes"] >= 1, label
        assert backend["run"]["confirmed"] > 0 and backend["run"]["delivered"] > 0, label
        assert backend["run"]["stored"] > 0, f"{label}: the parked queues hold messages for the export"
        for check in PER_BACKEND_CHECKS:
            result = backend["checks"][check]
            assert result["pass"] and result["violations"] == 0 and result["checked"] > 0, (label, check, result)
        assert backend["throughput"]["publish_msgs_per_s"] > 0
        assert backend["latency_ms"]["confirm"]["count"] > 0
    for check in CROSS_CHECKS:
        assert summary["cross_backend"]["checks"][check]["pass"], check
    assert sorted(summary["timings"]["workload_seconds"]) == sorted(BACKENDS)
    assert summary["timings"]["spark_seconds"] > 0
    assert "wall time: workload sqlite" in finished.stdout
    assert (out / "report.html").stat().st_size > 0
    for chart in summary["charts"].values():
        assert (out / chart).read_bytes().startswith(b"\x89PNG")


def confirmed_ids(run_dir):
    confirmed = set()
    for path in (run_dir / events.EVENTS_DIRECTORY).glob("*.jsonl"):
        confirmed.update(event["message_id"] for event in read_lines(path)
                         if event["kind"] == events.CONFIRM and event["ok"])
    return confirmed


def test_a_confirmed_message_lost_by_one_backend_is_reported_exactly(passing_run, tmp_path):
    out, finished = passing_run
    assert finished.returncode == 0, finished.stdout + finished.stderr
    damaged = tmp_path / "damaged"
    shutil.copytree(out / "runs", damaged / "runs")
    run_dir = damaged / "runs" / "filelog"
    confirmed = confirmed_ids(run_dir)
    stored = [line for line in read_lines(run_dir / events.EXPORT_FILE)
              if line["state"] == events.READY and line["message_id"] in confirmed]
    victim = stored[len(stored) // 2]
    assert drop_stored_message("filelog", run_dir / events.DATA_DIRECTORY, victim["queue"], victim["message_id"])

    finished = validate(damaged, "--reuse-runs")
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert "verdict: fail" in finished.stdout
    summary = summary_of(damaged)
    assert summary["verdict"] == "fail"
    lost = summary["backends"]["filelog"]["checks"]["confirmed_delivered_or_stored"]
    assert (lost["pass"], lost["violations"]) == (False, 1), lost
    assert any(victim["message_id"] in example for example in lost["examples"]), lost
    for label in BACKENDS:
        failed = [name for name, check in summary["backends"][label]["checks"].items() if not check["pass"]]
        assert failed == (["confirmed_delivered_or_stored"] if label == "filelog" else []), (label, failed)
    same = summary["cross_backend"]["checks"]["same_messages"]
    assert (same["pass"], same["violations"]) == (False, 1), same
    assert os.path.exists(damaged / "report.html")
