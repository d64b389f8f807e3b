"""Small runs of the benchmarks, so they keep working: correctness, not speed.

Each runs as its own process, as users start it (it runs and stops a reactor).
"""

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.long_module(seconds=85)  # started early (tests/conftest.py)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_benchmark(module, *args):
    result = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_native_throughput_benchmark_moves_every_message_once_in_order():
    output = run_benchmark(
        "benchmarks.native_throughput", "--messages", "3000", "--window", "500", "--prefetch", "200", "--json"
    )
    results = json.loads(output)
    assert results["messages"] == 3000
    for phase in ("publish", "consume", "together"):
        assert results[f"{phase}_per_s"] > 0


def test_amqp_throughput_benchmark_moves_every_message_once_in_order():
    output = run_benchmark(
        "benchmarks.amqp_throughput", "--messages", "3000", "--window", "500", "--prefetch", "200", "--json"
    )
    results = json.loads(output)
    assert results["messages"] == 3000
    for phase in ("publish", "consume", "together"):
        assert results[f"{phase}_per_s"] > 0


def test_amqp_throughput_benchmark_scrapes_metrics_and_the_management_api_while_it_measures():
    output = run_benchmark(
        "benchmarks.amqp_throughput", "--messages", "3000", "--window", "500", "--prefetch", "200",
        "--scrape-every", "0.02", "--json"
    )
    results = json.loads(output)
    assert results["messages"] == 3000 and results["scrapes"] >= 1
    for phase in ("publish", "consume", "together"):
        assert results[f"{phase}_per_s"] > 0


def installed_durable_backends():
    from benchmarks.crash_loop import DURABLE_BACKENDS, backend_installed

    return [name for name in DURABLE_BACKENDS if backend_installed(name)]


def test_store_throughput_benchmark_reports_rates_and_fsyncs_for_each_backend_and_sync_mode():
    backends = installed_durable_backends()
    if not backends:
        pytest.skip("no durable backend is installed")
    syncs = ["always", "interval:20", "none"]
    output = run_benchmark(
        "benchmarks.store_throughput", "--backends", ",".join(backends), "--sync", ",".join(syncs),
        "--messages", "500", "--window", "100", "--prefetch", "100", "--ack-every", "10", "--json",
    )
    rows = json.loads(output)
    assert [(row["backend"], row["sync"], row["size"]) for row in rows] == [
        (backend, sync, size) for backend in backends for sync in syncs for size in (100, 65536)
    ]
    for row in rows:
        assert row["messages"] == (500 if row["size"] == 100 else 50)
        for figure in ("publish_per_s", "publish_mb_per_s", "commits_per_s", "consume_per_s"):
            assert row[figure] > 0, (figure, row)
        if row["sync"] == "none":
            assert row["fsyncs"] == 0, row
        else:
            assert row["fsyncs_per_s"] > 0, row


def test_crash_loop_benchmark_survives_a_kill():
    backends = installed_durable_backends()
    if not backends:
        pytest.skip("no durable backend is installed")
    output = run_benchmark("benchmarks.crash_loop", "--backend", backends[0], "--kills", "1",
                           "--max-kill-confirms", "300", "--json")
    results = json.loads(output)
    assert results["summary"]["kills"] == 1
    assert results["cycles"][0]["confirmed"] > 0
    cycle = results["cycles"][0]
    assert 0 <= cycle["acked_came_back"] <= min(cycle["recovered"], cycle["acks_sent"]), cycle
    assert results["summary"]["acked_came_back"] == cycle["acked_came_back"]


def test_delayed_delivery_benchmark_fires_every_message_and_every_probe_due_while_it_watches():
    output = run_benchmark("benchmarks.delayed_delivery", "--backend", "chunked", "--messages", "300",
                           "--max-delay", "0.5", "--observe", "4", "--probe-rate", "20", "--probe-max-delay", "0.5",
                           "--json")
    results = json.loads(output)
    assert results["messages"] == 300
    assert results["fired"] == 301, "the 300 and the final confirmed one, all due within the watch"
    assert results["rss_mb_holding_backlog"] > 0
    assert 0 <= results["backlog_lateness_ms_p50"] <= results["backlog_lateness_ms_p99"] \
        <= results["backlog_lateness_ms_max"]
    assert results["probes_published"] >= 10, "probes go out at 20/s for the first 1.5 s of the watch"
    assert results["probes_fired"] == results["probes_published"], "every probe is due 2 s before the watch ends"
    assert 0 <= results["lateness_ms_p50"] <= results["lateness_ms_p99"] <= results["lateness_ms_max"]


def test_fuzz_benchmark_prints_what_it_tried_and_found():
    # Exit status 1 means it found something (a death, traceback, canary failure, too much memory): a finding,
    # not a broken fuzzer.
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.fuzz", "--seconds", "3", "--seed", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for field in ("inputs tried:", "broker deaths:", "tracebacks in the broker log:", "canary failures:",
                  "peak RSS of the broker:", "restart after SIGKILL: started", "result:"):
        assert field in result.stdout, (field, result.stdout)
    assert int(result.stdout.split("inputs tried: ")[1].split()[0]) > 0


def test_migrate_benchmark_moves_a_store_and_reports_its_rates():
    output = run_benchmark("benchmarks.migrate", "--messages", "2000", "--from", "chunked", "--to", "sqlite", "--json")
    results = json.loads(output)
    assert (results["from"], results["to"], results["messages"]) == ("chunked", "sqlite", 2000)
    assert results["entries"] == 2200  # every 10th message is held by two queues
    assert results["copy_per_s"] > 0 and results["wall_mb_per_s"] > 0 and results["peak_rss_mib"] > 0


def test_http_api_benchmark_lists_every_queue():
    results = json.loads(run_benchmark("benchmarks.http_api", "--queues", "200", "--repeat", "2", "--json"))
    assert (results["queues"], results["listed"]) == (200, 200)
    assert results["fastest_ms"] > 0 and results["bytes"] > 0
