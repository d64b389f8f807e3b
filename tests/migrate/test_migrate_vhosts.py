"""brokerd-admin migrate on a broker whose vhosts have stores of their own: every vhost named with
--vhost-backend moves to its backend, the broker's store (with the vhosts on it) to --to, a vhost
not named keeps its store, and the access database records the new backends; a real broker on
the result serves every vhost to pika as a broker on an untouched copy of the source does. A
damaged vhost store stops the run naming the vhost and the file, with nothing written; the
refusals of the vhost options are one line each, and a running broker is refused. In process:
--vhost-backend's parsing, and the new backends recorded in one change of the access database."""

import json
import re
import shutil
import time

import pytest

from backends.filelog.queuefile import queue_file_name
from brokerd.access.database import AccessDatabase
from brokerd.migrate import MigrationError
from brokerd.migrate.digest import changed_files, snapshot
from brokerd.migrate.vhosts import MigrationPlan, StoreMove, parse_vhost_backend, record_backends
from tests.support import migrate_vhosts as data
from tests.support.admin_cli import admin
from tests.support.client_broker import TRACEBACK_MARKS
from tests.support.filelog_files import record_spans

pytestmark = pytest.mark.long_module(seconds=55)  # started early (tests/conftest.py)

FILLED = ("/", "v1", "v2", "plain", "kept")  # plain is on the broker's store, kept on a sqlite store of its own
OWN_BACKENDS = {"v1": "sqlite", "v2": "filelog", "v3": "sqlite", "kept": "sqlite"}


def vhost_backends(data_dir):
    with open(data_dir / "access.json", encoding="utf-8") as file:
        return {entry["name"]: entry.get("backend") for entry in json.load(file)["vhosts"]}


def copied(errors, prefix):
    """
    The counts of the finished copies of C{errors}' progress lines beginning with C{prefix}: a filled
    vhost holds 16 queued messages (jobs 6, copy 7, prio 3), 17 if its delayed message came due
    before the broker stopped.
    """
    return [int(count) for count in re.findall(f"^{re.escape(prefix)}copied (\\d+)/\\1 messages \\(100%\\)",
                                               errors, re.M)]


def make_broker_data(tmp_path, data_dir):
    """A broker on chunked whose vhosts are L{OWN_BACKENDS} (v3 only declared), filled, then stopped."""
    running, url = data.start_with_api(tmp_path, "chunked", data_dir)
    try:
        for vhost, backend in OWN_BACKENDS.items():
            data.add_vhost(url, vhost, backend)
        status, _, errors = admin(url, "add-vhost", "plain")
        assert status == 0, errors
        assert admin(url, "set-permissions", "--vhost", "plain", "guest", ".*", ".*", ".*")[0] == 0
        for vhost in FILLED:
            data.fill(running, vhost)
        data.declare_only(running, "v3")
    finally:
        running.process.stop()
    assert vhost_backends(data_dir) == {"/": None, "plain": None, **OWN_BACKENDS}


def serve(tmp_path, backend, data_dir, while_running=lambda: None):
    """What a broker on C{backend} and C{data_dir} serves in every vhost of the set (C{while_running}
    called first)."""
    running, _ = data.start_with_api(tmp_path, backend, data_dir)
    try:
        while_running()
        found = {vhost: data.served(running, vhost) for vhost in FILLED}
        found["v3"] = data.served_idle(running, "v3")
    finally:
        running.process.stop()
    assert not [line for line in running.process.output if any(mark in line for mark in TRACEBACK_MARKS)]
    return found


def assert_served_as_published(found):
    """What a broker on the untouched source serves is what was published and left unacked (so that the
    comparison with the migrated copy compares something)."""
    for vhost in FILLED:
        sent = data.sent_bodies(vhost)
        jobs = found[vhost]["jobs"]
        assert [body for body, _, _ in jobs] == sent[1:], vhost  # the first acked, the second returned in place
        assert jobs[0][2]["headers"]["x-delivery-count"] == 1 and jobs[0][2]["message_id"] == "m1"
        assert [body for body, _, _ in found[vhost]["copy"]] == sent
        assert [body for body, _, _ in found[vhost]["prio"]] == [b"high", b"mid", b"low"]
        assert found[vhost]["copy"][3][2]["expiration"] == "3600000"
        assert found[vhost][data.LATER] == b"delayed " + vhost.encode()
    assert found["v3"] == (0, [b"routed"])


