"""The disk alarm's timer and thresholds on a task.Clock, its reading of --disk-free-limit in
RabbitMQ's forms, what an AMQP client is told when it blocks publishers beside the memory
watermark, and native publishers held by it. (A real full file system:
tests/process/test_disk_alarm.py.)"""

import errno
import sqlite3

import pytest
from pamqp import body, commands, frame, header
from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from brokerd.amqp.server import AmqpServerFactory
from brokerd.model.disk_alarm import (
    ALARMED_CHECK_SECONDS, MAX_CHECK_SECONDS, MIN_CHECK_SECONDS, WRITE_FAILURE_MARGIN, DiskAlarm,
)
from brokerd.process.disk_monitor import FreeSpaceMonitor, parse_disk_free_limit
from brokerd.process.tap import Options
from tests.support.broker import (
    amqp_frames_in, amqp_server_past_start_ok, make_broker, native_publisher,
)

MB = 1000 * 1000


class Disk:
    """Free bytes a test sets, measured by the monitor; an OSError to raise instead, if set."""

    def __init__(self, free):
        self.free = free
        self.error = None
        self.measures = 0

    def measure(self):
        self.measures += 1
        if self.error is not None:
            raise self.error
        return self.free


def monitored(free, limit=50 * MB):
    clock, disk, alarm = task.Clock(), Disk(free), DiskAlarm(limit)
    monitor = FreeSpaceMonitor(alarm, "/data", clock, disk.measure)
    monitor.start()
    return clock, disk, alarm, monitor


def test_far_from_the_limit_the_free_space_is_measured_every_ten_seconds():
    clock, disk, alarm, _ = monitored(free=100 * 1000 * MB)
    assert (alarm.free, alarm.blocked, disk.measures) == (100 * 1000 * MB, False, 1)
    clock.advance(MAX_CHECK_SECONDS - 0.01)
    assert disk.measures == 1
    clock.advance(0.01)
    assert disk.measures == 2


def test_close_to_the_limit_it_is_measured_sooner_and_the_alarm_is_raised_below_it():
    clock, disk, alarm, _ = monitored(free=60 * MB)  # 10 MB to go: 2 * 10 MB / 250 MB/s = 0.08 s
    clock.advance(MIN_CHECK_SECONDS)
    assert disk.measures == 2
    disk.free = 50 * MB  # at the limit: not below it
    clock.advance(MIN_CHECK_SECONDS)
    assert not alarm.blocked
    disk.free = 50 * MB - 1
    clock.advance(MIN_CHECK_SECONDS)
    assert alarm.blocked


def test_a_raised_alarm_is_measured_every_second_and_clears_at_the_limit():
    clock, disk, alarm, _ = monitored(free=10 * MB)
    assert alarm.blocked
    resumed = []
    alarm.when_unblocked(lambda: resumed.append(True))
    disk.free = 50 * MB - 1
    clock.advance(ALARMED_CHECK_SECONDS)
    assert alarm.blocked and resumed == []
    disk.free = 50 * MB
    clock.advance(ALARMED_CHECK_SECONDS - 0.01)
    assert alarm.blocked
    clock.advance(0.01)
    assert not alarm.blocked and resumed == [True]
    alarm.when_unblocked(lambda: resumed.append("at once"))
    assert resumed == [True, "at once"]


def full_disk():
    return Failure(OSError(errno.ENOSPC, "No space left on device"))


def test_a_write_refused_for_want_of_space_raises_the_alarm_at_once_and_it_clears_only_with_room_to_spare():
    clock, disk, alarm, monitor = monitored(free=5 * MB, limit=1)  # a limit lower than a commit needs
    assert not alarm.blocked
    disk.free = 4096
    monitor.commit_failed(full_disk())
    assert alarm.blocked and alarm.free == 4096
    disk.free = 4096 + WRITE_FAILURE_MARGIN - 1  # above the limit, but hardly any room yet
    clock.advance(ALARMED_CHECK_SECONDS)
    assert alarm.blocked
    disk.free = 4096 + WRITE_FAILURE_MARGIN
    clock.advance(ALARMED_CHECK_SECONDS)
    assert not alarm.blocked
    disk.free = 2  # once cleared, the limit alone counts again
    clock.advance(MAX_CHECK_SECONDS)
    assert not alarm.blocked


def test_other_commit_failures_and_sqlites_full_disk():
    _, _, alarm, monitor = monitored(free=5 * MB, limit=1)
    monitor.commit_failed(Failure(OSError(errno.EIO, "Input/output error")))
    assert not alarm.blocked
    monitor.commit_failed(Failure(sqlite3.OperationalError("database or disk is full")))
    assert alarm.blocked


