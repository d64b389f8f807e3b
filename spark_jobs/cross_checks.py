"""The cross-backend checks: the runs of one seeded workload on different
backends must agree. Same shape as L{spark_jobs.checks} (outcome rows), with a
null label; with fewer than two runs there is nothing to compare, and each
passes with nothing checked.

Which runs hold a row is kept as a bit mask (bit i for the i-th label), so
"present on every run" is one integer aggregate, not a collected set.

  - C{same_messages}: among messages confirmed (basic.ack) on every run, each
    (message, queue) pair delivered or stored on one run is delivered or stored
    on every run. A message one run lost, or routed elsewhere, shows up here.
    A run without an export (a reference broker's) cannot show what its parked
    queues hold, so for pairs of a parked queue it counts as agreeing.
  - C{same_bodies}: a message id has one body hash everywhere: in its publishes,
    the deliveries and the exports of all runs.
  - C{same_queue_sequences}: per queue, publisher and priority, the first
    deliveries (not flagged redelivered) of the messages first-delivered on
    every run come in one order on every run. Which consumer gets which message,
    and how a priority queue interleaves priorities, depend on timing and
    legitimately differ, so orders are compared where they are defined: along
    each consumer connection (client, session), whose order must agree with the
    one order all runs share, the publisher's (C{seq}). A violation names the run
    and the two messages it swapped.
"""

from pyspark.sql import functions as F

from spark_jobs import events
from spark_jobs.checks import in_consumer_order, outcome_rows
from spark_jobs.tables import LABEL

CROSS_CHECKS = events.CROSS_BACKEND_CHECKS
SAME_MESSAGES, SAME_BODIES, SAME_QUEUE_SEQUENCES = CROSS_CHECKS
MAX_RUNS = 62  # one bit each in a long mask


def _no_label():
    return F.lit(None).cast("string")


def _label_bit(labels):
    """A column: 2**i for a row of the i-th label."""
    bit = F.lit(0).cast("long")
    for index, label in enumerate(labels):
        bit = F.when(F.col(LABEL) == label, F.lit(1 << index).cast("long")).otherwise(bit)
    return bit


def _labels_in(mask_column, labels, present):
    """A column: the comma-separated labels whose bit in C{mask_column} is set (or clear, when
    not C{present})."""
    names = [F.when((F.shiftright(mask_column, index) % 2 == 1) == present, F.lit(label))
             for index, label in enumerate(labels)]
    return F.concat_ws(", ", *names)


def same_messages(tables):
    labels = tables.labels
    everywhere = (1 << len(labels)) - 1
    confirmed_everywhere = (tables.messages.where(F.col("confirmed_ok"))
                            .groupBy("message_id").agg(F.bit_or(_label_bit(labels)).alias("mask"))
                            .where(F.col("mask") == everywhere).select("message_id"))
    accounted = tables.accounted_pairs().join(confirmed_everywhere, ["message_id"], "left_semi")
    pairs = accounted.groupBy("message_id", "queue").agg(F.bit_or(_label_bit(labels)).alias("mask"))
    unexported = sum(1 << index for index, label in enumerate(labels) if label in tables.unexported)
    if unexported and tables.parked_queues:
        parked = F.col("queue").isin(*tables.parked_queues)
        agreeing = F.col("mask").bitwiseOR(F.lit(unexported).cast("long"))
        pairs = pairs.withColumn("mask", F.when(parked, agreeing).otherwise(F.col("mask")))
    return outcome_rows(
        pairs, SAME_MESSAGES, F.col("mask") != everywhere, F.concat_ws(" ", "message_id", "queue"),
        F.format_string("%s, confirmed on every run, is delivered or stored in queue %s on %s"
                        " but not on %s",
                        "message_id", "queue", _labels_in(F.col("mask"), labels, True),
                        _labels_in(F.col("mask"), labels, False)),
        scope=_no_label())


def same_bodies(tables):
    hashes = (
        tables.messages.select(LABEL, "message_id", "body_sha256")
        .unionByName(tables.pair_events.where(F.col("delivered_sha256").isNotNull())
                     .select(LABEL, "message_id", F.col("delivered_sha256").alias("body_sha256")))
        .unionByName(tables.export.select(LABEL, "message_id", "body_sha256"))
    )
    per_message = hashes.groupBy("message_id").agg(
        F.min("body_sha256").alias("low"), F.max("body_sha256").alias("high"),
        F.min_by(LABEL, "body_sha256").alias("low_label"),
        F.max_by(LABEL, "body_sha256").alias("high_label"),
    )
    return outcome_rows(
        per_message, SAME_BODIES, F.col("low") != F.col("high"), F.col("message_id"),
        F.format_string("%s has different bodies: sha256 %s... on %s, %s... on %s", "message_id",
                        F.substring("low", 1, 12), "low_label", F.substring("high", 1, 12),
                        "high_label"),
        scope=_no_label())


def same_queue_sequences(tables):
    labels = tables.labels
    everywhere = (1 << len(labels)) - 1
    first = tables.first_deliveries()
    common = (first.groupBy("queue", "message_id").agg(F.bit_or(_label_bit(labels)).alias("mask"))
              .where(F.col("mask") == everywhere).select("queue", "message_id"))
    ordered = in_consumer_order(first.join(common, ["queue", "message_id"], "left_semi"))
    return outcome_rows(
        ordered, SAME_QUEUE_SEQUENCES, F.col("seq") < F.col("previous_seq"),
        F.concat_ws(" ", "queue", "message_id", LABEL),
        F.format_string("on %s, %s (seq %d) reached %s session %d from queue %s after %s (seq %d),"
                        " against the publisher's order every run shares", LABEL, "message_id",
                        "seq", "client", "session", "queue", "previous_id", "previous_seq"),
        scope=_no_label())


def cross_checks(tables):
    """The outcome DataFrames of every cross-backend check (L{CROSS_CHECKS}); none with fewer than
    two runs."""
    if len(tables.labels) < 2:
        return []
    if len(tables.labels) > MAX_RUNS:
        raise ValueError(f"at most {MAX_RUNS} runs can be compared, not {len(tables.labels)}")
    return [same_messages(tables), same_bodies(tables), same_queue_sequences(tables)]
