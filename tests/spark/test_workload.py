"""The workload runner of the cross-backend validation (spark_jobs.workload).

The plan is checked alone (same seed, same messages; routes and settle
decisions as specified) and against a real broker (each planned message lands
in exactly the queues the plan names). Then small real runs, a real ``twistd
brokerd`` driven by real clients in their own processes (the pipelining ones,
and pika), are read back the way the Spark job reads them: the run directory
and every event line as L{spark_jobs.events} says, the CPU each side used, one
run with a SIGKILL in the middle (sqlite, with either client) and one without
(chunked, through the command line).
"""

import collections
import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pika
import pytest

from brokerd.testing import BrokerProcess
from spark_jobs import events
from spark_jobs.brokers import broker_arguments
from spark_jobs.clients import PUBLISH_WINDOW
from spark_jobs.plan import (
    MAX_NACKS,
    build_topology,
    check_settings,
    publisher_message_count,
    publisher_messages,
    settle_decision,
    topic_matches,
)
from spark_jobs.settings import WorkloadSettings
from spark_jobs.workload import WorkloadFailed, declare_topology, main, run_workload

PLAN = WorkloadSettings(seed=7, messages=3000, sizes=(1, 40, 700, 5000), queues=3, parked_queues=2, publishers=3,
                        max_priority=5)


def plan_of(settings):
    topology = build_topology(settings)
    return [message for publisher in range(settings.publishers)
            for message in publisher_messages(settings, topology, publisher)]


# -- the plan alone


def test_the_same_seed_plans_the_same_messages_and_another_seed_others():
    first, again = plan_of(PLAN), plan_of(PLAN)
    assert first == again
    other = plan_of(dataclasses.replace(PLAN, seed=8))
    assert [message.message_id for message in other] == [message.message_id for message in first]
    assert sum(a.body != b.body or a.routing_key != b.routing_key for a, b in zip(first, other)) > len(first) // 2


def test_the_plan_draws_sizes_priorities_and_routes_from_the_settings():
    messages = plan_of(PLAN)
    assert len(messages) == PLAN.messages
    assert [publisher_message_count(PLAN, number) for number in range(3)] == [1000, 1000, 1000]
    assert len({message.message_id for message in messages}) == len(messages)
    assert {message.size for message in messages} == set(PLAN.sizes)
    assert {message.priority for message in messages} == set(range(PLAN.max_priority + 1))
    assert {message.exchange for message in messages} == {"wl.direct", "wl.fanout", "wl.topic", "wl.headers"}
    assert all(message.queues and list(message.queues) == sorted(set(message.queues)) for message in messages)
    assert any(len(message.queues) >= 2 for message in messages)
    parked = [message for message in messages if set(message.queues) & {"wl.parked0", "wl.parked1"}]
    assert 0 < len(parked) < len(messages) // 10
    bodies = collections.Counter(message.body for message in messages if message.size >= 40)
    assert max(bodies.values()) == 1, "bodies of 40 bytes and more are all different"
    for message in messages[:50]:
        assert message.body.startswith(message.message_id.encode()[:message.size])


def test_topic_patterns_match_as_amqp_says():
    assert topic_matches("t.q1.*", "t.q1.hot")
    assert not topic_matches("t.q1.*", "t.q1.hot.more")
    assert topic_matches("#.hot", "t.q1.hot") and topic_matches("#", "") and topic_matches("a.#.b", "a.b")
    assert not topic_matches("#.hot", "t.q1.plain")


def test_settle_decisions_follow_the_shares_and_stop_nacking_after_the_cap():
    settings = WorkloadSettings(seed=3, nack_share=0.2, reject_share=0.1)
    decisions = [settle_decision(settings, f"p0-{seq:09d}", "wl.q0", 0) for seq in range(5000)]
    assert decisions == [settle_decision(settings, f"p0-{seq:09d}", "wl.q0", 0) for seq in range(5000)]
    counts = collections.Counter(decisions)
    assert 850 < counts[events.NACK] < 1150 and 400 < counts[events.REJECT] < 600, counts
    capped = {settle_decision(settings, f"p0-{seq:09d}", "wl.q0", MAX_NACKS) for seq in range(2000)}
    assert capped == {events.ACK, events.REJECT}
    never = WorkloadSettings(nack_share=0.0, reject_share=0.0)
    assert {settle_decision(never, f"p1-{seq:09d}", "wl.q2", 0) for seq in range(500)} == {events.ACK}


