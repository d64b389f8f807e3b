"""The cross-backend validation against three-node brokerd clusters, as a user runs it: the one
command starts, per cluster, an etcd and three nodes (all chunked, or chunked, sqlite, chunked),
plays a small seeded workload against the leader, SIGKILLs the leader at each of two crash
points (it rejoins as a follower while another node takes over), exports the final leader's
store and runs the Spark job over them and a single chunked broker. Every message confirmed
before a failover must be delivered or stored after it, none acknowledged durably may come
back, and the clusters must hold what the single broker holds.

Until a restarted old leader is resynchronised in full from the new leader, the runs use
C{--cluster-min-isr 1}: a follower the new leader refuses leaves it alone in the in-sync set.
"""

import json
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from spark_jobs import events
from tests.support.paths import ROOT
from tests.support.spark_driver import spark_environment

pytestmark = [
    pytest.mark.long_module(seconds=90),  # started early (tests/conftest.py)
    pytest.mark.skipif(shutil.which("etcd") is None,
                       reason="etcd (Debian's etcd-server) is not installed here"),
]

LEASE_TTL = 3
# A failover takes the lease's TTL, etcd's half-second tick and the new leader's start; the
# rest is room for a machine busy with other work.
FAILOVER_SECONDS = LEASE_TTL + 6
CRASHES = 2
MIXED = ("chunked", "sqlite", "chunked")


def read_json(path):
    with open(path, encoding="utf-8") as document:
        return json.load(document)


def read_lines(path):
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
    """One validation of a chunked broker, a chunked cluster and a mixed one, each crashed twice; its
    --out directory and the finished process."""
    out = tmp_path_factory.mktemp("cluster-validation")
    finished = subprocess.run(
        [sys.executable, "-m", "spark_jobs.validate_backends", "--backends", "chunked", "--cluster", "chunked",
         "--cluster", "mixed=" + ",".join(MIXED), "--cluster-lease-ttl", str(LEASE_TTL), "--cluster-min-isr", "1",
         "--messages", "4500", "--crash-every", "1500", "--publishers", "1", "--parked-queues", "2",
         "--out", str(out)],
        cwd=ROOT, env=spark_environment(), capture_output=True, text=True, timeout=900,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return out, finished


def confirmed_by_epoch(run_dir):
    """Epoch -> the message ids confirmed (basic.ack) by the incarnation of that epoch."""
    confirmed = {}
    for path in (run_dir / events.EVENTS_DIRECTORY).glob("*.jsonl"):
        for event in read_lines(path):
            if event["kind"] == events.CONFIRM and event["ok"]:
                confirmed.setdefault(event["epoch"], set()).add(event["message_id"])
    return confirmed


def refused(port):
    """Whether nothing listens on loopback C{port}."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def assert_cluster_run_passed(out, finished, label):
    """Cluster run C{label} passed every check, its leader was killed L{CRASHES} times, each time with
    messages confirmed before the crash, and each failover came within L{FAILOVER_SECONDS}; its run.json."""
    summary = read_json(out / "summary.json")
    assert summary["verdict"] == "pass" and "verdict: pass" in finished.stdout
    assert list(summary["backends"]) == ["chunked", "cluster", "mixed"]
    cluster = summary["backends"][label]
    assert cluster["kind"] == events.CLUSTER_RUN
    run = cluster["run"]
    assert run["crashes"] == CRASHES
    assert run["confirmed"] > 0 and run["delivered"] > 0 and run["stored"] > 0, run
    for name in events.BACKEND_CHECKS:
        check = cluster["checks"][name]
        assert check["pass"] and check["violations"] == 0 and check["checked"] > 0, (name, check)
    for name, check in summary["cross_backend"]["checks"].items():
        assert check["pass"], (name, check)
    run_dir = out / "runs" / label
    facts = read_json(run_dir / events.RUN_FILE)
    confirmed = confirmed_by_epoch(run_dir)
    for epoch in range(CRASHES):
        assert confirmed.get(epoch), f"nothing was confirmed before crash {epoch + 1}: {sorted(confirmed)}"
    failovers = facts["failovers"]
    assert len(failovers) == CRASHES
    names = {node["name"] for node in facts["nodes"]}
    assert all({failover["killed"], failover["leader"]} <= names for failover in failovers), failovers
    assert all(0 < failover["seconds"] < FAILOVER_SECONDS for failover in failovers), failovers
    # The first killed leader waits out its old lease before it campaigns: an in-sync follower takes over.
    assert failovers[0]["leader"] != failovers[0]["killed"], failovers
    assert facts["leader"] == failovers[-1]["leader"]
    assert cluster["failover"] == {
        "count": CRASHES, "max_seconds": max(failover["seconds"] for failover in failovers),
        "mean_seconds": round(sum(failover["seconds"] for failover in failovers) / CRASHES, 3)}
    for number, failover in enumerate(failovers, start=1):
        assert (f"{label} (cluster): failover {number}: leader {failover['killed']} killed,"
                f" {failover['leader']} served") in finished.stdout
    # Every node was stopped, the final leader cleanly, and the export read the final leader's store.
    for node in facts["nodes"]:
        assert refused(node["amqp_port"]) and refused(node["replication_port"]), node
    assert facts["broker_stop_status"][facts["leader"]] in (0, -signal.SIGTERM)
    assert len(read_lines(run_dir / events.EXPORT_FILE)) == run["stored"]
    return facts


def test_a_cluster_whose_leader_is_killed_twice_keeps_every_confirmed_message(validation):
    out, finished = validation
    facts = assert_cluster_run_passed(out, finished, "cluster")
    assert facts["backends"] == ["chunked"] * 3
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "cluster failover" in report and "longest failover (s)" in report


def test_a_mixed_cluster_runs_each_node_on_its_own_backend(validation):
    out, finished = validation
    facts = assert_cluster_run_passed(out, finished, "mixed")
    assert facts["backends"] == list(MIXED)
    assert [node["backend"] for node in facts["nodes"]] == list(MIXED)
    leader = next(node for node in facts["nodes"] if node["name"] == facts["leader"])
    # The export opened the final leader's store with that node's backend.
    store = out / "runs" / "mixed" / leader["data_dir"]
    assert (store / leader["backend"]).is_dir(), sorted(path.name for path in store.iterdir())
