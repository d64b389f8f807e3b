"""The tables the Spark job computes on: every run's event logs and store export,
parsed once, and two tables derived from them.

Parsing JSON is the costly step (a million-message run is gigabytes of lines),
so it happens once: L{stage_runs} reads every run's C{events/*.jsonl} and
C{export.jsonl} with an explicit schema built from L{spark_jobs.events} (no
schema inference; a line that is not JSON, or whose fields the job reads are
not of those types, fails the job) and
writes them as Parquet partitioned by run label and event kind. Every later
query reads only the kinds and columns it needs from there.

Runs are told apart by their directory (C{<out>/runs/<label>/}), not by the
C{backend} field of their lines, so two runs of one backend with different
options can be compared. A reference broker's run has no export: it adds no
export lines, and the checks are told which runs those are
(L{RunTables.unexported}).

Two derived tables are written as Parquet too, because several queries read
each of them:

  - C{messages}: one row per published message, with its routed C{queues}, body,
    publish time, and its publisher confirm if one came (C{confirmed_ok},
    C{confirmed_at}).
  - C{pair_events}: every deliver, ack, nack and reject, joined to its message's
    publish and annotated, within its (message, queue) pair, in the pair's order
    (broker epoch, time, the client's event number): C{delivery_number} (1 for
    the pair's first delivery), C{ack_number}, C{prior_ack_epoch} (the epoch of
    the latest ack before this event, null when none) and C{body_matches}; and,
    on every row, facts about the whole pair: C{deliveries}, C{unflagged_repeat}
    (the first later delivery not flagged redelivered), C{delivered_after_ack}
    (the first delivery after an ack of the same epoch), C{ack_lost_to_crash}
    (delivered after an ack of an earlier epoch) and C{last_ack_epoch}. The
    windows behind these are partitioned by pair: small groups, no skew, and
    the checks then need no further shuffle by pair.
"""

import json
import pathlib
import re

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType, BooleanType, DoubleType, LongType, StringType, StructField, StructType,
)

from spark_jobs import events

LABEL = "label"
PAIR = (LABEL, "message_id", "queue")

# Fields an event of each kind must carry, beyond the common ones; a run whose
# lines lack them cannot be checked, so it is refused with their count.
REQUIRED_FIELDS = {
    events.PUBLISH: ("message_id", "publisher", "seq", "queues", "size", "body_sha256"),
    events.CONFIRM: ("message_id", "ok"),
    events.DELIVER: ("message_id", "queue", "redelivered", "size", "body_sha256"),
    **{kind: ("message_id", "queue") for kind in events.SETTLE_KINDS},
}
COMMON_REQUIRED_FIELDS = ("client", "session", "epoch", "n", "t")
EXPORT_REQUIRED_FIELDS = ("queue", "message_id", "body_sha256", "size", "state")

# JSON types in events.py to Spark types; lists are lists of names (C{queues}).
SPARK_TYPES = {str: StringType(), int: LongType(), float: DoubleType(), bool: BooleanType(),
               list: ArrayType(StringType())}


class RunInputError(ValueError):
    """A run directory is missing, incomplete, or holds lines the job cannot read."""


def schema_for(fields):
    """The Spark schema of a dict of field name to JSON type (L{events.EVENT_FIELDS} and the
    like)."""
    columns = []
    for name, json_type in fields.items():
        if json_type not in SPARK_TYPES:
            raise TypeError(f"field {name!r} has type {json_type!r}, which has no Spark type here")
        columns.append(StructField(name, SPARK_TYPES[json_type], nullable=True))
    return StructType(columns)


# The fields the job reads, typed as events.py says; the others (exchange,
# routing_key, consumer, delivery_tag, delivery_count, confirm, requeue; vhost
# and exchange of the export) are skipped unparsed: parsing is most of the cost.
READ_EVENT_FIELDS = ("kind", "client", "session", "epoch", "n", "t", "message_id", "publisher",
                     "seq", "queues", "size", "body_sha256", "priority", "ok", "queue",
                     "redelivered")
