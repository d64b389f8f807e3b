"""The Spark job over synthetic runs (tests/support/spark_events.py): one clean run and
runs with planted faults, analysed together once per module (Spark takes
seconds to start), then checked against what the synthetic events imply.

Each planted fault must be found by its check alone, with the message named;
the clean run must pass everything, including the crash it went through
(a lost unconfirmed message, an ack lost to the crash), and so must the same
run squeezed into under half a second; the cross-backend checks must see the
runs that differ; the figures must equal what the timestamps give, and the
throughput series must average to the mean rates. The command line's usage
errors are checked without Spark.
"""

import json
import math
import pathlib
import subprocess
import sys

import pytest

from spark_jobs import events
from spark_jobs.analysis import analyse_runs
from spark_jobs.figures import BUCKET_WIDTHS, EVENTS_PER_BUCKET, MAX_POINTS, bucket_count, bucket_seconds
from spark_jobs.settings import WorkloadSettings
from spark_jobs.tables import RunInputError, stage_runs
from tests.support.paths import ROOT
from tests.support.spark_driver import spark_session
from tests.support.spark_events import FAULT_MESSAGES, PARKED, SyntheticRun, write_lines

pytestmark = pytest.mark.long_module(seconds=65)  # started early (tests/conftest.py)

RUN_CHECKS, CROSS_CHECKS = events.BACKEND_CHECKS, events.CROSS_BACKEND_CHECKS

# Label -> the faults planted in it, as (check that must find it, message it must name).
PLANTED = {
    "clean": [],
    "duplicate": [("no_unflagged_duplicates", FAULT_MESSAGES["duplicate"])],
    "reorder": [("order_per_publisher_and_priority", FAULT_MESSAGES["reorder"])],
    "lost": [("confirmed_delivered_or_stored", FAULT_MESSAGES["lost"])],
    "damaged": [("delivered_bodies_match", FAULT_MESSAGES["body_mismatch"]),
                ("acked_not_redelivered", FAULT_MESSAGES["redelivery_after_ack"]),
                ("stored_matches_published", FAULT_MESSAGES["stored_after_last_ack"])],
    "short": [],
}
# The clean scenario played ten times faster: a run of under half a second.
TIME_SCALES = {"short": 0.1}
PLANTERS = {
    "duplicate": ["plant_duplicate"],
    "reorder": ["plant_reorder"],
    "lost": ["plant_lost_message"],
    "damaged": ["plant_body_mismatch", "plant_redelivery_after_ack", "plant_stored_after_last_ack"],
}
SETTINGS = WorkloadSettings(messages=40, queues=2, crash_every=24)


@pytest.fixture(scope="module")
def spark():
    session = spark_session(driver_memory="1g")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def validation(spark, tmp_path_factory):
    """The summary of all synthetic runs, and the events each run wrote."""
    out = tmp_path_factory.mktemp("validation")
    written, runs = {}, {}
    for label in PLANTED:
        run = SyntheticRun(label, time_scale=TIME_SCALES.get(label, 1.0))
        for planter in PLANTERS.get(label, []):
            getattr(run, planter)()
        written[label] = run.write(out / "runs" / label)
        runs[label] = run
    summary = analyse_runs(spark, out, list(PLANTED), SETTINGS)
    return summary, written, runs, out


def of_kind(lines, kind):
    return [line for line in lines if line["kind"] == kind]


