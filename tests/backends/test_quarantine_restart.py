"""A broker whose durable state holds records it cannot read back still starts,
after a SIGKILL too, and serves everything else: a real ``twistd brokerd`` on
a data directory written by the store's own code (L{tests.support.poisoned_state}),
checked with pika. Each backend's store-level behaviour is in
L{tests.backends.test_quarantine}."""

import os
import subprocess
import sys

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.support import poisoned_state as state
from tests.support.client_broker import TRACEBACK_MARKS, start_broker
from tests.support.paths import ROOT
from tests.support.pika_clients import wait_for_body


def write_poisoned_data_dir(backend, data_dir, messages_only=False):
    flags = ["--messages-only"] if messages_only else []
    written = subprocess.run([sys.executable, "-m", "tests.support.poisoned_state", backend, str(data_dir), *flags],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr


def drain(channel, queue):
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue)
        if method is None:
            return bodies
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)


@pytest.mark.parametrize("backend", state.DURABLE_BACKENDS)
def test_a_broker_with_unreadable_records_starts_after_sigkill_and_serves_the_rest(backend, tmp_path):
    data_dir = tmp_path / "data"
    write_poisoned_data_dir(backend, data_dir)
    arguments = ("--backend", backend, "--data-dir", str(data_dir))
    first = start_broker(tmp_path, *arguments)  # raises, with the broker's output, if it does not start
    first.process.kill()
    running = start_broker(tmp_path, *arguments)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(running.amqp_url))
        try:
            channel = connection.channel()
            for queue in (state.JOBS, state.AUDIT, state.DELAYED_OUT):
                channel.queue_declare(queue, passive=True, durable=True)
            channel.exchange_declare(state.EVENTS, "direct", passive=True)
            assert drain(channel, state.JOBS) == state.JOB_BODIES  # before and after the poisoned one, in order
            assert drain(channel, state.AUDIT) == state.AUDIT_BODIES
            assert wait_for_body(channel, state.DELAYED_OUT) == state.DELAYED_BODIES[0]
            channel.basic_publish(state.EVENTS, state.AUDIT, b"after the restart")
            assert drain(channel, state.AUDIT) == [b"after the restart"]
            with pytest.raises(ChannelClosedByBroker) as refused:
                channel.basic_get(state.POISON_QUEUE)
            assert refused.value.reply_code == 404
            assert "unavailable" in refused.value.reply_text
        finally:
            if connection.is_open:
                connection.close()
    finally:
        running.process.stop()
    output = running.process.output
    text = "\n".join(output)
    assert not [line for line in output if any(mark in line for mark in TRACEBACK_MARKS)], text
    for named in ("quarantined exchange 'poison-x'", "quarantined queue 'poison-q'", "'poison-rk'",
                  "quarantined stored message", "delayed message"):
        assert any(named in line and "quarantined" in line for line in output), (named, text)


@pytest.mark.parametrize("backend", state.DURABLE_BACKENDS)
def test_an_unreadable_message_takes_down_nothing_but_itself_after_sigkill(backend, tmp_path):
    data_dir = tmp_path / "data"
    write_poisoned_data_dir(backend, data_dir, messages_only=True)
    arguments = ("--backend", backend, "--data-dir", str(data_dir))
    start_broker(tmp_path, *arguments).process.kill()
    running = start_broker(tmp_path, *arguments)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(running.amqp_url))
        try:
            channel = connection.channel()
            assert drain(channel, state.JOBS) == state.JOB_BODIES  # before and after the poisoned one, in order
            assert drain(channel, state.POISON_QUEUE) == state.POISON_QUEUE_BODIES
            assert wait_for_body(channel, state.DELAYED_OUT) == state.DELAYED_BODIES[0]
            channel.basic_publish(state.EVENTS, state.JOBS, b"after the restart")
            assert drain(channel, state.JOBS) == [b"after the restart"]
        finally:
            if connection.is_open:
                connection.close()
    finally:
        running.process.stop()
    output = running.process.output
    text = "\n".join(output)
    assert not [line for line in output if any(mark in line for mark in TRACEBACK_MARKS)], text
    assert any("'jobs'" in line and "quarantined stored message" in line for line in output), text
    assert any("delayed message" in line and "quarantined" in line for line in output), text
