"""The failover benchmark, small: three kills of the leader under load lose no confirmed message."""

import json
import subprocess
import sys

from tests.support.etcd import needs_etcd
from tests.support.paths import ROOT

pytestmark = needs_etcd


def test_three_kills_of_the_leader_lose_no_confirmed_message():
    # min-isr 1: a new leader confirms before the surviving follower rejoins it.
    finished = subprocess.run(
        [sys.executable, "-m", "benchmarks.cluster_failover", "--kills", "3", "--interval", "2",
         "--min-isr", "1", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert finished.returncode == 0, finished.stderr[-3000:]
    results = json.loads(finished.stdout.strip().splitlines()[-1])
    print(results)
    assert results["kills"] == 3
    assert results["confirmed"] > 0 and results["confirmed_lost"] == 0
    assert 0 < results["kill_to_confirm_max_s"] < 3 + 3