READ_EXPORT_FIELDS = ("queue", "message_id", "body_sha256", "size", "priority", "state")
EVENT_SCHEMA = schema_for({name: events.EVENT_FIELDS[name] for name in READ_EVENT_FIELDS})
EXPORT_SCHEMA = schema_for({name: events.EXPORT_FIELDS[name] for name in READ_EXPORT_FIELDS})
# The staged Parquet schemas: partition columns given as strings, so a label
# like "1" is never read back as a number.
STAGED_EVENT_SCHEMA = StructType(
    [field for field in EVENT_SCHEMA.fields if field.name != "kind"]
    + [StructField(LABEL, StringType()), StructField("kind", StringType())])
STAGED_EXPORT_SCHEMA = StructType(list(EXPORT_SCHEMA.fields) + [StructField(LABEL, StringType())])


def run_files(run_dir, exported=True):
    """The event files and export file of one run directory (None for a run without an export,
    when not C{exported}), refusing an incomplete one."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise RunInputError(f"no run directory {run_dir}")
    event_files = sorted((run_dir / events.EVENTS_DIRECTORY).glob("*.jsonl"))
    if not event_files:
        raise RunInputError(f"run directory {run_dir} has no {events.EVENTS_DIRECTORY}/*.jsonl"
                            f" event files")
    if not exported:
        return event_files, None
    export_file = run_dir / events.EXPORT_FILE
    if not export_file.is_file():
        raise RunInputError(f"run directory {run_dir} has no {events.EXPORT_FILE}"
                            f" (export the store first)")
    return event_files, export_file


def read_run_facts(run_dir):
    """The run's C{run.json} as a dict; an empty one when the runner wrote none."""
    path = pathlib.Path(run_dir) / events.RUN_FILE
    if not path.exists():
        return {}
    try:
        facts = json.loads(path.read_text())
    except ValueError as problem:
        raise RunInputError(f"{path} is not JSON: {problem}") from None
    if not isinstance(facts, dict):
        raise RunInputError(f"{path} holds {type(facts).__name__}, not a JSON object")
    return facts


def _read_json_lines(spark, schema, paths, label):
    reader = spark.read.schema(schema).option("mode", "FAILFAST")
    return reader.json([str(path) for path in paths]).withColumn(LABEL, F.lit(label))


def _union(frames):
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


