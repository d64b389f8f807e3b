"""A small run of ``benchmarks.versus_rabbitmq`` with brokerd alone on two backends (RabbitMQ is left out: CI has
none), as its own process, as users start it. It must report every backend, row and round, with every publish
confirmed and every message consumed, each node on the backend asked for, and stop everything it started, also
when it is stopped halfway."""

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.tools.benchmark_runs import gone, started_pids, stopped_once_measuring, working_directory

pytestmark = pytest.mark.long_module(seconds=15)

ROWS = ("publish", "consume", "together", "large_publish")
BACKENDS = ("chunked", "sqlite")
MESSAGES, LARGE_MESSAGES, LARGE_SIZE = 2000, 300, 65536
ROUNDS = 2
BENCHMARK = [sys.executable, "-m", "benchmarks.versus_rabbitmq", "--backends", ",".join(BACKENDS), "--no-rabbitmq"]
COMMAND = BENCHMARK + ["--messages", str(MESSAGES), "--rounds", str(ROUNDS), "--large-messages", str(LARGE_MESSAGES),
                       "--window", "500", "--prefetch", "200"]


@pytest.fixture(scope="module")
def report():
    result = subprocess.run(COMMAND + ["--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout), result.stderr.splitlines()


def test_every_backend_row_and_round_is_reported_with_every_confirm_and_delivery(report):
    results, _ = report
    assert (results["messages"], results["size"], results["rounds"], results["queue_type"]) == (
        MESSAGES, 100, ROUNDS, "quorum")
    assert results["large"] == {"messages": LARGE_MESSAGES, "size": LARGE_SIZE, "window": 500}
    assert list(results["systems"]) == [f"brokerd/{backend}" for backend in BACKENDS]
    for backend in BACKENDS:
        system = results["systems"][f"brokerd/{backend}"]
        assert (system["label"], list(system["pids"]), system["replicas"]) == (f"brokerd/{backend}", ["brokerd"], None)
        assert system["store"].startswith(f"{backend} (") and system["store"].endswith(", sync always"), system
        assert len(system["rounds"]) == ROUNDS
        for result in system["rounds"]:
            # publish and together publish N each; consume and together consume N each; then the large ones
            assert (result["confirmed"], result["consumed"], result["large_confirmed"]) == (
                2 * MESSAGES, 2 * MESSAGES, LARGE_MESSAGES)
            for row in ROWS:
                cpu = result[f"{row}_cpu"]
                assert cpu["nodes_total"] == pytest.approx(sum(cpu["nodes"].values())), cpu
                assert cpu["idle_systems"] is not None, cpu  # the other backend's node, idle meanwhile
        for row in ROWS:
            summary = system["summary"][row]
            assert 0 < summary["min_per_s"] <= summary["per_s"] <= summary["max_per_s"], summary
            assert summary["nodes_cpu"] >= 0 and summary["client_cpu"] > 0, summary
        # /proc counts CPU in 10 ms ticks: the shortest phases may read 0, the large messages' may not
        assert system["summary"]["large_publish"]["nodes_cpu"] > 0, system["summary"]
        assert results["ratios"][backend] == {row: None for row in ROWS}  # no RabbitMQ to compare with


def test_everything_it_started_is_stopped_and_its_files_removed(report):
    _, stderr_lines = report
    pids = started_pids(stderr_lines)
    assert len(pids) == len(BACKENDS), stderr_lines
    assert [pid for pid in pids if not gone(pid)] == []
    assert not os.path.exists(working_directory(stderr_lines))


def test_the_rounds_alternate_the_order_of_the_systems(report):
    _, stderr_lines = report
    rounds = [line.strip() for line in stderr_lines if line.startswith("round ")]
    assert rounds == ["round 1: brokerd/chunked", "round 1: brokerd/sqlite",
                      "round 2: brokerd/sqlite", "round 2: brokerd/chunked"]


def test_the_table_has_each_row_per_backend_beside_rabbitmq():
    result = subprocess.run(BENCHMARK + ["--messages", str(MESSAGES), "--rounds", "1", "--large-messages", "100"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"persistent messages to a durable quorum queue: {MESSAGES:,} of 100 bytes per phase,"
                               f" 100 of 65,536 bytes in the last row; window 2,000 (2,000 in the last row)"), lines
    for backend in BACKENDS:
        at = lines.index(f"{'row':<32}{f'brokerd/{backend} msg/s':>28}{'RabbitMQ quorum msg/s':>28}{'ratio':>7}"
                         f"{'brokerd cores busy':>20}{'RabbitMQ cores busy':>21}{'client cores':>15}")
        table = lines[at + 1:at + 6]
        labels = ("publish with confirms (100 B)", "consume", "both at once", "publish with confirms (64 KiB)")
        for line, label in zip(table, labels):
            figures = line.removeprefix(label).split()
            assert line.startswith(label) and float(figures[0].replace(",", "")) > 0, line
            # brokerd's msg/s (slowest-fastest), RabbitMQ's n/a, the ratio n/a, the cores of brokerd, RabbitMQ (n/a)
            # and of the client while measuring brokerd / RabbitMQ (n/a)
            assert figures[2:4] == ["n/a", "n/a"] and figures[5] == "n/a" and figures[7:] == ["/", "n/a"], line
            assert float(figures[4]) >= 0 and float(figures[6]) > 0, line
        assert table[4] == f"brokerd/{backend} runs on {backend}, sync always"


def test_a_run_stopped_halfway_stops_everything_it_started():
    lines = stopped_once_measuring(BENCHMARK + ["--messages", "1000000"])
    assert "versus_rabbitmq: interrupted; everything it started is stopped\n" in lines
    pids = started_pids(lines)
    assert len(pids) == len(BACKENDS), lines
    assert [pid for pid in pids if not gone(pid)] == []
    assert not os.path.exists(working_directory(lines))
