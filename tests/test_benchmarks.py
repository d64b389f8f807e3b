"""Small runs of the benchmarks, so they keep working: correctness, not speed.

Each runs as its own process, as users start it (it runs and stops a reactor).
"""

import json
import pathlib
import subprocess
import sys

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
