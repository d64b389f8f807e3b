"""brokerd.migrate: every pair of durable backends carries the same
data set (through the stores' own API, in this process), the command line's
refusals are one line each, and one migrated directory is served by a real
broker to pika with its order, flags, headers and delayed messages; the
source still starts a broker, and a running broker is never migrated from.
The command line is the deprecated python -m brokerd.migrate, which first
names brokerd-admin migrate on stderr (tests/admin/test_migrate.py runs that one)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pika
import pytest
from twisted.internet import defer, reactor
from twisted.trial import unittest

from brokerd.interfaces import StoreInUse
from brokerd.migrate import MigrationError, migrate
from brokerd.migrate.digest import changed_files, snapshot
from brokerd.storage import registry
from tests.support import migrate_data as data
from tests.support.client_broker import TRACEBACK_MARKS, start_broker
from tests.support.paths import ROOT
from tests.support.pika_clients import wait_for_body

pytestmark = pytest.mark.long_module(seconds=21)  # started early (tests/conftest.py)

DURABLE = ("sqlite", "filelog", "chunked")


@defer.inlineCallbacks
def portrait_of(backend, data_dir):
    store = registry.make_store(backend, data_dir, reactor=reactor)
    yield store.open()
    try:
        found = yield data.portrait(store)
    finally:
        yield store.close()
    return found


class MigrationPair:
    """Mixed into a trial TestCase per pair: C{source} and C{target} name the backends."""

    source = target = None

    @defer.inlineCallbacks
    def test_everything_comes_across_and_the_source_is_left_as_it_was(self):
        data_dir = tempfile.mkdtemp(prefix="brokerd-migrate-test-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        now = int(time.time() * 1000)
        yield data.write_store(self.source, data_dir, now, reactor)
        before = yield portrait_of(self.source, data_dir)
        files = snapshot(data_dir)
        lines = []
        figures = yield migrate(data_dir, self.source, self.target, progress_line=lines.append, reactor=reactor)
        self.assertEqual(changed_files(files, snapshot(data_dir)), [])
        self.assertEqual(figures["changed_source_files"], [])
        self.assertEqual(figures["left_behind"], [])
        # The copy's last line says it all came across (on a slow machine a checking line may follow it).
        copied = [line for line in lines if line.startswith("copied ")]
        self.assertTrue(copied and copied[-1].startswith("copied 10/10 messages (100%)"), lines)
        after = yield portrait_of(self.target, data_dir)
        topology, queues, delayed, shared = after
        self.assertEqual(after[:3], before[:3])
        self.assertEqual([entry[0] for entry in queues[data.PRIORITY]], [body for body, _ in data.PRIORITIES])
        self.assertEqual([entry[1] for entry in queues[data.PRIORITY]], [priority for _, priority in data.PRIORITIES])
        self.assertEqual([entry[3] for entry in queues[data.TTL]], [now, now])
        for name, bodies in ((data.PLAIN, data.PLAIN_BODIES), (data.COPY, data.COPY_BODIES)):
            counts = data.DELIVERY_COUNTS[name]
            self.assertEqual([(entry[0], entry[5]) for entry in queues[name]],
                             [(body, counts.get(body, 0)) for body in bodies])
        self.assertEqual(queues[data.PLAIN][2][2], data.HEADERS)
        self.assertTrue(all(entry[4] for entries in queues.values() for entry in entries))  # redelivered, as before
        self.assertEqual(delayed, [(now - 1000, data.key(data.DELAYED_EXCHANGE), data.DUE_NOW),
                                   (now + data.HOUR_MS, data.key(data.DELAYED_EXCHANGE), data.DUE_LATER)])
        # One message for two queues stays one message where both backends can say so (filelog keeps a copy
        # per queue, and hands each copy back under a handle of its own).
        self.assertEqual(shared, "filelog" not in (self.source, self.target))
        self.assertEqual(figures["messages"], 10 if self.source == "filelog" else 9)  # appends made

    @defer.inlineCallbacks
    def test_a_target_that_holds_data_is_refused_and_left_as_it_was(self):
        data_dir = tempfile.mkdtemp(prefix="brokerd-migrate-test-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        now = int(time.time() * 1000)
        yield data.write_store(self.source, data_dir, now, reactor)
        yield data.write_store(self.target, data_dir, now, reactor)
        files = snapshot(data_dir)
        with self.assertRaises(MigrationError) as refused:
            yield migrate(data_dir, self.source, self.target, reactor=reactor)
        self.assertIn("already holds data", str(refused.exception))
        self.assertEqual(changed_files(files, snapshot(data_dir)), [])
        self.assertEqual(set(snapshot(data_dir)) - set(files), set())


def _pair_case(source, target):
    name = f"MigrateFrom{source.title()}To{target.title()}Tests"
    return type(name, (MigrationPair, unittest.TestCase), {"source": source, "target": target})


for _source in DURABLE:
    for _target in DURABLE:
        if _source != _target:
            _case = _pair_case(_source, _target)
            globals()[_case.__name__] = _case
del _case, _source, _target


class EmptyTargetTests(unittest.TestCase):
    """A broker started once with the target backend leaves an empty store behind: the migration goes into
    it, and what it writes there is not reported as a change the source's recovery made."""

    @defer.inlineCallbacks
    def test_an_empty_target_store_left_by_a_broker_is_migrated_into(self):
        data_dir = tempfile.mkdtemp(prefix="brokerd-migrate-test-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        yield data.write_store("chunked", data_dir, int(time.time() * 1000), reactor)
        empty = registry.make_store("sqlite", data_dir, reactor=reactor)
        yield empty.open()
        yield empty.close()
        figures = yield migrate(data_dir, "chunked", "sqlite", reactor=reactor)
        self.assertEqual(figures["changed_source_files"], [])
        self.assertEqual(figures["messages"], 9)


class StoreInUseTests(unittest.TestCase):
    """How the migration tells a running broker from anything else: every durable backend's second store on
    the same files fails to open with StoreInUse (a broker holds its store open for its whole run)."""

    @defer.inlineCallbacks
    def test_a_second_open_store_on_the_same_data_fails_with_store_in_use(self):
        for backend in DURABLE:
            data_dir = tempfile.mkdtemp(prefix="brokerd-migrate-test-")
            self.addCleanup(shutil.rmtree, data_dir, True)
            first = registry.make_store(backend, data_dir, reactor=reactor)
            yield first.open()
            try:
                second = registry.make_store(backend, data_dir, reactor=reactor)
                failure = yield self.assertFailure(second.open(), StoreInUse)
                self.assertIn(data_dir, str(failure))
            finally:
                yield first.close()


# -- the command line, and a real broker on the result


DEPRECATION = ("python -m brokerd.migrate is deprecated; use: brokerd-admin migrate --data-dir DIR --from BACKEND"
               " --to BACKEND")


def run_migrate(*arguments):
    """The finished python -m brokerd.migrate, checked to name its replacement first on stderr; its stderr
    is given without that line."""
    result = subprocess.run([sys.executable, "-m", "brokerd.migrate", *arguments], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    deprecation, _, rest = result.stderr.partition("\n")
    assert deprecation == DEPRECATION, result.stderr
    result.stderr = rest
    return result


def write_data_dir(backend, data_dir):
    written = subprocess.run([sys.executable, "-m", "tests.support.migrate_data", backend, str(data_dir)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr


def assert_one_line_failure(result, *words):
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m brokerd.migrate: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_expected_errors_are_one_line_without_a_traceback(tmp_path):
    data_dir = tmp_path / "data"
    write_data_dir("chunked", data_dir)
    files = snapshot(str(data_dir))
    assert_one_line_failure(run_migrate("--data-dir", str(tmp_path / "missing"), "--from", "chunked", "--to",
                                        "sqlite"), "does not exist")
    assert_one_line_failure(run_migrate("--data-dir", str(data_dir), "--from", "chunky", "--to", "sqlite"),
                            "--from", "unknown backend 'chunky'")
    assert_one_line_failure(run_migrate("--data-dir", str(data_dir), "--from", "chunked", "--to",
                                        "chunked:chunk_size=1M"), "same backend")
    assert_one_line_failure(run_migrate("--data-dir", str(data_dir), "--from", "sqlite", "--to", "filelog"),
                            "holds no sqlite data")
    assert_one_line_failure(run_migrate("--data-dir", str(data_dir), "--from", "chunked", "--to", "memory"),
                            "keeps nothing on disk")
    assert_one_line_failure(run_migrate("--data-dir", str(data_dir), "--from", "chunked"), "--to")
    assert snapshot(str(data_dir)) == files  # nothing made, nothing left behind


@pytest.mark.parametrize("source, target", [("chunked", "sqlite"), ("sqlite", "filelog"), ("filelog", "chunked")])
def test_quarantined_records_stop_the_migration_unless_left_behind_and_are_named(tmp_path, source, target):
    data_dir = tmp_path / "data"
    written = subprocess.run([sys.executable, "-m", "tests.support.poisoned_state", source, str(data_dir)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    files = snapshot(str(data_dir))
    refused = run_migrate("--data-dir", str(data_dir), "--from", source, "--to", target, "--quiet")
    assert refused.returncode == 1 and "--leave-quarantined" in refused.stderr.splitlines()[-1], refused
    assert snapshot(str(data_dir)) == files  # nothing written
    carried = run_migrate("--data-dir", str(data_dir), "--from", source, "--to", target, "--quiet",
                          "--leave-quarantined")
    assert carried.returncode == 0, carried
    behind = "\n".join(line for line in carried.stdout.splitlines() if line.startswith("left in the source only: "))
    for named in ("quarantined exchange 'poison-x'", "quarantined queue 'poison-q'"):
        assert named in behind, carried.stdout
    # The poisoned message and delayed message: named by the store's own log lines, and counted in the summary.
    assert "quarantined" in carried.stderr and "delayed message" in carried.stderr, carried.stderr
    assert "the stores logged" in carried.stdout, carried.stdout
    assert not any(mark in carried.stderr for mark in TRACEBACK_MARKS), carried.stderr


def drain(channel, queue):
    """Every message of C{queue}, acked: C{(body, redelivered, properties)} in delivery order."""
    got = []
    while True:
        method, properties, body = channel.basic_get(queue)
        if method is None:
            return got
        got.append((body, method.redelivered, properties))
        channel.basic_ack(method.delivery_tag)


def assert_served_as_written(amqp_url):
    """What a pika client finds in a broker started on a migrated copy of the data set."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        by_priority = sorted(data.PRIORITIES, key=lambda item: -item[1])
        assert [(body, redelivered, properties.priority) for body, redelivered, properties
                in drain(channel, data.PRIORITY)] == [(body, True, priority) for body, priority in by_priority]
        assert [body for body, _, _ in drain(channel, data.TTL)] == data.TTL_BODIES  # not expired: TTL from publish
        for name, bodies in ((data.PLAIN, data.PLAIN_BODIES), (data.COPY, data.COPY_BODIES)):
            counts = data.DELIVERY_COUNTS[name]
            got = drain(channel, name)
            assert [(body, redelivered, (properties.headers or {}).get("x-delivery-count"))
                    for body, redelivered, properties in got] == [
                (body, True, counts.get(body)) for body in bodies]
            if name == data.PLAIN:
                assert got[2][2].headers == data.HEADERS
        assert wait_for_body(channel, data.LATER) == data.DUE_NOW
        later = channel.queue_declare(data.LATER, passive=True)
        assert later.method.message_count == 0  # the other delayed message waits its hour
    finally:
        if connection.is_open:
            connection.close()


def test_a_broker_serves_the_migrated_data_and_still_starts_on_the_source(tmp_path):
    data_dir = tmp_path / "data"
    write_data_dir("chunked", data_dir)
    source_files = snapshot(str(data_dir))
    migrated = run_migrate("--data-dir", str(data_dir), "--from", "chunked", "--to", "sqlite")
    assert migrated.returncode == 0, migrated
    assert "copied 10/10 messages (100%)" in migrated.stderr, migrated.stderr
    assert changed_files(source_files, snapshot(str(data_dir))) == []
    running = start_broker(tmp_path, "--backend", "sqlite", "--data-dir", str(data_dir))
    try:
        assert_served_as_written(running.amqp_url)
    finally:
        running.process.stop()
    assert not [line for line in running.process.output if any(mark in line for mark in TRACEBACK_MARKS)]
    source = start_broker(tmp_path, "--backend", "chunked", "--data-dir", str(data_dir))
    try:
        assert_one_line_failure(run_migrate("--data-dir", str(data_dir), "--from", "chunked", "--to", "filelog"),
                                "the broker seems to be running")
        assert not os.path.exists(data_dir / "filelog")
        connection = pika.BlockingConnection(pika.URLParameters(source.amqp_url))
        channel = connection.channel()
        for name, bodies in ((data.PLAIN, data.PLAIN_BODIES), (data.COPY, data.COPY_BODIES)):
            assert [body for body, _, _ in drain(channel, name)] == bodies
        connection.close()
    finally:
        source.process.stop()


def test_a_broker_serves_data_migrated_into_filelog(tmp_path):
    data_dir = tmp_path / "data"
    write_data_dir("sqlite", data_dir)
    migrated = run_migrate("--data-dir", str(data_dir), "--from", "sqlite", "--to", "filelog", "--quiet")
    assert migrated.returncode == 0 and not migrated.stderr, migrated
    running = start_broker(tmp_path, "--backend", "filelog", "--data-dir", str(data_dir))
    try:
        assert_served_as_written(running.amqp_url)
    finally:
        running.process.stop()
    assert not [line for line in running.process.output if any(mark in line for mark in TRACEBACK_MARKS)]
