"""The backlog alarm: x-backlog-alarm or a policy's backlog-alarm; a warning once when a queue's ready count goes
above it, an info line once when it is back at or below it, and the state for metrics."""

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from brokerd.errors import PreconditionFailed
from brokerd.model.policy_effects import Policy
from tests.support.broker import open_channel, publish


@pytest.fixture
def alarms():
    """The backlog alarm's log lines, as (level, text)."""
    lines = []

    def observe(event):
        if event.get("log_namespace") == "brokerd.model.backlog_alarm":
            lines.append((event["log_level"].name, formatEvent(event)))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


def test_crossing_above_warns_once_and_falling_back_says_so_once(broker, alarms):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-backlog-alarm": 2})
    queue = broker.vhost("/").queues["q"]
    assert (queue.backlog_alarm, queue.backlog_alarmed) == (2, False)
    publish(channel, "q", b"1", b"2")
    assert alarms == [] and not queue.backlog_alarmed
    publish(channel, "q", b"3", b"4", b"5")
    assert alarms == [("warn", "queue 'q' in vhost '/' has 3 messages ready, above its backlog alarm of 2")]
    assert queue.backlog_alarmed
    for _ in range(3):
        channel.basic_get("q", no_ack=True)
    assert alarms[1:] == [("info", "queue 'q' in vhost '/' has 2 messages ready, no longer above its backlog alarm"
                                   " of 2")]
    assert not queue.backlog_alarmed
    publish(channel, "q", b"6")
    assert len(alarms) == 3 and queue.backlog_alarmed


def test_purge_expiry_and_requeue_move_the_alarm_too(broker, clock, alarms):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-backlog-alarm": 1, "x-message-ttl": 1000})
    queue = broker.vhost("/").queues["q"]
    publish(channel, "q", b"1", b"2")
    assert queue.backlog_alarmed
    clock.advance(1.5)
    assert not queue.backlog_alarmed
    publish(channel, "q", b"3", b"4")
    channel.queue_purge("q")
    assert not queue.backlog_alarmed
    publish(channel, "q", b"5")
    tag = channel.basic_get("q")[0]
    publish(channel, "q", b"6")
    channel.basic_reject(tag, requeue=True)
    assert queue.backlog_alarmed
    assert [level for level, _ in alarms] == ["warn", "info", "warn", "info", "warn"]


def test_a_queue_whose_consumer_keeps_up_stays_quiet(broker, clock, alarms):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments={"x-backlog-alarm": 0})
    channel.basic_consume("q", "c", no_ack=True)
    clock.advance(0)
    publish(channel, "q", b"1", b"2")
    assert len(peer.deliveries) == 2
    assert alarms == []


def test_the_policy_key_and_the_lower_of_it_and_the_argument(broker, alarms):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.queue_declare("q-own", arguments={"x-backlog-alarm": 1})
    publish(channel, "q", b"1", b"2")
    vhost = broker.vhost("/")
    vhost.set_policies([Policy("/", "p", "^q", {"backlog-alarm": 3})])
    assert (vhost.queues["q"].backlog_alarm, vhost.queues["q-own"].backlog_alarm) == (3, 1)
    vhost.set_policies([Policy("/", "p", "^q", {"backlog-alarm": 1})])
    assert vhost.queues["q"].backlog_alarmed  # the lower threshold is crossed at once
    vhost.set_policies([])
    assert vhost.queues["q"].backlog_alarm is None and not vhost.queues["q"].backlog_alarmed
    assert alarms == [
        ("warn", "queue 'q' in vhost '/' has 2 messages ready, above its backlog alarm of 1"),
        ("info", "queue 'q' in vhost '/' has 2 messages ready, no longer above its backlog alarm"),
    ]


@pytest.mark.parametrize("value, reason", [
    (-1, "-1 is outside at least 0"),
    ("10", "'10' is not a whole number"),
])
def test_an_invalid_threshold_is_refused_with_406(broker, value, reason):
    channel, _ = open_channel(broker)
    with pytest.raises(PreconditionFailed) as refused:
        channel.queue_declare("q", arguments={"x-backlog-alarm": value})
    where = "queue 'q' in vhost '/'"
    assert str(refused.value) == f"406 PRECONDITION_FAILED - invalid arg 'x-backlog-alarm' for {where}: {reason}"
