"""The failover figures of a cluster run (L{spark_jobs.cluster_broker}): how many times its
leader was killed and how long the cluster went without one, from the run.json C{failovers}
the runner records (per crash point: the C{killed} leader, the new C{leader}, and the
C{seconds} from the SIGKILL until the new leader served).
"""


def _failovers(facts):
    """The well-formed failovers of run.json C{facts} (others are left out)."""
    recorded = facts.get("failovers")
    return [failover for failover in recorded if isinstance(failover, dict)
            and isinstance(failover.get("seconds"), (int, float))
            and not isinstance(failover.get("seconds"), bool)] \
        if isinstance(recorded, list) else []


def failover_figures(facts):
    """The summary's C{failover} entry of a cluster run: C{count}, C{mean_seconds} and
    C{max_seconds} (None without failovers)."""
    seconds = [float(failover["seconds"]) for failover in _failovers(facts)]
    return {"count": len(seconds),
            "mean_seconds": round(sum(seconds) / len(seconds), 3) if seconds else None,
            "max_seconds": round(max(seconds), 3) if seconds else None}


def failover_notes(facts):
    """A sentence per failover of a cluster run, and one naming the final leader, whose store
    was exported."""
    notes = [f"failover {number}: leader {failover.get('killed')} killed,"
             f" {failover.get('leader')} served {failover['seconds']:.1f} s later"
             for number, failover in enumerate(_failovers(facts), start=1)]
    nodes = facts.get("nodes")
    if isinstance(facts.get("leader"), str) and isinstance(nodes, list):
        named = ", ".join(f"{node.get('name')} ({node.get('backend')})" for node in nodes
                          if isinstance(node, dict))
        notes.append(f"nodes {named}; the store exported is {facts['leader']}'s,"
                     f" the final leader's")
    return notes
