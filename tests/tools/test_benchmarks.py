"""Small runs of the benchmarks, so they keep working: correctness, not speed.

Each runs as its own process, as users start it (it runs and stops a reactor).
The broker's CPU figures they print are checked to be there and possible, and
the helper that reads them (L{brokerd.loadgen.process_cpu}) against real busy processes.
"""

import base64
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from brokerd.loadgen.process_cpu import CLOCK_TICKS_PER_SECOND, CpuWindow, cpu_seconds
from brokerd.loadgen.process_memory import PeakResidentMemory, resident_bytes, tree_resident_bytes
from brokerd.testing import BrokerProcess
from spark_jobs.analysis import STEPS
from tests.support.paths import ROOT
from tests.support.spark_driver import spark_environment

pytestmark = pytest.mark.long_module(seconds=85)  # started early (tests/conftest.py)



PHASES = ("publish", "consume", "together")
# Two readings of /proc/PID/stat, each in whole clock ticks: a phase's CPU seconds are exact to about two ticks.
READING_SLACK_SECONDS = 2.5 / CLOCK_TICKS_PER_SECOND


def run_benchmark(module, *args):
    result = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def assert_possible_cores(cores, seconds, what):
    """C{cores} busy over a phase of C{seconds}: not negative, and no more than this machine has."""
    assert cores is not None, what
    assert 0 <= cores * seconds <= (os.cpu_count() or 1) * seconds + READING_SLACK_SECONDS, (what, cores, seconds)


def assert_broker_cpu_in_each_phase(results):
    """
    Every phase of a throughput run carries the cores the broker kept busy: no more than exist, and
    some in a phase of at least five of /proc's clock ticks, long enough for them to see it.
    """
    for phase in PHASES:
        cores = results[f"{phase}_broker_cpu"]
        seconds = results["messages"] / results[f"{phase}_per_s"]
        assert_possible_cores(cores, seconds, phase)
        if seconds * CLOCK_TICKS_PER_SECOND >= 5:
            assert cores > 0, (phase, results)


def test_native_throughput_benchmark_moves_every_message_once_in_order():
    output = run_benchmark(
        "benchmarks.native_throughput", "--messages", "3000", "--window", "500", "--prefetch", "200", "--json"
    )
    results = json.loads(output)
    assert results["messages"] == 3000
    for phase in ("publish", "consume", "together"):
        assert results[f"{phase}_per_s"] > 0
    assert_broker_cpu_in_each_phase(results)


def test_amqp_throughput_benchmark_moves_every_message_once_in_order():
    output = run_benchmark(
        "benchmarks.amqp_throughput", "--messages", "3000", "--window", "500", "--prefetch", "200", "--json"
    )
    results = json.loads(output)
    assert results["messages"] == 3000
    for phase in ("publish", "consume", "together"):
        assert results[f"{phase}_per_s"] > 0
    assert_broker_cpu_in_each_phase(results)


def test_amqp_throughput_benchmark_scrapes_metrics_and_the_management_api_while_it_measures():
    output = run_benchmark(
        "benchmarks.amqp_throughput", "--messages", "3000", "--window", "500", "--prefetch", "200",
        "--scrape-every", "0.02", "--json"
    )
    results = json.loads(output)
    assert results["messages"] == 3000 and results["scrapes"] >= 1
    for phase in ("publish", "consume", "together"):
        assert results[f"{phase}_per_s"] > 0
    assert_broker_cpu_in_each_phase(results)


@pytest.fixture(scope="module")
def running_broker(tmp_path_factory):
    """A broker the benchmarks reach with --connect."""
    broker = BrokerProcess(["--backend=memory", "--native", "tcp:0:interface=127.0.0.1"],
                           tmp_path_factory.mktemp("connected-broker"))
    yield broker
    broker.stop()


