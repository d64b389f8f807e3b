"""
A cluster node reduced to its leadership, as a process of its own, for tests that stop and kill
it: ``python -m tests.support.cluster_node URL CLUSTER NAME TTL``. It prints one line per event,
each starting with the steady clock's time (CLOCK_BOOTTIME, the same in every process of the
machine): ``started``, ``leader NAME`` or ``leader none``, ``elected``, ``stepped-down REASON``,
``ended REASON``, and, while it leads, ``confirm`` every 20 ms: the act only a leader may do, done
only after asking whether it still leads, as a broker's confirm will.
"""

import sys

from twisted.internet import reactor, task

from brokerd.cluster.clock import SteadyClock
from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.leadership import Candidate
from brokerd.cluster.view import ClusterKeys, NodeInfo

CONFIRM_INTERVAL = 0.02


def main(url, cluster, name, ttl):
    clock = SteadyClock(reactor)

    def say(*words):
        print(f"{clock.seconds():.6f}", *words, flush=True)

    candidate = Candidate(
        EtcdClient(reactor, url, timeout=1.0), clock, ClusterKeys(cluster), NodeInfo(name, {"amqp": f"tcp:{name}"}),
        ttl=int(ttl), on_elected=lambda: say("elected"),
        on_stepped_down=lambda reason: say("stepped-down", reason),
        on_leader=lambda info: say("leader", info.name if info else "none"), retry_seconds=0.1,
    )

    def confirm():
        if candidate.is_leader():
            say("confirm")

    def started(_):
        say("started")
        task.LoopingCall(confirm).start(CONFIRM_INTERVAL)

    def failed(failure):
        say("failed", failure.getErrorMessage())
        reactor.stop()

    candidate.ended.addCallback(lambda reason: say("ended", reason))
    reactor.callWhenRunning(lambda: candidate.start().addCallbacks(started, failed))
    reactor.run()


if __name__ == "__main__":
    main(*sys.argv[1:])
