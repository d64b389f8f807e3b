"""The Spark job: reads the runs under C{<out>/runs/<label>/} (event logs and
store exports, L{spark_jobs.events}) and computes the summary the report
shows: per run its counts, throughput, latency and correctness checks
(L{spark_jobs.checks}), and the checks across runs (L{spark_jobs.cross_checks}).

All runs go through one Spark session and are analysed together: each query
groups by run label, so one pass serves every backend. The JSON lines are
parsed once and staged as Parquet under C{<out>/spark-work/}
(L{spark_jobs.tables}), deleted at the end. Nothing collects raw events to
the driver: only per-kind counts, per-second series, percentiles and at most
five example violations per check come back. No Python UDFs: the order and
pair checks are window functions, so the work stays in the JVM.

A run is a backend's (a brokerd the runner started and exported), a
cluster's (three brokerd nodes the runner started, the final leader's store
exported; the summary adds its C{failover} figures and notes,
L{spark_jobs.failover_figures}) or a reference broker's (reached by URL, not
exported), as its run.json's C{kind} says. The summary names each run's kind;
the checks that read the export (L{events.EXPORT_CHECKS}) are marked not
applicable to a reference (C{"applicable": false} and a C{"reason"}), and the
verdict leaves them out.

L{analyse_runs} works in a session its caller made with
L{spark_jobs.spark_session.create_session}: in local mode by default, or on a
cluster.
"""

import pathlib
import shutil
import time
from dataclasses import dataclass

from pyspark.sql import Window
from pyspark.sql import functions as F

from spark_jobs import events
from spark_jobs.checks import (
    ACKS_LOST_TO_CRASH, CONFIRMED_DELIVERED_OR_STORED, PARKED_PAIRS_UNCHECKED, RUN_CHECKS, SCOPE,
    run_checks,
)
from spark_jobs.cross_checks import CROSS_CHECKS, SAME_MESSAGES, cross_checks
from spark_jobs.figures import latency, throughput
from spark_jobs.cpu_figures import cpu_figures
from spark_jobs.failover_figures import failover_figures, failover_notes
from spark_jobs.tables import (
    COMMON_REQUIRED_FIELDS, EXPORT_REQUIRED_FIELDS, LABEL, REQUIRED_FIELDS, RunInputError,
    read_run_facts, stage_runs,
)

WORK_DIRECTORY = "spark-work"
RUNS_DIRECTORY = "runs"
EXAMPLES_PER_CHECK = 5


@dataclass
class KindFigures:
    """What the events of one kind in one run add up to."""

    count: int = 0
    first_t: float = None
    last_t: float = None
    bytes: int = 0
    max_epoch: int = None
    redelivered: int = 0
    ok: int = 0
    not_ok: int = 0


class Inventory:
    """Per run and event kind: counts, time span, bytes, epochs; and export line counts."""

    def __init__(self, kinds, stored):
        self.kinds = kinds  # (label, kind) -> KindFigures
        self.stored = stored  # label -> export lines

    def kind(self, label, kind):
        return self.kinds.get((label, kind), KindFigures())

    def _of(self, label):
        return [figures for (run, _), figures in self.kinds.items() if run == label]

    def first_t(self, label):
        return min(figures.first_t for figures in self._of(label))

    def last_t(self, label):
        return max(figures.last_t for figures in self._of(label))

    def max_epoch(self, label):
        return max(figures.max_epoch for figures in self._of(label))


def _any_null(names):
    column = F.lit(False)
    for name in names:
        column = column | F.col(name).isNull()
    return column