def test_bad_settings_and_arguments_get_errors_that_name_them(tmp_path):
    with pytest.raises(ValueError, match="publishers must be a whole number of at least 1"):
        check_settings(WorkloadSettings(publishers=0))
    with pytest.raises(ValueError, match="nack_share \\+ reject_share must be at most 1"):
        check_settings(WorkloadSettings(nack_share=0.7, reject_share=0.6))
    with pytest.raises(ValueError, match="unknown backend 'nosuch'"):
        run_workload("nosuch", WorkloadSettings(), tmp_path / "run")
    with pytest.raises(TypeError, match="settings must be a WorkloadSettings"):
        run_workload("sqlite", {"messages": 10}, tmp_path / "run")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / events.RUN_FILE).write_text("{}")
    with pytest.raises(ValueError, match="already holds a run"):
        run_workload("sqlite", WorkloadSettings(), tmp_path / "used")


def test_the_command_line_names_a_bad_backend_and_exits_1(tmp_path, capsys):
    assert main(["--backend", "nosuch:x=1", "--out", str(tmp_path / "run"), "--messages", "10"]) == 1
    assert "workload: unknown backend 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["--backend", "sqlite", "--out", str(tmp_path / "run"), "--sizes", "0"])
    assert exited.value.code == 2 and "every size must be at least 1 byte" in capsys.readouterr().err
    for flag, value, named in (("--messages", "many", "--messages: must be a whole number, not 'many'"),
                               ("--nack-share", "lots", "--nack-share: a share is a number between 0 and 1")):
        with pytest.raises(SystemExit) as exited:
            main(["--backend", "sqlite", "--out", str(tmp_path / "run"), flag, value])
        assert exited.value.code == 2 and named in capsys.readouterr().err


# -- the plan against a real broker


def test_every_planned_message_reaches_exactly_the_queues_the_plan_names(tmp_path):
    settings = WorkloadSettings(seed=5, messages=400, sizes=(20,), queues=3, parked_queues=2, publishers=1)
    topology = build_topology(settings)
    planned = list(publisher_messages(settings, topology, 0))
    with open(tmp_path / "broker.log", "w") as log:
        broker = BrokerProcess(broker_arguments("memory", tmp_path / "data"), tmp_path, log=log)
        try:
            connection = pika.BlockingConnection(pika.ConnectionParameters(*broker.wait_address("AMQP")))
            channel = connection.channel()
            declare_topology(channel, topology)
            channel.confirm_delivery()
            for message in planned:
                channel.basic_publish(message.exchange, message.routing_key, message.body, pika.BasicProperties(
                    message_id=message.message_id, headers=message.headers, delivery_mode=2), mandatory=True)
            landed = collections.defaultdict(list)
            for queue in topology.all_queues:
                while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
                    landed[got[1].message_id].append(queue)
            connection.close()
        finally:
            broker.stop()
    assert {message.message_id: tuple(message.queues) for message in planned} == \
        {identifier: tuple(sorted(queues)) for identifier, queues in landed.items()}
    assert any(len(message.queues) > 1 for message in planned)


# -- real runs


