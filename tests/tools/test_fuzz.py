"""A seeded, bounded fuzzing run against a real broker, once per protocol.

Random frames, mutated valid conversations and structured hostile inputs
(L{fuzz.inputs}) go to a ``twistd brokerd`` over fresh sockets; after
each one a canary client in each protocol must publish a persistent message
with confirms, get it back and ack it. The broker must never die, never log a
traceback, keep its peak resident memory within its watermark plus a margin,
and start again after a SIGKILL. The long run is ``python -m fuzz``.
"""

import itertools

import pytest

from fuzz.campaign import Fuzzer
from fuzz.inputs import InputStream
from fuzz.report import format_summary

pytestmark = pytest.mark.long_module(seconds=50)  # started early (tests/conftest.py)

SEED = 1
SECONDS = 22  # per protocol; with start-up and the restart check each run stays under 30 s
MAX_INPUTS = 250
WATERMARK = "128M"  # the resource-abuse inputs push twice this at the broker
RSS_MARGIN = "128M"


@pytest.mark.parametrize("protocol", ["amqp", "native"])
def test_hostile_input_never_kills_bricks_or_bloats_the_broker(protocol):
    results = Fuzzer(SECONDS, SEED, backend="chunked", watermark=WATERMARK, rss_margin=RSS_MARGIN,
                     protocols=[protocol], max_inputs=MAX_INPUTS).run()
    summary = format_summary(results)
    assert results["inputs"] >= 30, summary
    kinds = {kind.split("/")[1] for kind in results["inputs_by_kind"]}
    assert {"random", "mutated"} <= kinds and len(kinds) >= 6, summary
    assert results["deaths"] == 0, summary
    assert results["tracebacks"] == 0, summary
    assert results["canary_failures"] == 0, summary
    assert results["peak_rss"] < results["watermark"] + results["rss_margin"], summary
    assert results["restart"].startswith("started"), summary


def digests(seed, count=300):
    return [item.digest() for item in itertools.islice(InputStream(seed, volume=1 << 20), count)]


def test_the_same_seed_gives_the_same_inputs():
    first = digests(SEED)
    assert digests(SEED) == first
    assert digests(SEED + 1) != first
    assert len(set(first)) > 250, "inputs hardly ever repeat"