def test_amqp_throughput_benchmark_reads_the_cpu_of_a_connected_broker_only_when_told_its_pid(running_broker):
    address = running_broker.wait_listening("AMQP")
    arguments = ("benchmarks.amqp_throughput", "--messages", "3000", "--window", "500", "--prefetch", "200",
                 "--connect", address)
    results = json.loads(run_benchmark(*arguments, "--broker-pid", str(running_broker.process.pid), "--json"))
    assert_broker_cpu_in_each_phase(results)
    table = run_benchmark(*arguments)
    phase_lines = [line.split() for line in table.splitlines()[1:]]
    assert [(line[0], line[-4:]) for line in phase_lines] == [
        (phase, ["broker", "n/a", "cores", "busy"]) for phase in PHASES
    ], table


def test_amqp_throughput_benchmark_measures_durable_and_quorum_queues_with_persistent_messages(tmp_path):
    broker = BrokerProcess(["--backend=chunked", "--data-dir", str(tmp_path / "data")], tmp_path)
    try:
        address = broker.wait_listening("AMQP")
        host, port = broker.wait_address("HTTP API")
        for queue_type in ("classic", "quorum"):
            results = json.loads(run_benchmark(
                "benchmarks.amqp_throughput", "--messages", "2000", "--window", "500", "--prefetch", "200",
                "--queue-type", queue_type, "--connect", address, "--json"))
            assert results["queue_type"] == queue_type
            assert all(results[f"{phase}_per_s"] > 0 for phase in PHASES), results
            request = urllib.request.Request(f"http://{host}:{port}/api/queues/%2F/benchmark-amqp-{queue_type}")
            request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
            with urllib.request.urlopen(request, timeout=30) as response:
                queue = json.load(response)
            assert (queue["type"], queue["durable"], queue["messages"]) == (queue_type, True, 0), queue
    finally:
        broker.stop()
    stats = json.loads(broker.wait_for_output("store stats at stop: ").split("store stats at stop: ", 1)[1])
    assert stats["appends"] == 2 * 2 * 2000, stats  # persistent: every message of both phases of both queues stored


def test_native_throughput_benchmark_reports_no_cpu_for_a_connected_broker_without_its_pid(running_broker):
    endpoint = running_broker.wait_listening("native protocol")
    results = json.loads(run_benchmark("benchmarks.native_throughput", "--messages", "1000", "--window", "500",
                                       "--prefetch", "200", "--connect", endpoint, "--json"))
    assert results["publish_per_s"] > 0
    assert [results[f"{phase}_broker_cpu"] for phase in PHASES] == [None, None, None]


BURNER = """
import sys, time
def burn(cpu_seconds):
    until = time.process_time() + cpu_seconds
    while time.process_time() < until:
        pass
for line in sys.stdin:  # each line: CPU seconds to burn, then say so
    burn(float(line))
    print("burnt", flush=True)
"""


@pytest.fixture
def burner():
    """A process that burns as many CPU seconds as it is sent on a line, then answers "burnt"."""
    process = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    yield process
    process.stdin.close()
    process.wait(timeout=30)


def burn(process, seconds):
    process.stdin.write(f"{seconds}\n")
    process.stdin.flush()
    assert process.stdout.readline() == "burnt\n"


def test_process_cpu_counts_what_a_busy_process_burnt(burner):
    burn(burner, 0.05)  # the interpreter has started and is ready
    window = CpuWindow(burner.pid).start()
    burn(burner, 0.3)
    used = window.cpu_seconds()
    assert 0.3 - READING_SLACK_SECONDS <= used <= 0.3 + 0.2, used
    assert 0 < window.cores_busy() <= 1 + READING_SLACK_SECONDS / 0.3, "one thread keeps at most one core busy"
    assert cpu_seconds(burner.pid) >= 0.35 - READING_SLACK_SECONDS


def test_process_cpu_counts_the_processes_a_process_started():
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURNER!r}])"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        burn(parent, 0.3)  # done by its child, which shares its pipes
        assert cpu_seconds(parent.pid) >= 0.3 - READING_SLACK_SECONDS
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)


def test_process_cpu_of_a_finished_process_or_of_none_is_unknown():
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait(timeout=30)  # reaped: its pid names no process
    assert cpu_seconds(finished.pid) is None
    window = CpuWindow(None).start()
    assert window.cpu_seconds() is None and window.cores_busy() is None


