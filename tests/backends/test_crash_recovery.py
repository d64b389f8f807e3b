"""The durable backends keep their promises across a SIGKILL of the broker.

Each test runs L{crashloop.loop.CrashLoop} (the code behind ``python -m
crashloop``): a real ``twistd brokerd`` on a data directory, a
client in its own process publishing persistent messages with confirms and
acking some of them, a SIGKILL after a seeded random number of confirms, a
restart on the same directory and a drain of the queue, checked against what
the client logged (confirmed ids, acks sent, acks proven durable): confirmed
and never acked messages all come back, durably acked ones do not, bodies pass
their checksums, and each publisher's messages keep their order. A failure
message names the seed, the cycle and the data directory, which pytest keeps.

Each backend runs under --sync=always with three seeds, and once under each
of the weaker sync modes. Every durable backend that is installed runs; one
whose entry point or package is missing is skipped (one that exists but fails
to load fails). The memory backend, which forgets everything at a restart,
must fail the same checks: that is what shows they can fail. The checks
themselves are also run on hand-made deliveries, one defect at a time.
"""

import pytest

from crashloop.body import PERSISTENT_PROPERTIES, make_body
from crashloop.check import check_recovery
from crashloop.loop import DURABLE_BACKENDS, CrashCheckFailed, CrashLoop, backend_installed

pytestmark = pytest.mark.long_module(seconds=140)  # started early (tests/conftest.py)

SEEDS = (11, 12, 13)
KILLS_PER_SEED = 2  # chained on one data directory: the second crash hits a store that already recovered once
MAX_KILL_CONFIRMS = 3000
MESSAGES_PER_PUBLISHER = 20_000


def durable_backend(name):
    return pytest.param(
        name,
        marks=pytest.mark.skipif(not backend_installed(name), reason=f"backend {name!r} is not installed"),
        id=name,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("backend", [durable_backend(name) for name in DURABLE_BACKENDS])
def test_confirmed_messages_survive_sigkill_and_durable_acks_stay_acked(backend, seed, tmp_path):
    loop = CrashLoop(backend, tmp_path, seed, max_kill_confirms=MAX_KILL_CONFIRMS, messages=MESSAGES_PER_PUBLISHER)
    results = loop.run(KILLS_PER_SEED)
    assert len(results) == KILLS_PER_SEED
    assert all(result["confirmed"] > 0 for result in results), results
    assert loop.final_stats is not None and loop.final_stats.get("commits", 0) > 0, loop.final_stats


@pytest.mark.parametrize("sync", ["interval:50", "none"])
@pytest.mark.parametrize("backend", [durable_backend(name) for name in DURABLE_BACKENDS])
def test_a_sigkill_loses_nothing_confirmed_under_the_weaker_sync_modes(backend, sync, tmp_path):
    # A SIGKILL is not a power loss: what was written to the OS survives it, so
    # even --sync=none (confirm once written, no fsync) must keep every promise.
    loop = CrashLoop(backend, tmp_path, 21, sync=sync, max_kill_confirms=MAX_KILL_CONFIRMS,
                     messages=MESSAGES_PER_PUBLISHER)
    results = loop.run(KILLS_PER_SEED)
    assert all(result["confirmed"] > 0 for result in results), results


def test_a_store_that_forgets_fails_the_checks(tmp_path):
    loop = CrashLoop("memory", tmp_path, seed=1, max_kill_confirms=500, messages=5000)
    with pytest.raises(CrashCheckFailed, match="confirmed, never acked messages did not come back"):
        loop.run(1)


# -- the checks on hand-made deliveries


def delivery(run, publisher, sequence, payload=b"payload", properties=PERSISTENT_PROPERTIES):
    return (True, properties, make_body(run, publisher, sequence, payload))


CONFIRMED = {1: [(1, 4)]}
SENT = {1: 5}


def problems_with(deliveries, durably_acked=(), acks_sent=()):
    return check_recovery(deliveries, 2, {1: CONFIRMED[1]}, SENT, set(durably_acked), set(acks_sent))[0]


def test_check_passes_when_every_confirmed_message_is_back_in_order():
    back = [delivery(2, 1, sequence) for sequence in (1, 2, 3, 4, 5)]
    assert problems_with(back) == []


def test_check_allows_acked_messages_to_stay_away_unless_the_ack_was_durable():
    back = [delivery(2, 1, 1), delivery(2, 1, 4)]
    assert problems_with(back, durably_acked={(2, 1, 2)}, acks_sent={(2, 1, 2), (2, 1, 3)}) == []
    assert problems_with(back + [delivery(2, 1, 5)], durably_acked={(2, 1, 5)},
                         acks_sent={(2, 1, 2), (2, 1, 3), (2, 1, 5)}) == [
        "message 2:1:5 came back although its ack was durable"
    ]


def test_check_reports_a_confirmed_message_that_did_not_come_back():
    problems = problems_with([delivery(2, 1, 1), delivery(2, 1, 2), delivery(2, 1, 4)])
    assert problems == ["1 confirmed, never acked messages did not come back: 2:1:3"]


def test_check_reports_a_corrupt_body():
    damaged = bytearray(make_body(2, 1, 2, b"payload"))
    damaged[-6] ^= 0x01
    problems = problems_with([delivery(2, 1, 1), (True, PERSISTENT_PROPERTIES, bytes(damaged)),
                              delivery(2, 1, 3), delivery(2, 1, 4)])
    assert len(problems) == 2
    assert problems[0].startswith("delivery 1: corrupt body: message 2:1:2: CRC-32")
    assert "did not come back: 2:1:2" in problems[1]


def test_check_reports_lost_properties():
    back = [delivery(2, 1, 1), delivery(2, 1, 2, properties=b"\x00\x00"), delivery(2, 1, 3), delivery(2, 1, 4)]
    assert problems_with(back) == [f"message 2:1:2: content properties b'\\x00\\x00', published as"
                                   f" {PERSISTENT_PROPERTIES!r}"]


def test_check_reports_messages_out_of_publish_order_twice_or_never_published():
    back = [delivery(2, 1, 1), delivery(2, 1, 3), delivery(2, 1, 2), delivery(2, 1, 4), delivery(2, 1, 4),
            delivery(2, 1, 9), delivery(1, 1, 1)]
    assert problems_with(back) == [
        "message 2:1:2 came back after 2:1:3: out of publish order",
        "message 2:1:4 delivered twice",
        "message 2:1:4 came back after 2:1:4: out of publish order",
        "message 2:1:9 was never published",
        "message 1:1:1 came back although it was drained (acked durably) before",
    ]