def read_events(run_dir):
    """Every event line of a run, by client file, each checked against the fields events.py lists."""
    by_client = {}
    for path in sorted((run_dir / events.EVENTS_DIRECTORY).glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for number, line in enumerate(lines):
            assert line["kind"] in events.EVENT_KINDS, line
            expected = set(events.COMMON_FIELDS) | set(events.KIND_FIELDS[line["kind"]])
            assert set(line) == expected, (path.name, line)
            for name, value in line.items():
                kind = events.EVENT_FIELDS[name]
                assert isinstance(value, kind) and (kind is bool or not isinstance(value, bool)), (name, line)
            assert line["n"] == number and line["client"] == path.stem, line
        by_client[path.stem] = lines
    return by_client


def check_run(run_dir, result, backend, settings):
    """What every run must leave; returns the events by kind."""
    assert json.loads((run_dir / events.RUN_FILE).read_text()) == result
    assert result["backend"] == backend and result["label"] == backend.split(":")[0]
    assert WorkloadSettings.from_json(result["settings"]) == settings
    assert result["topology"]["queues"] and result["broker_stop_status"] in (0, -15)
    assert "store stats at stop" in (run_dir / events.BROKER_LOG).read_text()
    assert any((run_dir / events.DATA_DIRECTORY).iterdir())
    by_client = read_events(run_dir)
    assert set(by_client) == {f"publisher-{n}" for n in range(settings.publishers)} | {
        f"consumer-{n}" for n in range(settings.consumers)}
    by_kind = collections.defaultdict(list)
    for lines in by_client.values():
        for line in lines:
            assert line["backend"] == result["label"]
            by_kind[line["kind"]].append(line)
        for earlier, later in zip(lines, lines[1:]):
            assert (earlier["session"], earlier["epoch"]) <= (later["session"], later["epoch"]), (earlier, later)
            assert later["t"] >= earlier["t"] - 0.001
    times = [line["t"] for lines in by_kind.values() for line in lines]
    assert result["started"] <= result["workload_started"] <= min(times)
    assert max(times) <= result["workload_ended"] <= result["ended"]
    assert result["wall_seconds"] == pytest.approx(result["workload_ended"] - result["workload_started"])
    published = {line["message_id"]: line for line in by_kind[events.PUBLISH]}
    assert len(published) == len(by_kind[events.PUBLISH]) == settings.messages
    # The publishers, each in its own process, sent what the plan made here says.
    planned = {message.message_id: message for message in plan_of(settings)}
    for identifier, line in published.items():
        message = planned[identifier]
        assert (line["exchange"], line["routing_key"], tuple(line["queues"]), line["size"], line["priority"],
                line["body_sha256"]) == (message.exchange, message.routing_key, message.queues, message.size,
                                         message.priority, hashlib.sha256(message.body).hexdigest())
    for kind in (events.CONFIRM, events.DELIVER, *events.SETTLE_KINDS):
        assert all(line["message_id"] in published for line in by_kind[kind]), kind
    for line in by_kind[events.DELIVER]:
        publish = published[line["message_id"]]
        assert line["queue"] in publish["queues"] and line["queue"] in result["topology"]["queues"], line
        assert (line["body_sha256"], line["size"]) == (publish["body_sha256"], publish["size"])
    for line in by_kind[events.CONFIRM]:
        assert (line["publisher"], line["seq"]) == (published[line["message_id"]]["publisher"],
                                                    published[line["message_id"]]["seq"])
    assert len(by_kind[events.DELIVER]) == sum(len(by_kind[kind]) for kind in events.SETTLE_KINDS)
    # Both sides' CPU over the workload was measured, and no more than this machine's cores could give.
    cpu = result["cpu"]
    assert cpu["wall_seconds"] == pytest.approx(result["wall_seconds"], abs=0.01)
    assert cpu["client_seconds"] == pytest.approx(sum(c["cpu_ms"] for c in result["clients"].values()) / 1000)
    for side in ("broker_seconds", "client_seconds"):
        assert 0 < cpu[side] <= (os.cpu_count() or 1) * cpu["wall_seconds"] + 1, (side, cpu)
    return by_kind


def final_settles(by_kind):
    """(message id, queue) -> the last settle of that message from that queue, by time."""
    last = {}
    for line in sorted((line for kind in events.SETTLE_KINDS for line in by_kind[kind]), key=lambda l: l["t"]):
        last[line["message_id"], line["queue"]] = line["kind"]
    return last


@pytest.mark.parametrize("client", ["fast", "pika"])
def test_a_run_with_a_sigkill_in_the_middle_records_the_crash_and_the_clients_reconnect(tmp_path, client):
    # Publishers keep at most PUBLISH_WINDOW unconfirmed each, so by the crash at 2500 publishes
    # at least 2500 - 2 * PUBLISH_WINDOW were confirmed by the broker that was killed.
    assert 2500 - 2 * PUBLISH_WINDOW >= 100
    settings = WorkloadSettings(seed=11, messages=4000, sizes=(50, 3000), queues=2, parked_queues=1,
                                publishers=2, consumers=2, prefetch=20, nack_share=0.05, reject_share=0.05,
                                crash_every=2500, client=client)
    lines = []
    result = run_workload("sqlite", settings, tmp_path, progress=lines.append)
    by_kind = check_run(tmp_path, result, "sqlite", settings)
    assert result["crashes"] == [{"epoch": 0, "t": result["crashes"][0]["t"], "published_before": 2500}]
    assert [epoch["epoch"] for epoch in result["epochs"]] == [0, 1]
    assert len(set(result["ports"]["amqp"])) == 2
    assert lines and "crashes 1" in lines[-1]
    # Everything published after the crash went to the new broker, in a later session.
    assert collections.Counter(line["epoch"] for line in by_kind[events.PUBLISH]) == {0: 2500, 1: 1500}
    assert all(line["session"] == line["epoch"] for line in by_kind[events.PUBLISH])
    assert all(line["t"] < result["crashes"][0]["t"] for line in by_kind[events.PUBLISH] if line["epoch"] == 0)
    # Consumers were all consuming before the first publish, so the crash cut them off too.
    assert all(line["session"] == line["epoch"] for line in by_kind[events.DELIVER])
    assert {line["epoch"] for line in by_kind[events.DELIVER]} >= {1}
    for client, counters in result["clients"].items():
        after = {line["session"] for line in by_kind[events.PUBLISH] if line["client"] == client and line["epoch"]}
        if client.startswith("consumer") or after:
            assert counters["sessions"] == 2, (client, counters)
    # What the killed broker had confirmed is delivered from each of its consumed queues and settled for good.
    confirmed_before = [line for line in by_kind[events.CONFIRM] if line["ok"] and line["epoch"] == 0]
    assert len(confirmed_before) >= 2500 - 2 * PUBLISH_WINDOW
    settled = final_settles(by_kind)
    queues_of = {line["message_id"]: line["queues"] for line in by_kind[events.PUBLISH]}
    for line in confirmed_before:
        for queue in set(queues_of[line["message_id"]]) & set(result["topology"]["queues"]):
            assert settled.get((line["message_id"], queue)) in (events.ACK, events.REJECT), (line, queue)


def test_a_run_without_crashes_delivers_every_message_to_each_consumed_queue(tmp_path):
    run_dir = tmp_path / "chunked"
    command = [sys.executable, "-m", "spark_jobs.workload", "--backend", "chunked", "--out", str(run_dir),
               "--seed", "4", "--messages", "500", "--sizes", "10,2000", "--queues", "3", "--parked-queues", "1",
               "--publishers", "2", "--consumers", "2", "--nack-share", "0.1", "--reject-share", "0.05",
               "--max-priority", "3", "--progress"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    summary = json.loads(finished.stdout)
    assert summary["published"] == summary["confirmed"] == 500 and summary["crashes"] == 0
    assert "chunked: done, published 500/500" in finished.stderr
    result = json.loads((run_dir / events.RUN_FILE).read_text())
    settings = WorkloadSettings.from_json(result["settings"])
    assert settings.max_priority == 3 and settings.messages == 500
    by_kind = check_run(run_dir, result, "chunked", settings)
    assert result["crashes"] == [] and len(result["epochs"]) == 1
    assert all(line["ok"] for line in by_kind[events.CONFIRM]) and len(by_kind[events.CONFIRM]) == 500
    settled = final_settles(by_kind)
    expected = {(line["message_id"], queue) for line in by_kind[events.PUBLISH] for queue in line["queues"]
                if queue in result["topology"]["queues"]}
    assert set(settled) == expected
    assert set(settled.values()) <= {events.ACK, events.REJECT}
    assert by_kind[events.NACK] and by_kind[events.REJECT]
    redelivered = {(line["message_id"], line["queue"]) for line in by_kind[events.DELIVER] if line["delivery_count"]}
    assert {(line["message_id"], line["queue"]) for line in by_kind[events.NACK]} == redelivered
    assert all(line["redelivered"] for line in by_kind[events.DELIVER] if line["delivery_count"])
    assert all(line["queue"] not in result["topology"]["parked"] for line in by_kind[events.DELIVER])


def test_a_store_that_forgets_its_topology_in_a_crash_fails_the_run_with_the_reason(tmp_path):
    # The memory backend keeps nothing across a restart: the clients find their exchanges gone.
    settings = WorkloadSettings(seed=2, messages=200, sizes=(10,), crash_every=100, consumers=1)
    with pytest.raises(WorkloadFailed, match="client processes failed(.|\n)*NOT_FOUND - no (exchange|queue) 'wl"):
        run_workload("memory", settings, tmp_path)
    assert not (tmp_path / events.RUN_FILE).exists()