def test_a_free_space_that_cannot_be_measured_keeps_the_last_state_and_is_tried_again():
    clock, disk, alarm, monitor = monitored(free=10 * MB)
    disk.error = OSError(errno.ENOENT, "No such file or directory")
    clock.advance(ALARMED_CHECK_SECONDS)
    assert alarm.blocked and disk.measures == 2
    disk.error = None
    disk.free = 60 * MB
    clock.advance(ALARMED_CHECK_SECONDS)
    assert not alarm.blocked
    monitor.stop()
    clock.advance(MAX_CHECK_SECONDS)
    assert disk.measures == 3 and not clock.getDelayedCalls()


@pytest.mark.parametrize("text, limit", [
    ("50000000", 50 * MB), ("50MB", 50 * MB), ("50mb", 50 * MB), ("2GB", 2000 * MB), ("10kB", 10_000),
    ("512MiB", 512 << 20), ("1G", 1 << 30), ("1g", 1 << 30), ("100k", 100 << 10), ("3GiB", 3 << 30),
    ("mem_relative:1.5", 1_500_000), ("mem_relative:0", 0),
])
def test_limits_are_read_in_rabbitmqs_forms(text, limit):
    assert parse_disk_free_limit(text, memory=1_000_000) == limit


@pytest.mark.parametrize("text", ["", "50 MB", "-1", "1.5GB", "50TB", "mem_relative:", "mem_relative:-1",
                                  "mem_relative:x", "relative:1"])
def test_other_limits_are_refused_naming_the_option(text):
    with pytest.raises(SystemExit, match="--disk-free-limit: "):
        Options().parseOptions(["--disk-free-limit", text, "--backend", "memory"])


def test_the_default_limit_is_rabbitmqs_50_mb():
    options = Options()
    options.parseOptions(["--backend", "memory"])
    assert options["disk-free-limit"] == 50 * MB


def blocked_frames(transport):
    return [(type(found).__name__, getattr(found, "reason", None)) for found in amqp_frames_in(transport.value())
            if isinstance(found, (commands.Connection.Blocked, commands.Connection.Unblocked))]


def test_amqp_publishers_are_told_which_resources_are_low_as_rabbitmq_says_it():
    broker, clock = make_broker()
    broker.disk_alarm = DiskAlarm(limit=50 * MB)
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
    protocol = amqp_server_past_start_ok(AmqpServerFactory(broker), clock, transport, client_properties={
        "capabilities": {"connection.blocked": True}})
    protocol.dataReceived(frame.marshal(commands.Connection.TuneOk(channel_max=10, frame_max=131072), 0)
                          + frame.marshal(commands.Connection.Open(virtual_host="/"), 0)
                          + frame.marshal(commands.Channel.Open(), 1))
    clock.advance(0)

    def publish():
        transport.clear()
        content = [commands.Basic.Publish(exchange="", routing_key="nowhere"),
                   header.ContentHeader(0, 1, commands.Basic.Properties()), body.ContentBody(b"x")]
        protocol.dataReceived(b"".join(frame.marshal(part, 1) for part in content))
        clock.advance(0)

    broker.disk_alarm.measured(10 * MB)
    broker.watermark.add(broker.watermark.high + 1)
    publish()
    assert blocked_frames(transport) == [("Blocked", "low on memory & disk")]
    assert transport.producerState == "paused"
    transport.clear()
    broker.watermark.release(broker.watermark.high + 1)  # the disk still holds it: nothing said
    clock.advance(0)
    assert blocked_frames(transport) == [] and transport.producerState == "paused"
    broker.disk_alarm.measured(60 * MB)
    clock.advance(0)
    assert blocked_frames(transport) == [("Unblocked", None)] and transport.producerState == "producing"

    broker.disk_alarm.measured(10 * MB)  # the disk alone, later: a publisher is held at its next publish
    publish()
    assert blocked_frames(transport) == [("Blocked", "low on disk")]



def test_native_publishers_are_held_while_the_disk_alarm_is_raised():
    broker, clock = make_broker()
    protocol, transport, publish = native_publisher(broker, clock)
    assert transport.producerState == "producing"
    broker.disk_alarm.measured(broker.disk_alarm.limit - 1)
    protocol.dataReceived(publish)
    clock.advance(0)
    assert transport.producerState == "paused"
    broker.disk_alarm.measured(broker.disk_alarm.limit)
    assert transport.producerState == "producing"