def take_inventory(tables):
    """
    Counts what each run holds and refuses runs the checks cannot trust.

    @raise RunInputError: a run has no events, events of an unknown kind, or
        events or export lines lacking a field their kind needs.
    """
    incomplete = F.lit(False)
    for kind, names in REQUIRED_FIELDS.items():
        lacking = _any_null(names + COMMON_REQUIRED_FIELDS)
        incomplete = F.when(F.col("kind") == kind, lacking).otherwise(incomplete)
    rows = tables.events.groupBy(LABEL, "kind").agg(
        F.count(F.lit(1)).alias("count"), F.min("t").alias("first_t"), F.max("t").alias("last_t"),
        F.sum(F.coalesce("size", F.lit(0))).alias("bytes"), F.max("epoch").alias("max_epoch"),
        F.sum(F.coalesce(F.col("redelivered"), F.lit(False)).cast("long")).alias("redelivered"),
        F.sum((F.col("ok") == True).cast("long")).alias("ok"),  # noqa: E712 (a column comparison)
        F.sum((F.col("ok") == False).cast("long")).alias("not_ok"),  # noqa: E712
        F.sum(incomplete.cast("long")).alias("incomplete"),
    ).collect()
    problems, kinds = [], {}
    for row in rows:
        if row["kind"] not in events.EVENT_KINDS:
            problems.append(f"run {row[LABEL]}: {row['count']} events of unknown kind"
                            f" {row['kind']!r} (known: {', '.join(events.EVENT_KINDS)})")
            continue
        if row["incomplete"]:
            needed = ", ".join(REQUIRED_FIELDS[row["kind"]] + COMMON_REQUIRED_FIELDS)
            problems.append(f"run {row[LABEL]}: {row['incomplete']} {row['kind']} events lack"
                            f" one of {needed}")
        kinds[row[LABEL], row["kind"]] = KindFigures(
            row["count"], row["first_t"], row["last_t"], row["bytes"], row["max_epoch"],
            row["redelivered"], row["ok"], row["not_ok"])
    stored = {}
    export_rows = tables.export.groupBy(LABEL).agg(
        F.count(F.lit(1)).alias("count"),
        F.sum(_any_null(EXPORT_REQUIRED_FIELDS).cast("long")).alias("incomplete"),
        F.sum((~F.col("state").isin(*events.STORED_STATES)).cast("long")).alias("bad_state"),
    ).collect()
    for row in export_rows:
        stored[row[LABEL]] = row["count"]
        if row["incomplete"]:
            problems.append(f"run {row[LABEL]}: {row['incomplete']} export lines lack one of"
                            f" {', '.join(EXPORT_REQUIRED_FIELDS)}")
        if row["bad_state"]:
            problems.append(f"run {row[LABEL]}: {row['bad_state']} export lines have a state"
                            f" other than {' or '.join(events.STORED_STATES)}")
    for label in tables.labels:
        if not any(run == label for run, _ in kinds):
            problems.append(f"run {label}: no events")
    if problems:
        raise RunInputError("; ".join(problems))
    return Inventory(kinds, stored)


def _run_crashes(facts, inventory, label):
    """SIGKILLs in the run: run.json's C{crashes} (a count or a list), else the last event epoch."""
    crashes = facts.get("crashes")
    if isinstance(crashes, bool) or not isinstance(crashes, (int, list)):
        return inventory.max_epoch(label)
    return len(crashes) if isinstance(crashes, list) else crashes


def _wall_seconds(facts, inventory, label):
    """run.json's C{wall_seconds}, else the span of the run's events."""
    seconds = facts.get("wall_seconds")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return float(seconds)
    return float(inventory.last_t(label) - inventory.first_t(label))


