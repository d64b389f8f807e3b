"""The cross-backend validation against reference brokers (--reference NAME=URL).

A second brokerd, started apart from the runner and restarted by a command
(tests/support/reference_broker.py) as a RabbitMQ container would be, stands in for
an external broker. One validation plays the workload, with a crash point, on
sqlite and twice on the reference: once with a restart command (crashed and
restarted), once without (crash skipped, and said so). The reference gets its
own columns, the export checks are n/a on them, everything else is checked;
then a delivery removed from a reference's events must be reported. The
command line's refusals, the restart command's failures and the consumers'
count of returns without x-delivery-count are checked without Spark.
"""

import contextlib
import io
import json
import os
import pathlib
import shlex
import shutil
import sys

import pika
import pytest
from zope.interface.verify import verifyObject

from spark_jobs import events
from spark_jobs.brokers import (
    BrokerdProcess,
    ExternalBroker,
    IBrokerUnderTest,
    WorkloadFailed,
    parse_amqp_url,
)
from spark_jobs.client_logs import returns_before
from spark_jobs.plan import MAX_NACKS, settle_decision
from spark_jobs.settings import EXCHANGE_TYPES, WorkloadSettings
from spark_jobs.validate_backends import main
from spark_jobs.validation_options import parse_arguments
from spark_jobs.workload import NO_RESTART_NOTE
from tests.support.reference_broker import DetachedBroker, free_port
from tests.support.spark_driver import SUBMIT_ARGS

pytestmark = pytest.mark.long_module(seconds=120)  # started early (tests/conftest.py)

RESTARTED, UNRESTARTED = "restarted", "unrestarted"
EXPORT_CHECKS = events.EXPORT_CHECKS
OTHER_CHECKS = [name for name in events.BACKEND_CHECKS if name not in EXPORT_CHECKS]
# What an earlier run with other settings could have left on the broker: a consumed queue with other
# arguments and an old message, an exchange of another type, and a queue past this run's.
LEFTOVER_QUEUES = ("wl.q0", "wl.q4")


def validate(*arguments):
    """Runs the validation command in this process (one Spark JVM for the module); its status and output."""
    output = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        patch.setenv("PYSPARK_SUBMIT_ARGS", os.environ.get("PYSPARK_SUBMIT_ARGS", SUBMIT_ARGS))
        status = main([*arguments, "--driver-memory", "1g"])
    return status, output.getvalue()


def summary_of(out):
    return json.loads((out / "summary.json").read_text())


def plant_leftovers(url):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare("wl.q0", durable=True, arguments={"x-max-priority": 9})
    channel.basic_publish("", "wl.q0", b"left over", pika.BasicProperties(message_id="p0-000000000", delivery_mode=2))
    channel.exchange_declare("wl.direct", "fanout", durable=True)
    channel.queue_declare("wl.q4", durable=True)
    connection.close()


def workload_names_on(url):
    """The workload queues and exchanges the broker at C{url} holds (of those an earlier run could leave)."""
    found = []
    connection = pika.BlockingConnection(pika.URLParameters(url))
    for name, declare in [*((queue, "queue_declare") for queue in ("wl.q0", "wl.q1", "wl.q3", "wl.q4", "wl.parked0")),
                          *((f"wl.{kind}", "exchange_declare") for kind in EXCHANGE_TYPES)]:
        channel = connection.channel()
        try:
            getattr(channel, declare)(name, passive=True)
            found.append(name)
            channel.close()
        except pika.exceptions.ChannelClosedByBroker as closed:
            assert closed.reply_code == 404, closed
    connection.close()
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    broker = DetachedBroker.create(tmp_path_factory.mktemp("reference"), backend="sqlite")
    broker.start()
    try:
        broker.wait_listening()
        yield broker
    finally:
        broker.kill()


