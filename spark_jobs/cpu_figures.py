"""The CPU figures of a run, and which side limited it: the broker or the workload's clients, judged
from the CPU each used.

The runner records in run.json (C{cpu}) the broker's CPU seconds during the
workload (every incarnation, its threads and children, from /proc), the
clients' CPU seconds (each client process from the moment it was ready to its
end) and the workload's wall seconds. Whichever side used more CPU over the
run is named the limit: with pika clients that is usually the clients, so the
rates say more about pika than about the backend; with the fast clients it
should be the broker. Without the broker's figure (a reference broker on
another machine, or an incarnation that died unseen) the limit is unknown.
"""

BROKER, CLIENTS, UNKNOWN = "broker", "clients", "unknown"


def _seconds(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)


def cpu_figures(facts):
    """
    The summary's C{cpu} entry of a run, from its run.json C{facts}: CPU
    seconds of the broker and of the clients, the cores each kept busy on
    average over the workload's wall time, and the C{limit} (L{BROKER},
    L{CLIENTS} or L{UNKNOWN}).
    """
    recorded = facts.get("cpu") if isinstance(facts.get("cpu"), dict) else {}
    broker = _seconds(recorded.get("broker_seconds"))
    clients = _seconds(recorded.get("client_seconds"))
    wall = _seconds(recorded.get("wall_seconds"))

    def cores(seconds):
        return None if seconds is None or not wall else round(seconds / wall, 3)

    if broker is None or clients is None:
        limit = UNKNOWN
    else:
        limit = BROKER if broker >= clients else CLIENTS
    return {"broker_seconds": broker, "client_seconds": clients, "wall_seconds": wall,
            "broker_cores": cores(broker), "client_cores": cores(clients), "limit": limit}