class RunTables:
    """
    The staged and derived tables of a set of runs, under one work directory.

    @ivar labels: the run labels, in the order given.
    @ivar unexported: the labels of the runs without an export (reference brokers'): what
        their brokers still hold is unknown, not empty.
    @ivar parked_queues: the queues nobody consumes, whose messages only an export shows.
    @ivar events: every event (L{STAGED_EVENT_SCHEMA}), partitioned by label and kind.
    @ivar export: every export line (L{STAGED_EXPORT_SCHEMA}).
    @ivar messages: see the module docstring; None until L{derive} ran.
    @ivar pair_events: see the module docstring; None until L{derive} ran.
    """

    def __init__(self, spark, labels, work_dir, unexported=(), parked_queues=()):
        self.spark = spark
        self.labels = list(labels)
        self.unexported = [label for label in self.labels if label in set(unexported)]
        self.parked_queues = sorted(set(parked_queues))
        self.work_dir = pathlib.Path(work_dir)
        self.events = spark.read.schema(STAGED_EVENT_SCHEMA).parquet(str(self.work_dir / "events"))
        self.export = spark.read.schema(STAGED_EXPORT_SCHEMA).parquet(str(self.work_dir / "export"))
        self.messages = None
        self.pair_events = None

    def of_kind(self, *kinds):
        """The events of the given kinds (partition pruning keeps the others unread)."""
        return self.events.where(F.col("kind").isin(*kinds))

    def derive(self):
        """Computes and writes L{messages} and L{pair_events}; call once the input is validated."""
        self._write("messages", self._messages())
        self.messages = self.spark.read.parquet(str(self.work_dir / "messages"))
        self._write("pair_events", self._pair_events())
        self.pair_events = self.spark.read.parquet(str(self.work_dir / "pair_events"))

    def _write(self, name, frame):
        frame.write.mode("overwrite").parquet(str(self.work_dir / name))

    def _messages(self):
        publishes = self.of_kind(events.PUBLISH).select(
            LABEL, "message_id", "publisher", "seq",
            F.coalesce("priority", F.lit(0)).alias("priority"),
            "queues", "size", "body_sha256", F.col("t").alias("published_at"),
        )
        confirms = self.of_kind(events.CONFIRM).groupBy(LABEL, "message_id").agg(
            F.max("ok").alias("confirmed_ok"), F.min("t").alias("confirmed_at"))
        return publishes.join(confirms, [LABEL, "message_id"], "left")

    def _pair_events(self):
        settled = self.of_kind(events.DELIVER, *events.SETTLE_KINDS).select(
            LABEL, "kind", "message_id", "queue", "client", "session", "epoch", "n", "t",
            "redelivered", "size", "body_sha256",
        )
        published = self.messages.select(
            LABEL, "message_id", "publisher", "seq", "priority", "published_at",
            F.col("size").alias("published_size"), F.col("body_sha256").alias("published_sha256"),
            F.lit(True).alias("published"),
        )
        joined = settled.join(published, [LABEL, "message_id"], "left")
        in_pair_order = Window.partitionBy(*PAIR).orderBy("epoch", "t", "n", "client", "session")
        so_far = in_pair_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        before = in_pair_order.rowsBetween(Window.unboundedPreceding, -1)
        is_delivery = F.col("kind") == events.DELIVER
        is_ack = F.col("kind") == events.ACK
        body_matches = F.coalesce(
            F.col("published") & (F.col("body_sha256") == F.col("published_sha256"))
            & (F.col("size") == F.col("published_size")), F.lit(False))
        in_order = joined.select(
            LABEL, "kind", "message_id", "queue", "client", "session", "epoch", "n", "t",
            "redelivered", "size", "publisher", "seq", "priority", "published_at", "published_size",
            F.coalesce("published", F.lit(False)).alias("published"),
            F.when(is_delivery, body_matches).alias("body_matches"),
            # Both hashes only where they differ: the body checks' examples and the
            # cross-backend body check.
            F.when(is_delivery & ~body_matches, F.col("body_sha256")).alias("delivered_sha256"),
            F.when(is_delivery & ~body_matches, F.col("published_sha256"))
            .alias("published_sha256"),
            F.sum(is_delivery.cast("long")).over(so_far).alias("delivery_number"),
            F.sum(is_ack.cast("long")).over(so_far).alias("ack_number"),
            F.last(F.when(is_ack, F.col("epoch")), ignorenulls=True).over(before)
            .alias("prior_ack_epoch"),
        )
        # Facts about the whole pair, on each of its rows: same partitioning and
        # sort as above, so no second shuffle.
        whole_pair = Window.partitionBy(*PAIR)
        delivery_number, prior_ack_epoch = F.col("delivery_number"), F.col("prior_ack_epoch")
        return in_order.select(
            "*",
            F.max(F.when(is_delivery, delivery_number)).over(whole_pair).alias("deliveries"),
            F.min(F.when(is_delivery & (delivery_number > 1) & ~F.col("redelivered"),
                         F.struct("delivery_number", "client", "session")))
            .over(whole_pair).alias("unflagged_repeat"),
            F.min(F.when(is_delivery & (F.col("epoch") == prior_ack_epoch),
                         F.struct("epoch", "t", "n", "client", "session")))
            .over(whole_pair).alias("delivered_after_ack"),
            F.coalesce(F.max(is_delivery & (F.col("epoch") > prior_ack_epoch)).over(whole_pair),
                       F.lit(False))
            .alias("ack_lost_to_crash"),
            F.max(F.when(is_ack, F.col("epoch"))).over(whole_pair).alias("last_ack_epoch"),
        )

    def first_deliveries(self):
        """Each (message, queue) pair's first delivery, if not flagged redelivered and of a
        published message."""
        return self.pair_events.where(
            (F.col("kind") == events.DELIVER) & (F.col("delivery_number") == 1)
            & ~F.col("redelivered") & F.col("published"))

    def accounted_pairs(self):
        """(label, message_id, queue) of every pair delivered at least once or held in the export
        (may repeat)."""
        delivered = self.pair_events.where(
            (F.col("kind") == events.DELIVER) & (F.col("delivery_number") == 1)).select(*PAIR)
        return delivered.unionByName(self.export.select(*PAIR))