def reference_arguments(broker):
    restart = (f"{shlex.quote(sys.executable)} -m tests.support.reference_broker restart"
               f" {shlex.quote(str(broker.state_dir))}")
    return ["--backends", "sqlite", "--reference", f"{RESTARTED}={broker.url}",
            "--reference-restart", f"{RESTARTED}={restart}", "--reference", f"{UNRESTARTED}={broker.url}",
            "--messages", "300", "--crash-every", "150"]


@pytest.fixture(scope="module")
def validation(reference, tmp_path_factory):
    plant_leftovers(reference.url)
    out = tmp_path_factory.mktemp("validation")
    status, output = validate(*reference_arguments(reference), "--out", str(out))
    return out, status, output, workload_names_on(reference.url)


def test_each_reference_is_a_column_of_its_own_with_the_export_checks_not_applicable(validation):
    out, status, output, _ = validation
    assert status == 0, output
    summary = summary_of(out)
    assert summary["verdict"] == "pass"
    assert list(summary["backends"]) == ["sqlite", RESTARTED, UNRESTARTED]
    assert summary["backends"]["sqlite"]["kind"] == "backend"
    for label in (RESTARTED, UNRESTARTED):
        entry = summary["backends"][label]
        assert entry["kind"] == "reference"
        assert entry["run"]["published"] == 300 and entry["run"]["confirmed"] > 0
        assert entry["run"]["stored"] is None
        for name in EXPORT_CHECKS:
            check = entry["checks"][name]
            assert check["applicable"] is False and "not exported" in check["reason"], check
        for name in OTHER_CHECKS:
            check = entry["checks"][name]
            assert check.get("applicable", True) and check["pass"] and check["checked"] > 0, (label, name, check)
        assert "parked queue" in entry["checks"]["confirmed_delivered_or_stored"]["note"]
    assert all(check["pass"] for check in summary["cross_backend"]["checks"].values())
    assert RESTARTED in summary["cross_backend"]["checks"]["same_messages"]["note"]
    assert f"\n{UNRESTARTED} " in output and "n/a: stored_matches_published" in output
    assert (out / "report.html").stat().st_size > 0


def test_a_crash_point_runs_the_restart_command_and_the_run_goes_on_with_the_next_epoch(validation, reference):
    out, status, output, _ = validation
    assert status == 0, output
    assert summary_of(out)["backends"][RESTARTED]["run"]["crashes"] == 1
    run_dir = out / "runs" / RESTARTED
    run = json.loads((run_dir / events.RUN_FILE).read_text())
    assert run["kind"] == "reference"
    assert run["url"] == f"amqp://guest:****@127.0.0.1:{reference.port}/"
    assert "tests.support.reference_broker restart" in run["restart_command"]
    assert [crash["published_before"] for crash in run["crashes"]] == [150]
    assert run["ports"]["amqp"] == [reference.port, reference.port] and run["notes"] == []
    assert "restarted the reference broker" in (run_dir / events.BROKER_LOG).read_text()
    assert not (run_dir / events.EXPORT_FILE).exists()
    epochs = {json.loads(line)["epoch"] for path in (run_dir / events.EVENTS_DIRECTORY).glob("*.jsonl")
              for line in path.read_text().splitlines()}
    assert epochs == {0, 1}


def test_without_a_restart_command_the_crash_points_are_skipped_and_the_summary_says_so(validation):
    out, status, output, _ = validation
    assert status == 0, output
    entry = summary_of(out)["backends"][UNRESTARTED]
    assert entry["run"]["crashes"] == 0 and entry["notes"] == [NO_RESTART_NOTE]
    assert summary_of(out)["backends"]["sqlite"]["run"]["crashes"] == 1
    assert f"{UNRESTARTED} (reference): crash runs skipped: no --reference-restart" in output
    run = json.loads((out / "runs" / UNRESTARTED / events.RUN_FILE).read_text())
    assert run["restart_command"] is None and len(run["epochs"]) == 1