def tally_checks(tables, outcomes):
    """
    Tallies the checks' outcome rows (L{spark_jobs.checks.outcome_rows}) in
    one aggregation, written as Parquet: one row per check and run for what
    passed, one per distinct violation (normally none). Two small reads of it
    give the counts and the first examples.

    @return: C{{(scope, check): {"checked": n, "violations": n, "examples": [...]}}}
        for every (scope, check) with outcomes; scope is a label, or None
        across backends.
    """
    tallied_path = str(tables.work_dir / "tallied")
    (_union(outcomes).groupBy(SCOPE, "check", "sort_key", "example")
     .agg(F.count(F.lit(1)).alias("items"))
     .write.mode("overwrite").parquet(tallied_path))
    tallied = tables.spark.read.parquet(tallied_path)
    violating = F.col("sort_key").isNotNull()
    results = {}
    for row in tallied.groupBy(SCOPE, "check").agg(
            F.sum("items").alias("checked"),
            F.sum(F.when(violating, F.col("items"))).alias("violations")).collect():
        results[row[SCOPE], row["check"]] = {"checked": row["checked"],
                                            "violations": row["violations"] or 0,
                                            "examples": []}
    first = Window.partitionBy(SCOPE, "check").orderBy("sort_key", "example")
    for row in (tallied.where(violating).withColumn("rank", F.row_number().over(first))
                .where(F.col("rank") <= EXAMPLES_PER_CHECK).orderBy(SCOPE, "check", "rank")
                .collect()):
        results[row[SCOPE], row["check"]]["examples"].append(row["example"])
    return results


def _check_result(tally):
    """The summary's dict for one check; nothing checked when it had no outcomes."""
    tally = tally or {"checked": 0, "violations": 0, "examples": []}
    return {"pass": tally["violations"] == 0, "checked": int(tally["checked"]),
            "violations": int(tally["violations"]), "examples": tally["examples"]}


NO_EXPORT_REASON = ("a reference broker's store is not exported, and this check reads what the"
                    " store holds after the run")


def not_applicable(reason):
    """The summary's dict for a check that does not apply to a run: nothing checked,
    C{"applicable": false} and why; it passes vacuously, and the verdict leaves it out."""
    return {"applicable": False, "reason": reason, "pass": True, "checked": 0, "violations": 0,
            "examples": []}


def _parked_note(unchecked, parked_queues):
    pairs = "pair routed to a parked queue" if unchecked == 1 else "pairs routed to parked queues"
    return (f"{unchecked} confirmed (message, queue) {pairs} ({', '.join(parked_queues)})"
            " left out: nobody consumes those queues and this run has no export to show what"
            " they hold")


def _run_checks(label, tallies, unexported, parked_queues):
    """The summary's checks of one run: tallied, and for a run without an export the export
    checks n/a and the parked pairs left out of C{confirmed_delivered_or_stored} said so."""
    checks = {name: _check_result(tallies.get((label, name))) for name in RUN_CHECKS}
    if label in unexported:
        for name in events.EXPORT_CHECKS:
            checks[name] = not_applicable(NO_EXPORT_REASON)
        if parked_queues:
            unchecked = tallies.get((label, PARKED_PAIRS_UNCHECKED), {}).get("checked", 0)
            checks[CONFIRMED_DELIVERED_OR_STORED]["note"] = _parked_note(unchecked, parked_queues)
    return checks


def _run_kind(label, facts):
    kind = facts.get("kind", events.BACKEND_RUN)
    if kind not in events.RUN_KINDS:
        raise RunInputError(f"run {label}: run.json's kind is {kind!r},"
                            f" not one of {', '.join(events.RUN_KINDS)}")
    return kind


def _parked_queues(facts):
    """The parked queues the runs' run.json topologies name."""
    names = set()
    for run in facts.values():
        topology = run.get("topology")
        parked = topology.get("parked") if isinstance(topology, dict) else None
        names.update(name for name in parked or () if isinstance(name, str))
    return sorted(names)


def _union(frames):
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _run_figures(label, facts, inventory, lost_acks, exported=True):
    """The summary's C{run} counts of one run; C{stored} is None (unknown) for a run without an
    export."""
    figures = inventory.kind
    return {
        "wall_seconds": _wall_seconds(facts, inventory, label),
        "crashes": int(_run_crashes(facts, inventory, label)),
        "published": figures(label, events.PUBLISH).count,
        "confirmed": figures(label, events.CONFIRM).ok,
        "nacked_by_broker": figures(label, events.CONFIRM).not_ok,
        "delivered": figures(label, events.DELIVER).count,
        "redelivered": figures(label, events.DELIVER).redelivered,
        "acked": figures(label, events.ACK).count,
        "nacked": figures(label, events.NACK).count,
        "rejected": figures(label, events.REJECT).count,
        "stored": inventory.stored.get(label, 0) if exported else None,
        "acks_lost_to_crash": int(lost_acks),
    }