FAILED_FILE = re.compile(r"reading file (?:file:(?://)?)?(?P<path>\S+?)\.?(?:\s|$)")
MALFORMED_LINE = re.compile(
    r"Malformed records are detected in record parsing: (?P<line>.*?)\.?$", re.M)
PARSE_PROBLEM = re.compile(r"(?P<reason>Cannot parse the value .*? as target spark data type \w+)")


def describe_read_failure(text, runs_dir):
    """A one-line account of Spark's error for a line it could not read: the file, the line, why."""
    found = [pattern.search(text) for pattern in (FAILED_FILE, MALFORMED_LINE, PARSE_PROBLEM)]
    where = found[0]["path"] if found[0] else f"a file under {runs_dir}"
    details = [match.group(1) for match in found[1:] if match]
    fallback = text.strip().splitlines()[0] if text.strip() else "no details"
    return (f"{where}: a line is not JSON with the fields and types of spark_jobs.events"
            f" ({'; '.join(details) or fallback})")


def stage_runs(spark, runs_dir, labels, work_dir, unexported=(), parked_queues=()):
    """
    Parses the runs C{<runs_dir>/<label>/} and writes them as Parquet under
    C{work_dir}.

    @param unexported: labels of runs without an export (their export.jsonl is not read).
    @param parked_queues: the workload's queues nobody consumes, for the checks
        (L{RunTables.parked_queues}).
    @return: a L{RunTables} (not yet derived).
    @raise RunInputError: a run directory is missing or incomplete, or a line
        is not JSON of the types in L{spark_jobs.events}.
    """
    runs_dir, work_dir = pathlib.Path(runs_dir), pathlib.Path(work_dir)
    if not labels:
        raise RunInputError("no runs to analyse")
    if len(set(labels)) != len(labels):
        raise RunInputError(f"run labels repeat: {labels}")
    event_frames, export_frames = [], []
    for label in labels:
        event_files, export_file = run_files(runs_dir / label, exported=label not in unexported)
        event_frames.append(_read_json_lines(spark, EVENT_SCHEMA, event_files, label))
        if export_file is not None:
            export_frames.append(_read_json_lines(spark, EXPORT_SCHEMA, [export_file], label))
    if not export_frames:  # only runs without an export: an empty table
        empty = spark.createDataFrame([], EXPORT_SCHEMA)
        export_frames.append(empty.withColumn(LABEL, F.lit(None).cast("string")))
    try:
        (_union(event_frames).write.mode("overwrite").partitionBy(LABEL, "kind")
         .parquet(str(work_dir / "events")))
        (_union(export_frames).write.mode("overwrite").partitionBy(LABEL)
         .parquet(str(work_dir / "export")))
    except (PySparkException, Py4JJavaError) as problem:
        raise RunInputError(describe_read_failure(str(problem), runs_dir)) from None
    return RunTables(spark, labels, work_dir, unexported, parked_queues)