def test_every_vhost_goes_to_the_backend_named_for_it_and_a_broker_serves_them_all(tmp_path):
    data_dir = tmp_path / "data"
    make_broker_data(tmp_path, data_dir)
    untouched = tmp_path / "untouched"
    shutil.copytree(data_dir, untouched)
    expected = serve(tmp_path, "chunked", untouched)
    assert_served_as_published(expected)
    before = snapshot(str(data_dir))

    status, out, errors = admin(None, "migrate", "--data-dir", str(data_dir), "--from", "chunked", "--to", "sqlite",
                                "--vhost-backend", "v1=filelog", "--vhost-backend", "v2=chunked",
                                "--vhost-backend", "v3=filelog")
    assert status == 0, errors
    # Each store's copy is checked and said so, the untouched one named, the way back kept.
    for line in (f"migrated {data_dir} from chunked to sqlite: ", "migrated vhost 'v1' from sqlite to filelog: ",
                 "migrated vhost 'v2' from filelog to chunked: ", "migrated vhost 'v3' from sqlite to filelog: "):
        assert any(found.startswith(line) for found in out.splitlines()), out
    assert out.count("checked in") == 4, out
    assert "vhost 'kept' keeps its sqlite store" in out, out
    assert copied(errors, "migrate: vhost 'v1': ") in ([16], [17]), errors
    # Each store's summary: its queued and its delayed messages, the delayed one of each filled vhost in one or other.
    totals = {what: int(queued) + int(delayed) for what, queued, delayed in re.findall(
        r"^migrated (.+?) from .*?, (\d+) queued messages .*?, (\d+) delayed messages$", out, re.M)}
    assert totals == {str(data_dir): 34, "vhost 'v1'": 17, "vhost 'v2'": 17, "vhost 'v3'": 0}, out
    assert out.splitlines()[-1].startswith(f"start the broker with --backend=sqlite --data-dir={data_dir}"), out
    assert vhost_backends(data_dir) == {"/": None, "plain": None, "v1": "filelog", "v2": "chunked", "v3": "filelog",
                                        "kept": "sqlite"}
    # Only the access database changed (its earlier version kept beside it); every store's files are as they were.
    assert changed_files(before, snapshot(str(data_dir))) == [str(data_dir / "access.json")]
    kept = list(data_dir.glob("access.json.before-migration-*"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["vhosts"] == json.loads(
        (untouched / "access.json").read_text())["vhosts"]
    for vhost, backend in (("v1", "filelog"), ("v2", "chunked"), ("v3", "filelog")):
        assert (data_dir / "vhosts" / vhost / backend).is_dir()

    def refused_while_running():
        """A vhost's store is not moved under a running broker either: its own store's lock says so."""
        status, out, errors = migrate_lines(data_dir, "--quiet", "--vhost-backend", "kept=chunked")
        assert (status, out, len(errors)) == (1, "", 1), (out, errors)
        assert errors[0].startswith("error: vhost 'kept' (its sqlite store): the broker seems to be running on"), errors
        assert not (data_dir / "vhosts" / "kept" / "chunked").exists()  # (the running broker writes the rest)

    assert serve(tmp_path, "sqlite", data_dir, refused_while_running) == expected


def damage_a_record(path):
    """Flip a byte inside the third message record of a filelog queue file (the first is acked): damage
    before its tail, in a message still queued."""
    offset, size = record_spans(path)[2]
    with open(path, "r+b") as file:
        file.seek(offset + size // 2)
        byte = file.read(1)
        file.seek(offset + size // 2)
        file.write(bytes((byte[0] ^ 0xFF,)))


def migrate_lines(data_dir, *arguments):
    status, out, errors = admin(None, "migrate", "--data-dir", str(data_dir), *arguments)
    return status, out, errors.splitlines()


def test_a_damaged_vhost_store_stops_the_migration_naming_the_vhost_and_file_and_nothing_is_written(tmp_path):
    data_dir = tmp_path / "data"
    make_broker_data(tmp_path, data_dir)
    files = snapshot(str(data_dir))
    # The vhost options' refusals: one line each, nothing written.
    for arguments, words in (
        (("--vhost-backend", "nosuch=sqlite"), ("no vhost 'nosuch'",)),
        (("--vhost-backend", "plain=sqlite"), ("vhost 'plain' is on the broker's store", "--to")),
        (("--vhost-backend", "v1=sqlite"), ("vhost 'v1'", "same backend")),
        (("--vhost-backend", "v1"), ("--vhost-backend", "VHOST=BACKEND")),
        (("--vhost-backend", "v1=filelog", "--vhost-backend", "v1=chunked"), ("vhost 'v1'", "twice")),
        (("--from", "chunked"), ("--from and --to",)),
        ((), ("nothing to migrate",)),
    ):
        status, out, errors = migrate_lines(data_dir, "--quiet", *arguments)
        assert (status, out, len(errors)) == (1, "", 1), (arguments, out, errors)
        assert errors[0].startswith("error: "), errors
        for word in words:
            assert word in errors[0], (arguments, errors)
        assert snapshot(str(data_dir)) == files
    damaged = data_dir / "vhosts" / "v2" / "filelog" / queue_file_name(("v2", "jobs"))
    damage_a_record(damaged)
    files = snapshot(str(data_dir))
    # v2 comes last: the broker's store and v1 are copied (and checked) before its damage is found.
    status, out, errors = migrate_lines(data_dir, "--from", "chunked", "--to", "sqlite", "--vhost-backend",
                                        "v1=filelog", "--vhost-backend", "v2=chunked")
    assert (status, out) == (1, ""), (out, errors)
    assert 32 <= sum(copied("\n".join(errors), "migrate: ")) <= 34  # '/' and plain
    assert copied("\n".join(errors), "migrate: vhost 'v1': ") in ([16], [17])
    # The store's own log line names the damage as it finds it; the run's one error line says what stopped it.
    assert any(line.startswith("migrate: store error: queue 'jobs' in vhost 'v2'") for line in errors), errors
    assert errors[-1].startswith("error: vhost 'v2' (its filelog store): "), errors
    assert "queue 'jobs' in vhost 'v2'" in errors[-1] and str(damaged) in errors[-1], errors
    assert snapshot(str(data_dir)) == files  # no target left, the access database as it was
    assert vhost_backends(data_dir)["v2"] == "filelog"


def test_a_vhost_backend_splits_at_its_first_unescaped_equals_sign():
    assert parse_vhost_backend("team=sqlite:cache=64M") == ("team", "sqlite:cache=64M")
    assert parse_vhost_backend(r"a\=b=chunked") == ("a=b", "chunked")
    assert parse_vhost_backend(r"back\\slash=filelog") == ("back\\slash", "filelog")
    for text in ("team", "=sqlite", "team=", r"a\=b"):
        with pytest.raises(MigrationError, match="is not of the form VHOST=BACKEND"):
            parse_vhost_backend(text)


def test_the_new_backends_are_recorded_in_one_change_the_database_as_it_was_kept_beside_it(tmp_path):
    access = AccessDatabase.in_directory(str(tmp_path))
    access.open()
    access.add_vhost("team", "sqlite")
    access.add_vhost("audit", "filelog")
    earlier = (tmp_path / "access.json").read_bytes()
    moves = [StoreMove(None, "chunked", "sqlite", str(tmp_path)), StoreMove("team", "sqlite", "filelog", "team"),
             StoreMove("audit", "filelog", "chunked", "audit")]
    same_second = lambda: time.gmtime(1_800_000_000)  # noqa: E731 (two runs within one second)
    first = record_backends(MigrationPlan(moves[:2], {}, access), same_second)
    second = record_backends(MigrationPlan(moves[2:], {}, access), same_second)
    assert first == str(tmp_path / "access.json.before-migration-20270115T080000Z") and second == first + "-2"
    assert open(first, "rb").read() == earlier
    reopened = AccessDatabase.in_directory(str(tmp_path))
    reopened.open()
    assert reopened.vhost_backends == {"team": "filelog", "audit": "chunked"}
    assert record_backends(MigrationPlan(moves[:1], {}, None)) is None  # the broker's store alone: nothing to record