def test_the_reference_starts_and_ends_each_run_without_the_workloads_queues_and_exchanges(validation):
    out, status, output, left = validation
    assert status == 0, output
    assert left == []
    log = (out / "runs" / RESTARTED / events.BROKER_LOG).read_text()
    deleted_before = next(line for line in log.splitlines() if "deleted before the run" in line)
    assert all(name in deleted_before for name in (*LEFTOVER_QUEUES, "wl.direct"))
    # The old message in wl.q0 was not delivered: every delivery's body is its publish's.
    assert summary_of(out)["backends"][RESTARTED]["checks"]["delivered_bodies_match"]["pass"]


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_confirmed_message_the_reference_never_delivered_is_reported(validation, reference, tmp_path):
    out, status, output, _ = validation
    assert status == 0, output
    shutil.copytree(out / "runs", tmp_path / "runs")
    events_dir = tmp_path / "runs" / RESTARTED / events.EVENTS_DIRECTORY
    lines = {path: read_lines(path) for path in events_dir.glob("*.jsonl")}
    every = [line for file_lines in lines.values() for line in file_lines]
    confirmed = {line["message_id"] for line in every if line["kind"] == events.CONFIRM and line["ok"]}
    victim = next(line for line in every if line["kind"] == events.PUBLISH and line["message_id"] in confirmed
                  and len(line["queues"]) == 1 and line["queues"][0].startswith("wl.q"))
    for path, file_lines in lines.items():
        kept = [line for line in file_lines
                if not (line["kind"] == events.DELIVER and line["message_id"] == victim["message_id"])]
        path.write_text("".join(json.dumps(line) + "\n" for line in kept))

    status, output = validate(*reference_arguments(reference), "--out", str(tmp_path), "--reuse-runs")
    assert status == 1, output
    summary = summary_of(tmp_path)
    lost = summary["backends"][RESTARTED]["checks"]["confirmed_delivered_or_stored"]
    assert (lost["pass"], lost["violations"]) == (False, 1), lost
    assert victim["message_id"] in lost["examples"][0] and victim["queues"][0] in lost["examples"][0]
    for label, entry in summary["backends"].items():
        failed = [name for name, check in entry["checks"].items() if not check["pass"]]
        assert failed == (["confirmed_delivered_or_stored"] if label == RESTARTED else []), (label, failed)
    assert summary["verdict"] == "fail" and "fail: confirmed_delivered_or_stored" in output


# -- without Spark


@pytest.mark.parametrize("arguments, message", [
    (["--reference", "sqlite=amqp://127.0.0.1/"], "--reference name 'sqlite' is also a backend in --backends"),
    (["--reference", "amqp://127.0.0.1/"], "--reference takes NAME=URL"),
    (["--reference", "my ref=amqp://127.0.0.1/"], "--reference name 'my ref' must be letters, digits"),
    (["--reference", "ref=http://127.0.0.1/"], "is not an amqp:// URL"),
    (["--reference", "ref=amqps://127.0.0.1/"], "is not an amqp:// URL"),
    (["--reference", "ref=amqp://127.0.0.1/", "--reference", "ref=amqp://127.0.0.2/"],
     "--reference 'ref' is given twice"),
    (["--reference", "ref=amqp://127.0.0.1/", "--reference-restart", "other=true"],
     "--reference-restart 'other' names no --reference (references: ref)"),
    (["--reference", "ref=amqp://127.0.0.1/", "--reference-restart", "ref=true", "--reference-restart", "ref=true"],
     "--reference-restart 'ref' is given twice"),
])
def test_a_bad_reference_is_a_usage_error(tmp_path, capsys, arguments, message):
    with pytest.raises(SystemExit) as exited:
        parse_arguments(["--backends", "sqlite", "--out", str(tmp_path), *arguments])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_a_restart_command_keeps_its_spaces_and_equals_signs(tmp_path):
    arguments = parse_arguments(["--backends", "sqlite", "--out", str(tmp_path), "--reference",
                                 "rabbitmq=amqp://guest:guest@127.0.0.1:5672/%2F", "--reference-restart",
                                 "rabbitmq=docker restart -t 0 rabbit && echo a=b"])
    [reference] = arguments.references
    assert (reference.label, reference.restart_command) == ("rabbitmq", "docker restart -t 0 rabbit && echo a=b")