HOLDER = """
import sys
held = bytearray(int(sys.argv[1]) << 20)  # zero-filled: every page touched
print("holding", flush=True)
sys.stdin.readline()
"""


def test_resident_memory_counts_what_the_processes_a_process_started_hold():
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOLDER!r}, '64'])"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert parent.stdout.readline() == "holding\n"  # said by its child, which shares its pipes
        own = resident_bytes(parent.pid)
        assert own is not None and 0 < own < 64 << 20, own
        assert tree_resident_bytes(parent.pid) >= own + (64 << 20)
        peak = PeakResidentMemory(parent.pid, interval=0.01).start()
        assert peak.sampled.wait(30)  # a sample taken while the child holds it
        parent.stdin.write("done\n")
        parent.stdin.flush()
        parent.wait(timeout=30)
        assert peak.stop() >= own + (64 << 20)
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
    assert resident_bytes(parent.pid) is None and tree_resident_bytes(parent.pid) is None


def test_validation_spark_benchmark_checks_generated_runs_and_reports_the_driver_memory():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.validation_spark", "--messages", "2000", "--backends", "sqlite,chunked",
         "--driver-memory", "1g"], cwd=ROOT, env=spark_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads(result.stdout)
    assert results["verdict"] == "pass", "the generated runs are ones a correct broker could have made"
    # Per message: publish, confirm, 1.5 consumed queues of deliver and settle, and 1 in 50 nacked and redelivered.
    assert results["events_per_backend"] == {"sqlite": 10_080, "chunked": 10_080}
    assert results["out"] is None, "the temporary runs are deleted"
    assert 0 < results["spark_seconds"] <= results["job_wall_seconds"]
    assert set(results["spark_step_seconds"]) == {"session", *STEPS}
    assert results["peak_driver_rss_mib"] > 100, "a Python driver and a Spark JVM"


def installed_durable_backends():
    from crashloop.loop import DURABLE_BACKENDS, backend_installed

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
        for figure in ("publish_per_s", "publish_mb_per_s", "commits_per_s", "consume_per_s", "holding_rss_mb",
                       "recovered_rss_mb"):
            assert row[figure] > 0, (figure, row)
        if row["sync"] == "none":
            assert row["fsyncs"] == 0, row
        else:
            assert row["fsyncs_per_s"] > 0, row
        for phase in ("publish", "recover", "consume"):
            seconds = row[f"{phase}_s"]
            assert_possible_cores(row[f"{phase}_broker_cpu"], seconds, (phase, row))
        assert row["recover_broker_cpu"] > 0, "starting a broker takes CPU"
    for phase in ("publish", "consume"):  # one short phase may fall within a clock tick, all of them not
        assert sum(row[f"{phase}_broker_cpu"] * row[f"{phase}_s"] for row in rows) > 0, (phase, rows)


def test_store_throughput_benchmark_restarts_after_a_kill_with_every_confirmed_message():
    backends = installed_durable_backends()
    if not backends:
        pytest.skip("no durable backend is installed")
    output = run_benchmark("benchmarks.store_throughput", "--backends", backends[-1], "--sync", "always",
                           "--sizes", "100", "--messages", "500", "--window", "100", "--prefetch", "100",
                           "--ack-every", "10", "--kill", "--json")
    [row] = json.loads(output)
    assert (row["fsyncs"], row["commits"], row["fsyncs_per_s"]) == (None, None, None), "a killed broker logs no stats"
    assert row["holding_rss_mb"] > 0 and row["recover_s"] > 0
    assert row["consume_per_s"] > 0, "the consumer checked every confirmed message came back, in order"


def test_crash_loop_benchmark_survives_a_kill():
    backends = installed_durable_backends()
    if not backends:
        pytest.skip("no durable backend is installed")
    output = run_benchmark("crashloop", "--backend", backends[0], "--kills", "1",
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
        [sys.executable, "-m", "fuzz", "--seconds", "3", "--seed", "1"],
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