def nearest_rank(values, fraction):
    """percentile_approx on a small list: the value at rank ceil(fraction * n)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(round(fraction * len(ordered), 9))) - 1]


def test_the_summary_is_json_with_a_failing_verdict_and_every_check(validation):
    summary, _, _, out = validation
    assert json.loads(json.dumps(summary)) == summary
    assert summary["verdict"] == "fail"
    assert summary["settings"] == SETTINGS.to_json()
    assert list(summary["backends"]) == list(PLANTED)
    for backend in summary["backends"].values():
        assert list(backend["checks"]) == list(RUN_CHECKS)
    assert list(summary["cross_backend"]["checks"]) == list(CROSS_CHECKS)
    assert not (out / "spark-work").exists()


def test_the_clean_run_passes_every_check_and_checks_something(validation):
    summary, written, runs, _ = validation
    checks = summary["backends"]["clean"]["checks"]
    assert all(check["pass"] and check["violations"] == 0 and check["examples"] == []
               for check in checks.values()), checks
    run = runs["clean"]
    confirmed_pairs = sum(len(message.queues) for message in run.messages.values() if message.confirm)
    delivered_pairs = {(line["message_id"], line["queue"]) for line in of_kind(written["clean"], events.DELIVER)}
    acked_pairs = {(line["message_id"], line["queue"]) for line in of_kind(written["clean"], events.ACK)}
    assert checks["confirmed_delivered_or_stored"]["checked"] == confirmed_pairs
    assert checks["no_unflagged_duplicates"]["checked"] == len(delivered_pairs)
    assert checks["acked_not_redelivered"]["checked"] == len(acked_pairs)
    assert checks["delivered_bodies_match"]["checked"] == len(of_kind(written["clean"], events.DELIVER))
    assert checks["stored_matches_published"]["checked"] == len(run.stored)
    # Every pair's first delivery came unflagged (the two recovered after the crash were delivered before it).
    assert checks["order_per_publisher_and_priority"]["checked"] == len(delivered_pairs)


@pytest.mark.parametrize("label", [label for label in PLANTED if label != "clean"])
def test_each_planted_fault_is_found_by_its_check_alone(validation, label):
    summary, _, _, _ = validation
    checks = summary["backends"][label]["checks"]
    expected = dict(PLANTED[label])
    for name, check in checks.items():
        if name in expected:
            assert not check["pass"] and check["violations"] == 1, (name, check)
            assert len(check["examples"]) == 1 and expected[name] in check["examples"][0], (name, check)
        else:
            assert check["pass"] and check["violations"] == 0, (name, check)


def test_the_cross_backend_checks_see_the_runs_that_differ(validation):
    summary, _, _, _ = validation
    cross = summary["cross_backend"]["checks"]
    assert all(not check["pass"] and check["violations"] == 1 for check in cross.values()), cross
    [missing] = cross["same_messages"]["examples"]
    assert FAULT_MESSAGES["lost"] in missing and missing.endswith("but not on lost")
    [bodies] = cross["same_bodies"]["examples"]
    assert FAULT_MESSAGES["body_mismatch"] in bodies and "damaged" in bodies
    [sequence] = cross["same_queue_sequences"]["examples"]
    assert sequence.startswith("on reorder, " + FAULT_MESSAGES["reorder"])
    assert cross["same_bodies"]["checked"] == 40  # every message id published


def test_run_figures_count_the_events_and_the_lost_ack(validation):
    summary, written, runs, out = validation
    for label, lines in written.items():
        run = summary["backends"][label]["run"]
        confirms = of_kind(lines, events.CONFIRM)
        assert run["published"] == len(of_kind(lines, events.PUBLISH)) == 40
        assert run["confirmed"] == sum(line["ok"] for line in confirms) == 38
        assert run["nacked_by_broker"] == 1
        assert run["delivered"] == len(of_kind(lines, events.DELIVER))
        assert run["redelivered"] == sum(line["redelivered"] for line in of_kind(lines, events.DELIVER))
        assert (run["acked"], run["nacked"], run["rejected"]) == (
            len(of_kind(lines, events.ACK)), len(of_kind(lines, events.NACK)), len(of_kind(lines, events.REJECT)))
        assert run["stored"] == len(runs[label].stored) + len(runs[label].extra_stored)
        assert run["crashes"] == 1
        recorded = json.loads((out / "runs" / label / events.RUN_FILE).read_text())
        assert run["wall_seconds"] == pytest.approx(recorded["wall_seconds"])
        # Delivered again after the restart: an ack lost to the crash, not a failure.
        assert run["acks_lost_to_crash"] == 1


@pytest.mark.parametrize("span, counted", [(0.0, 1), (0.05, 80), (0.45, 80), (0.9, 1_300), (3.0, 80), (3.0, None),
                                           (3.0, 10_000), (600.0, 2_500_000), (36_000.0, 10), (7 * 86_400.0, None)])
def test_the_bucket_width_fits_the_runs_length(span, counted):
    """Spans from nothing to a week, with few events or many (None: no limit from the count)."""
    width = bucket_seconds(span, counted)
    points = bucket_count(span, width)
    assert width in BUCKET_WIDTHS or width % BUCKET_WIDTHS[-1] == 0
    assert points <= MAX_POINTS
    if span > 1:
        assert points >= 20, (span, counted, width)
    elif span >= 0.05:
        assert points >= 5, (span, counted, width)  # a short run still gets a series, of 10 or 20 ms buckets
    # Plenty of events get the finest buckets that keep within MAX_POINTS.
    if counted is None or counted >= EVENTS_PER_BUCKET * MAX_POINTS:
        finer = [candidate for candidate in BUCKET_WIDTHS if candidate < width]
        assert not finer or bucket_count(span, finer[-1]) > MAX_POINTS


def test_the_bucket_width_keeps_every_length_within_its_bounds():
    """From 0.2 s to a month, 7% apart: never over MAX_POINTS, never under 20 points past a second."""
    span = 0.2
    while span < 30 * 86_400:
        for counted in (10, 2_000, 50_000, 10_000_000):
            points = bucket_count(span, bucket_seconds(span, counted))
            assert points <= MAX_POINTS and (span <= 1 or points >= 20), (span, counted, points)
        span *= 1.07


def test_throughput_is_counted_per_bucket_from_the_first_event(validation):
    summary, written, _, _ = validation
    for label, lines in written.items():
        figures = summary["backends"][label]["throughput"]
        first, last = min(line["t"] for line in lines), max(line["t"] for line in lines)
        publishes, deliveries = of_kind(lines, events.PUBLISH), of_kind(lines, events.DELIVER)
        width = figures["bucket_seconds"]
        assert width == bucket_seconds(last - first, len(publishes) + len(deliveries))
        expected = {}
        for line in publishes + deliveries:
            row = expected.setdefault(math.floor((line["t"] - first) / width), [0, 0, 0, 0])
            offset = 0 if line["kind"] == events.PUBLISH else 1
            row[offset] += 1
            row[offset + 2] += line["size"]
        series = figures["series"]
        assert len(series) == bucket_count(last - first, width)
        assert [point["start_s"] for point in series] == pytest.approx([index * width for index in range(len(series))])
        for index, point in enumerate(series):
            counts = expected.get(index, [0, 0, 0, 0])
            assert [point[field] for field in ("published", "delivered", "published_bytes", "delivered_bytes")] \
                == counts
            assert point["publish_msgs_per_s"] == pytest.approx(counts[0] / width)
            assert point["deliver_msgs_per_s"] == pytest.approx(counts[1] / width)
            assert point["publish_mb_per_s"] == pytest.approx(counts[2] / 1e6 / width)
            assert point["deliver_mb_per_s"] == pytest.approx(counts[3] / 1e6 / width)
        done = max(line["t"] for line in publishes + of_kind(lines, events.CONFIRM))
        span = done - min(line["t"] for line in publishes)
        assert figures["publish_msgs_per_s"] == pytest.approx(len(publishes) / span)
        assert figures["publish_mb_per_s"] == pytest.approx(sum(line["size"] for line in publishes) / span / 1e6)
        assert figures["publish_active_s"] == pytest.approx(
            [min(line["t"] for line in publishes) - first, done - first])
        span = max(line["t"] for line in deliveries) - min(line["t"] for line in deliveries)
        assert figures["deliver_msgs_per_s"] == pytest.approx(len(deliveries) / span)
        assert figures["deliver_mb_per_s"] == pytest.approx(sum(line["size"] for line in deliveries) / span / 1e6)


def test_a_run_over_a_second_and_one_under_get_series_of_many_points(validation):
    summary, written, _, _ = validation
    clean, short = summary["backends"]["clean"]["throughput"], summary["backends"]["short"]["throughput"]
    spans = {label: max(line["t"] for line in written[label]) - min(line["t"] for line in written[label])
             for label in ("clean", "short")}
    assert spans["clean"] > 4 and spans["short"] < 0.5
    assert len(clean["series"]) >= 20
    assert len(short["series"]) >= 20 and short["bucket_seconds"] < clean["bucket_seconds"]
    # The same run, ten times faster, publishes ten times as many messages a second.
    assert short["publish_msgs_per_s"] == pytest.approx(10 * clean["publish_msgs_per_s"])


@pytest.mark.parametrize("kind", ["publish", "deliver"])
def test_the_series_averages_to_the_mean_rate_over_the_active_span(validation, kind):
    """
    The buckets a kind's active span touches hold all its events and cover the
    span, sticking out by less than one bucket at either end; so their
    average rate is at most the mean rate and short of it by less than
    2 * width / span of it (figures.py's docstring). Here that is under 10%.
    """
    summary, _, _, _ = validation
    for label, backend in summary["backends"].items():
        figures = backend["throughput"]
        width, (start, end) = figures["bucket_seconds"], figures[f"{kind}_active_s"]
        touched = figures["series"][math.floor(start / width):math.floor(end / width) + 1]
        tolerance = 2 * width / (end - start)
        assert tolerance < 0.1, (label, width, end - start)
        for unit in ("msgs", "mb"):
            mean = figures[f"{kind}_{unit}_per_s"]
            average = sum(point[f"{kind}_{unit}_per_s"] for point in touched) / len(touched)
            assert mean * (1 - tolerance) < average <= mean * (1 + 1e-9), (label, unit, average, mean)


def expected_latencies(lines):
    published = {line["message_id"]: line["t"] for line in of_kind(lines, events.PUBLISH)}
    confirm = [(line["t"] - published[line["message_id"]]) * 1000 for line in of_kind(lines, events.CONFIRM)]
    first_delivery = {}
    for line in of_kind(lines, events.DELIVER):
        key = (line["message_id"], line["queue"])
        first_delivery[key] = min(first_delivery.get(key, (line["epoch"], line["t"])), (line["epoch"], line["t"]))
    end_to_end = [(t - published[message_id]) * 1000 for (message_id, _), (_, t) in first_delivery.items()]
    return {"confirm": confirm, "end_to_end": end_to_end}


def test_latency_percentiles_and_cdf_follow_the_timestamps(validation):
    summary, written, _, _ = validation
    for label, lines in written.items():
        for measure, values in expected_latencies(lines).items():
            figures = summary["backends"][label]["latency_ms"][measure]
            assert figures["count"] == len(values)
            for name, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                assert figures[name] == pytest.approx(nearest_rank(values, fraction), abs=1e-3), (label, measure)
            assert figures["max"] == pytest.approx(max(values), abs=1e-3)
            cdf = figures["cdf"]
            assert cdf[0] == [pytest.approx(min(values), abs=1e-3), 0.0]
            assert len(cdf) == 101 and cdf[-1] == [pytest.approx(max(values), abs=1e-3), 1.0]
            assert [point[0] for point in cdf] == sorted(point[0] for point in cdf)
            assert cdf[25][0] == pytest.approx(nearest_rank(values, 0.25), abs=1e-3)
    # The synthetic confirm latencies are 1..13 ms.
    assert summary["backends"]["clean"]["latency_ms"]["confirm"]["max"] == pytest.approx(13.0, abs=1e-3)


def test_a_single_run_passes_the_cross_backend_checks_with_nothing_checked(spark, tmp_path):
    SyntheticRun("solo").write(tmp_path / "runs" / "solo")
    summary = analyse_runs(spark, tmp_path, ["solo"], SETTINGS)
    assert summary["verdict"] == "pass"
    assert summary["cross_backend"]["checks"] == {
        name: {"pass": True, "checked": 0, "violations": 0, "examples": []} for name in CROSS_CHECKS}


def test_a_reference_run_without_an_export_is_checked_on_what_its_events_show(spark, tmp_path):
    SyntheticRun("sqlite").write(tmp_path / "runs" / "sqlite")
    reference = SyntheticRun("rabbitmq")
    reference.plant_lost_message()
    run_dir = tmp_path / "runs" / "rabbitmq"
    reference.write(run_dir)
    (run_dir / events.EXPORT_FILE).unlink()
    facts = json.loads((run_dir / events.RUN_FILE).read_text())
    (run_dir / events.RUN_FILE).write_text(json.dumps({**facts, "kind": "reference", "topology": {"parked": [PARKED]},
                                                       "notes": ["crash runs skipped"]}))
    summary = analyse_runs(spark, tmp_path, ["sqlite", "rabbitmq"], SETTINGS)
    entry = summary["backends"]["rabbitmq"]
    assert (summary["backends"]["sqlite"]["kind"], entry["kind"]) == ("backend", "reference")
    assert entry["notes"] == ["crash runs skipped"] and entry["run"]["stored"] is None
    assert entry["checks"]["stored_matches_published"]["applicable"] is False
    # Pairs routed to the parked queue are left out: only an export would show them.
    confirmed = [message for message in reference.messages.values() if message.confirm]
    parked = [message for message in confirmed if PARKED in message.queues]
    lost = entry["checks"]["confirmed_delivered_or_stored"]
    assert lost["checked"] == sum(len(message.queues) for message in confirmed) - len(parked)
    assert lost["note"].startswith(f"{len(parked)} confirmed (message, queue) pairs routed to parked queues (parked)")
    assert (lost["pass"], lost["violations"]) == (False, 1) and FAULT_MESSAGES["lost"] in lost["examples"][0]
    # The parked pairs in sqlite's export count as agreeing with the reference; the lost one does not.
    same = summary["cross_backend"]["checks"]["same_messages"]
    assert (same["pass"], same["violations"]) == (False, 1) and FAULT_MESSAGES["lost"] in same["examples"][0]
    assert "rabbitmq" in same["note"] and summary["verdict"] == "fail"


def test_a_line_that_is_not_an_event_is_refused_naming_the_runs(spark, tmp_path):
    SyntheticRun("sqlite").write(tmp_path / "runs" / "sqlite")
    with open(tmp_path / "runs" / "sqlite" / "events" / "consumer-0.jsonl", "a") as file:
        file.write('{"kind": "ack", "message_id": "p0-000000001", "t": "yesterday"}\n')
    with pytest.raises(RunInputError, match="sqlite.*not JSON with the fields and types of spark_jobs.events"):
        analyse_runs(spark, tmp_path, ["sqlite"], SETTINGS)


def test_events_lacking_required_fields_are_refused_with_their_count(spark, tmp_path):
    SyntheticRun("sqlite").write(tmp_path / "runs" / "sqlite")
    write_lines(tmp_path / "runs" / "sqlite" / "events" / "consumer-9.jsonl", [
        {"kind": "deliver", "client": "consumer-9", "session": 0, "epoch": 0, "n": 0, "t": 1.0, "queue": "q0"}])
    with pytest.raises(RunInputError, match="run sqlite: 1 deliver events lack one of message_id"):
        analyse_runs(spark, tmp_path, ["sqlite"], SETTINGS)


def test_a_run_without_an_export_is_refused(spark, tmp_path):
    SyntheticRun("filelog").write(tmp_path / "runs" / "filelog")
    (tmp_path / "runs" / "filelog" / events.EXPORT_FILE).unlink()
    with pytest.raises(RunInputError, match="has no export.jsonl"):
        stage_runs(spark, tmp_path / "runs", ["filelog"], tmp_path / "work")


def validate(*args, cwd):
    return subprocess.run([sys.executable, "-m", "spark_jobs.validate_backends", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("backends, message", [
    ("sqlite,nosuch", "unknown backend 'nosuch'; known backends: "),
    ("sqlite,,chunked", "--backends needs comma-separated backend names"),
    ("chunked:chunk_size=1M,chunked", "backend 'chunked' is given twice in --backends"),
    ("filelog:no_such_option=1", "backend 'filelog' has no option 'no_such_option'"),
    ("chunked:chunk_size=lots", "backend 'chunked': option chunk_size: 'lots' is not a size"),
    ("sqlite,memory", "backend 'memory' keeps nothing on disk"),
])
def test_a_bad_backend_list_is_a_usage_error_before_anything_runs(tmp_path, backends, message):
    result = validate("--backends", backends, "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "report").exists()


def test_reusing_runs_that_do_not_exist_is_a_usage_error(tmp_path):
    result = validate("--backends", "sqlite", "--reuse-runs", "--out", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "--reuse-runs: there is no run of sqlite in" in result.stderr


def test_keeping_exports_needs_reused_runs_that_have_one(tmp_path):
    root = ROOT
    result = validate("--backends", "sqlite", "--keep-exports", "--out", str(tmp_path), cwd=root)
    assert result.returncode == 2
    assert "--keep-exports only goes with --reuse-runs" in result.stderr
    SyntheticRun("sqlite").write(tmp_path / "runs" / "sqlite")
    (tmp_path / "runs" / "sqlite" / events.EXPORT_FILE).unlink()
    result = validate("--backends", "sqlite", "--reuse-runs", "--keep-exports", "--out", str(tmp_path), cwd=root)
    assert result.returncode == 2
    assert "--keep-exports: the run of sqlite in" in result.stderr and "has no export.jsonl" in result.stderr
    assert not (tmp_path / "summary.json").exists()


def test_a_run_whose_store_cannot_be_exported_stops_before_spark(tmp_path):
    SyntheticRun("sqlite").write(tmp_path / "runs" / "sqlite")  # events, but no broker data directory
    result = validate("--backends", "sqlite", "--reuse-runs", "--out", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 3
    assert "validation not carried out: exporting the sqlite store of" in result.stderr
    assert not (tmp_path / "summary.json").exists()