def test_reusing_a_backend_run_as_a_reference_is_a_usage_error(tmp_path, capsys):
    for label, kind in (("sqlite", "backend"), ("ref", "backend")):
        (tmp_path / "runs" / label / events.EVENTS_DIRECTORY).mkdir(parents=True)
        (tmp_path / "runs" / label / events.RUN_FILE).write_text(json.dumps({"kind": kind}))
    with pytest.raises(SystemExit) as exited:
        parse_arguments(["--backends", "sqlite", "--out", str(tmp_path), "--reuse-runs",
                         "--reference", "ref=amqp://127.0.0.1/"])
    assert exited.value.code == 2 and "is a backend run, and the command line makes ref a reference" in \
        capsys.readouterr().err


def test_urls_read_as_pika_reads_them_and_the_password_is_masked():
    address = parse_amqp_url("amqp://user:s%40cret@rabbit.example:5673/%2F")
    assert (address.host, address.port, address.username, address.password, address.virtual_host) == (
        "rabbit.example", 5673, "user", "s@cret", "/")
    assert address.masked_url == "amqp://user:****@rabbit.example:5673/%2F"
    assert parse_amqp_url("amqp://127.0.0.1/staging").login == {
        "host": "127.0.0.1", "username": "guest", "password": "guest", "virtual_host": "staging"}
    assert parse_amqp_url("amqp://127.0.0.1").port == 5672 and parse_amqp_url("amqp://127.0.0.1").virtual_host == "/"


def test_both_brokers_under_test_play_the_same_role(tmp_path):
    assert verifyObject(IBrokerUnderTest, BrokerdProcess("sqlite", tmp_path / "data", tmp_path, "sqlite"))
    assert verifyObject(IBrokerUnderTest, ExternalBroker(parse_amqp_url("amqp://127.0.0.1/"), None, "ref"))


@pytest.fixture
def broker_log(tmp_path):
    with open(tmp_path / "broker.log", "w", encoding="utf-8") as log:
        yield log


def nothing_listening():
    """An amqp:// URL of a loopback port nobody listens on."""
    return parse_amqp_url(f"amqp://127.0.0.1:{free_port()}/")


def test_a_failing_restart_command_fails_the_run_with_its_output(broker_log):
    broker = ExternalBroker(nothing_listening(), "echo 'Error: No such container: rabbit' >&2; exit 7", "ref")
    with pytest.raises(WorkloadFailed, match="ref: amqp://127.0.0.1:[0-9]+/ took no AMQP connection"):
        ExternalBroker(broker.address, None, "ref", reach_timeout=0.3).start(broker_log)
    broker.log = broker_log  # as start() would have set it, had the broker been there
    with pytest.raises(WorkloadFailed, match="exited with status 7; its output:\nError: No such container: rabbit"):
        broker.crash()
    hanging = ExternalBroker(broker.address, "echo stuck; sleep 60", "ref", restart_timeout=0.3)
    hanging.log = broker_log
    with pytest.raises(WorkloadFailed, match="did not end within 0 s; its output:\nstuck"):
        hanging.crash()
    assert "No such container" in pathlib.Path(broker_log.name).read_text()


def test_without_x_delivery_count_a_consumer_counts_its_own_returns_and_stops_nacking():
    assert returns_before({"x-delivery-count": 2}, own_returns=0) == 2
    assert returns_before({"other": 1}, own_returns=1) == 1 and returns_before(None, own_returns=0) == 0
    settings = WorkloadSettings(nack_share=1.0, reject_share=0.0)
    own, decisions = 0, []
    while len(decisions) < 10:
        decisions.append(settle_decision(settings, "p0-000000001", "wl.q0", returns_before(None, own)))
        if decisions[-1] != events.NACK:
            break
        own += 1
    assert decisions == [events.NACK] * MAX_NACKS + [events.ACK]
