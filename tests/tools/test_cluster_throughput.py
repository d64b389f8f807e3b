"""A small run of ``benchmarks.cluster_throughput``: one brokerd node against a three-node brokerd cluster
(RabbitMQ is left out: CI has none), as its own process, as users start it. It must report every system,
phase and round, with every publish confirmed and every message consumed, and stop everything it started,
also when it is stopped halfway."""

import json
import os
import subprocess
import sys

import pytest

from tests.support.etcd import needs_etcd
from tests.support.paths import ROOT
from tests.tools.benchmark_runs import gone, started_pids, stopped_once_measuring, working_directory

pytestmark = [needs_etcd, pytest.mark.long_module(seconds=40)]

PHASES = ("publish", "consume", "together")
MESSAGES = 2000
ROUNDS = 2
COMMAND = [sys.executable, "-m", "benchmarks.cluster_throughput", "--messages", str(MESSAGES), "--rounds", str(ROUNDS),
           "--window", "500", "--prefetch", "200", "--systems", "single,cluster"]


@pytest.fixture(scope="module")
def report():
    result = subprocess.run(COMMAND + ["--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout), result.stderr.splitlines()


def test_every_system_phase_and_round_is_reported_with_every_confirm_and_delivery(report):
    results, _ = report
    assert (results["messages"], results["rounds"], results["queue_type"]) == (MESSAGES, ROUNDS, "quorum")
    assert list(results["systems"]) == ["single", "cluster"]
    single, cluster = results["systems"]["single"], results["systems"]["cluster"]
    assert (single["label"], sorted(single["pids"])) == ("brokerd single", ["brokerd"])
    assert (cluster["label"], sorted(cluster["pids"])) == ("brokerd cluster", ["etcd", "n1", "n2", "n3"])
    assert cluster["replicas"].startswith("in-sync set n1, n2, n3, leader n"), cluster["replicas"]
    for system in (single, cluster):
        assert len(system["rounds"]) == ROUNDS
        for result in system["rounds"]:
            # publish and together publish N each; consume and together consume N each
            assert (result["confirmed"], result["consumed"]) == (2 * MESSAGES, 2 * MESSAGES)
            for phase in PHASES:
                cpu = result[f"{phase}_cpu"]
                assert cpu["nodes_total"] == pytest.approx(sum(cpu["nodes"].values())), cpu
        for phase in PHASES:
            row = system["summary"][phase]
            assert 0 < row["min_per_s"] <= row["per_s"] <= row["max_per_s"], row
            assert row["nodes_cpu"] > 0 and row["client_cpu"] > 0, row
            assert set(row["node_cpu"]) == set(system["pids"]), row
    for phase in PHASES:
        ratios = results["ratios"][phase]
        assert ratios["cluster_to_rabbitmq"] is None
        expected = cluster["summary"][phase]["per_s"] / single["summary"][phase]["per_s"]
        assert ratios["cluster_to_single"] == pytest.approx(expected)


def test_the_cluster_followers_work_while_it_is_measured(report):
    cluster = report[0]["systems"]["cluster"]
    leader = cluster["replicas"].rpartition("leader ")[2]
    followers = [name for name in ("n1", "n2", "n3") if name != leader]
    for name in followers:  # they apply every publish: a follower idle through the publishing phase is no copy
        assert cluster["summary"]["publish"]["node_cpu"][name] > 0, cluster["summary"]["publish"]


def test_everything_it_started_is_stopped_and_its_files_removed(report):
    _, stderr_lines = report
    pids = started_pids(stderr_lines)
    assert len(pids) == 5, stderr_lines  # one node, three nodes and etcd
    assert [pid for pid in pids if not gone(pid)] == []
    assert not os.path.exists(working_directory(stderr_lines))


def test_the_table_names_each_phase_system_and_ratio():
    command = [sys.executable, "-m", "benchmarks.cluster_throughput", "--messages", str(MESSAGES), "--rounds", "1",
               "--systems", "single,cluster"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{MESSAGES:,} persistent messages of 100 bytes per phase"), lines
    assert lines[1].split() == [
        "phase", "brokerd", "single", "brokerd", "cluster", "cluster/RabbitMQ", "cluster/single"]
    for line, phase in zip(lines[2:5], PHASES):
        words = line.split()
        assert words[0] == phase and words[-2] == "n/a" and float(words[-1]) > 0, line


def test_a_run_stopped_halfway_stops_everything_it_started():
    command = [sys.executable, "-m", "benchmarks.cluster_throughput", "--messages", "1000000", "--systems",
               "single,cluster"]
    lines = stopped_once_measuring(command)
    assert "cluster_throughput: interrupted; everything it started is stopped\n" in lines
    pids = started_pids(lines)
    assert len(pids) == 5, lines
    assert [pid for pid in pids if not gone(pid)] == []
    assert not os.path.exists(working_directory(lines))