def _settings_json(settings):
    if settings is None:
        return {}
    return settings.to_json() if hasattr(settings, "to_json") else dict(settings)


STEPS = ("staging", "inventory", "derived tables", "checks", "throughput", "latency")


class _Steps:
    """Runs the job's steps, telling C{step_done} (if any) each one's name and wall seconds."""

    def __init__(self, step_done):
        self.step_done = step_done

    def __call__(self, name, function, *arguments):
        started = time.monotonic()
        result = function(*arguments)
        if self.step_done is not None:
            self.step_done(name, time.monotonic() - started)
        return result


def analyse_runs(spark, out_dir, labels, settings=None, step_done=None):
    """
    Analyses the runs C{<out_dir>/runs/<label>/} for every label together.

    @param settings: the L{spark_jobs.settings.WorkloadSettings} the runs
        played (or its JSON dict), copied into the summary.
    @param step_done: called with each step's name and wall seconds as it
        ends (L{STEPS}, in that order), to show where a long job is.
    @return: the summary dict (see L{spark_jobs.report}), without C{"charts"}.
    @raise RunInputError: a run is missing, incomplete or unreadable.
    """
    out_dir = pathlib.Path(out_dir)
    runs_dir = out_dir / RUNS_DIRECTORY
    labels = list(labels)
    facts = {label: read_run_facts(runs_dir / label) for label in labels}
    kinds = {label: _run_kind(label, facts[label]) for label in labels}
    unexported = [label for label in labels if kinds[label] == events.REFERENCE_RUN]
    parked_queues = _parked_queues(facts)
    work_dir = out_dir / WORK_DIRECTORY
    step = _Steps(step_done)
    try:
        tables = step("staging", stage_runs, spark, runs_dir, labels, work_dir, unexported,
                      parked_queues)
        inventory = step("inventory", take_inventory, tables)
        step("derived tables", tables.derive)
        last_epochs = spark.createDataFrame(
            [(label, max(inventory.max_epoch(label), _run_crashes(facts[label], inventory, label)))
             for label in labels],
            f"{LABEL} string, last_epoch long")
        tallies = step("checks", lambda: tally_checks(
            tables, run_checks(tables, last_epochs) + cross_checks(tables)))
        rates = step("throughput", throughput, tables, inventory)
        latencies = step("latency", latency, tables)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    backends = {}
    for label in labels:
        lost_acks = tallies.get((label, ACKS_LOST_TO_CRASH), {}).get("checked", 0)
        notes = facts[label].get("notes")
        if not isinstance(notes, list):
            notes = []
        backends[label] = {
            "kind": kinds[label],
            "notes": [note for note in notes if isinstance(note, str)],
            "run": _run_figures(label, facts[label], inventory, lost_acks,
                                exported=label not in unexported),
            "throughput": rates[label],
            "latency_ms": latencies[label],
            "cpu": cpu_figures(facts[label]),
            "checks": _run_checks(label, tallies, unexported, parked_queues),
        }
        if kinds[label] == events.CLUSTER_RUN:
            backends[label]["failover"] = failover_figures(facts[label])
            backends[label]["notes"] += failover_notes(facts[label])
    cross = {name: _check_result(tallies.get((None, name))) for name in CROSS_CHECKS}
    if unexported and parked_queues and len(labels) > 1:
        cross[SAME_MESSAGES]["note"] = (f"pairs of parked queues ({', '.join(parked_queues)})"
                                        f" count as agreeing on {', '.join(unexported)},"
                                        f" which have no export to show them")
    every_check = [check for backend in backends.values() for check in backend["checks"].values()]
    every_check += list(cross.values())
    passed = all(check["pass"] for check in every_check if events.check_applies(check))
    return {
        "verdict": "pass" if passed else "fail",
        "settings": _settings_json(settings),
        "backends": backends,
        "cross_backend": {"checks": cross},
    }

