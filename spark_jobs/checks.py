"""The correctness checks of one run, as Spark DataFrames over L{spark_jobs.tables.RunTables}.

A check is a DataFrame of outcomes (L{outcome_rows}): one row per thing it
looked at, with a sort key and an example sentence naming the message when
that thing violates the check (both null when it is fine). The caller tallies
all checks' outcomes in one aggregation, so each check reads its input once
and nothing but counts and the first five examples per check reaches the
driver. Counts that are figures, not failures (C{acks_lost_to_crash}), are
tallied the same way, as outcomes that never violate. Cross-backend checks
(L{spark_jobs.cross_checks}) have the same shape with a null label.

What each check means:

  - C{confirmed_delivered_or_stored}: each (message confirmed with basic.ack,
    queue it was routed to) pair was delivered from that queue at least once or
    is still in that queue in the export. An unconfirmed message may be lost in
    a crash; that is not a violation. A run without an export (a reference
    broker's) cannot account for pairs routed to parked queues, which nobody
    consumes: they are left out of its check and counted
    (C{parked_pairs_unchecked}).
  - C{no_unflagged_duplicates}: a pair delivered again (its second or later
    delivery in epoch, time order) without the redelivered flag; a nack with
    requeue or a crash recovery flags the redelivery. One violation per pair.
  - C{order_per_publisher_and_priority}: within one queue, consumer connection
    (client, session), publisher and priority, first deliveries that are not
    flagged redelivered come in the consumer's event order (C{n}) with
    increasing C{seq}. Redeliveries are left out (a requeued message goes back
    near the head), as are repeated deliveries (the duplicate check's business).
  - C{acked_not_redelivered}: a pair delivered again after an ack in the same
    broker epoch. Delivered again in a later epoch, the ack was lost to the
    crash: AMQP 0-9-1 does not confirm acks to the client (RabbitMQ does the
    same), so that is counted (the C{acks_lost_to_crash} metric), not failed.
  - C{delivered_bodies_match}: each delivery's body hash and size equal its
    message's publish (a delivery of a message never published fails too).
  - C{stored_matches_published}: each (message, queue) of the export was
    published and routed to that queue (a C{delayed} line, still held by a
    delayed exchange, only needs the publish), with the published hash and size,
    once; and it was not acked in the run's last broker epoch, which ended in a
    clean stop: only an ack lost to a crash may leave an acked message stored.
    It needs the export (L{events.EXPORT_CHECKS}): a run without one has
    nothing here, and the summary marks the check not applicable to it.
"""

from pyspark.sql import Window
from pyspark.sql import functions as F

from spark_jobs import events
from spark_jobs.tables import LABEL, PAIR

RUN_CHECKS = events.BACKEND_CHECKS
(CONFIRMED_DELIVERED_OR_STORED, NO_UNFLAGGED_DUPLICATES, ORDER_PER_PUBLISHER_AND_PRIORITY,
 ACKED_NOT_REDELIVERED, DELIVERED_BODIES_MATCH, STORED_MATCHES_PUBLISHED) = RUN_CHECKS

ACKS_LOST_TO_CRASH = "acks_lost_to_crash"
PARKED_PAIRS_UNCHECKED = "parked_pairs_unchecked"
RUN_METRICS = (ACKS_LOST_TO_CRASH, PARKED_PAIRS_UNCHECKED)

SCOPE = "scope"  # the run label, or null for a cross-backend check
OUTCOME_COLUMNS = (SCOPE, "check", "sort_key", "example")


def outcome_rows(frame, check, violated, sort_key, example, scope=None):
    """
    The outcome columns of C{check} for each row of C{frame}: C{sort_key} and
    C{example} only where C{violated} (a null C{violated} counts as fine).

    @param scope: a column naming the run; the row's label by default.
    """
    violated = F.coalesce(violated, F.lit(False))
    return frame.select(
        (F.col(LABEL) if scope is None else scope).alias(SCOPE), F.lit(check).alias("check"),
        F.when(violated, sort_key).cast("string").alias("sort_key"),
        F.when(violated, example).cast("string").alias("example"))


def _pair_key():
    return F.concat_ws(" ", "message_id", "queue")


def _hash_prefix(column):
    return F.substring(F.coalesce(F.col(column), F.lit("none")), 1, 12)


def confirmed_delivered_or_stored(tables):
    """Also tallies C{parked_pairs_unchecked}: confirmed pairs routed to parked queues on runs
    without an export."""
    expected = tables.messages.where(F.col("confirmed_ok")).select(
        LABEL, "message_id", F.explode("queues").alias("queue"))
    unknowable = F.col(LABEL).isin(*tables.unexported) & F.col("queue").isin(*tables.parked_queues)
    accounted = tables.accounted_pairs().distinct().withColumn("accounted", F.lit(True))
    joined = expected.where(~unknowable).join(accounted, list(PAIR), "left")
    missing = F.format_string("%s was confirmed and routed to queue %s, but was neither delivered"
                              " from it nor stored in it", "message_id", "queue")
    return [
        outcome_rows(joined, CONFIRMED_DELIVERED_OR_STORED, F.col("accounted").isNull(),
                     _pair_key(), missing),
        outcome_rows(expected.where(unknowable), PARKED_PAIRS_UNCHECKED, F.lit(False),
                     F.lit(None), F.lit(None)),
    ]


def no_unflagged_duplicates(tables):
    pairs = tables.pair_events.where((F.col("kind") == events.DELIVER)
                                     & (F.col("delivery_number") == 1))
    example = F.format_string("%s was delivered from queue %s %d times; delivery %d"
                              " (%s session %d) was not flagged redelivered",
                              "message_id", "queue", "deliveries",
                              "unflagged_repeat.delivery_number", "unflagged_repeat.client",
                              "unflagged_repeat.session")
    return outcome_rows(pairs, NO_UNFLAGGED_DUPLICATES, F.col("unflagged_repeat").isNotNull(),
                        _pair_key(), example)


CONSUMER_STREAM = (LABEL, "queue", "client", "session", "publisher", "priority")


def in_consumer_order(first_deliveries, partition_by=CONSUMER_STREAM):
    """
    C{first_deliveries} with C{previous_id} and C{previous_seq}: the message
    before each in C{n} order within C{partition_by}. A lag over a window: no
    Python per row, one sort per consumer connection, publisher and priority.
    """
    order = Window.partitionBy(*partition_by).orderBy("n")
    return first_deliveries.select(
        *partition_by, "message_id", "seq", "n",
        F.lag("message_id").over(order).alias("previous_id"),
        F.lag("seq").over(order).alias("previous_seq"),
    )


def order_per_publisher_and_priority(tables):
    ordered = in_consumer_order(tables.first_deliveries())
    example = F.format_string("%s (seq %d) reached %s session %d from queue %s after %s (seq %d),"
                              " same publisher and priority %d", "message_id", "seq", "client",
                              "session", "queue", "previous_id", "previous_seq", "priority")
    return outcome_rows(ordered, ORDER_PER_PUBLISHER_AND_PRIORITY,
                        F.col("seq") < F.col("previous_seq"), _pair_key(), example)


def acked_not_redelivered(tables):
    """Also tallies C{acks_lost_to_crash}: acked pairs delivered again in a later epoch."""
    acked = tables.pair_events.where((F.col("kind") == events.ACK) & (F.col("ack_number") == 1))
    example = F.format_string("%s was acked from queue %s and delivered again in the same broker"
                              " epoch %d (%s session %d)", "message_id", "queue",
                              "delivered_after_ack.epoch", "delivered_after_ack.client",
                              "delivered_after_ack.session")
    return [
        outcome_rows(acked, ACKED_NOT_REDELIVERED, F.col("delivered_after_ack").isNotNull(),
                     _pair_key(), example),
        outcome_rows(acked.where(F.col("ack_lost_to_crash")), ACKS_LOST_TO_CRASH, F.lit(False),
                     F.lit(None), F.lit(None)),
    ]


def delivered_bodies_match(tables):
    deliveries = tables.pair_events.where(F.col("kind") == events.DELIVER)
    example = F.when(~F.col("published"), F.format_string(
        "%s was delivered from queue %s but never published", "message_id", "queue",
    )).otherwise(F.format_string(
        "%s was delivered from queue %s (%s session %d) with %d bytes, sha256 %s..., but"
        " published with %d bytes, sha256 %s...",
        "message_id", "queue", "client", "session", "size", _hash_prefix("delivered_sha256"),
        "published_size", _hash_prefix("published_sha256")))
    sort_key = F.concat_ws(" ", "message_id", "queue", F.format_string("%012d", "n"))
    return outcome_rows(deliveries, DELIVERED_BODIES_MATCH, ~F.col("body_matches"), sort_key,
                        example)


def stored_matches_published(tables, last_epochs):
    """C{last_epochs}: a DataFrame of C{label}, C{last_epoch} (the epoch of the broker that
    stopped cleanly)."""
    stored = tables.export.groupBy(*PAIR).agg(
        F.count(F.lit(1)).alias("copies"),
        F.min("body_sha256").alias("low_sha256"), F.max("body_sha256").alias("high_sha256"),
        F.min("size").alias("low_size"), F.max("size").alias("high_size"),
        F.max(F.col("state") == events.DELAYED).alias("delayed"),
    )
    published = tables.messages.select(
        LABEL, "message_id", "queues", F.col("size").alias("published_size"),
        F.col("body_sha256").alias("published_sha256"), F.lit(True).alias("published"))
    acks = (tables.pair_events.where((F.col("kind") == events.ACK) & (F.col("ack_number") == 1))
            .select(*PAIR, "last_ack_epoch"))
    joined = (stored.join(published, [LABEL, "message_id"], "left")
              .join(acks, list(PAIR), "left")
              .join(F.broadcast(last_epochs), [LABEL], "left"))
    same_body = ((F.col("low_sha256") == F.col("published_sha256"))
                 & (F.col("high_sha256") == F.col("published_sha256"))
                 & (F.col("low_size") == F.col("published_size"))
                 & (F.col("high_size") == F.col("published_size")))
    routed = F.col("delayed") | F.coalesce(F.array_contains("queues", F.col("queue")), F.lit(False))
    problem = (
        F.when(F.col("published").isNull(), F.format_string(
            "%s is stored in queue %s but was never published", "message_id", "queue"))
        .when(~routed, F.format_string(
            "%s is stored in queue %s, which its publish did not route it to",
            "message_id", "queue"))
        .when(F.col("copies") > 1, F.format_string(
            "%s is stored %d times in queue %s", "message_id", "copies", "queue"))
        .when(~F.coalesce(same_body, F.lit(False)), F.format_string(
            "%s is stored in queue %s with %d bytes, sha256 %s..., but was published with"
            " %d bytes, sha256 %s...",
            "message_id", "queue", "low_size", _hash_prefix("low_sha256"), "published_size",
            _hash_prefix("published_sha256")))
        .when(F.col("last_ack_epoch") >= F.col("last_epoch"), F.format_string(
            "%s is stored in queue %s though it was acked in broker epoch %d, the last one,"
            " which stopped cleanly",
            "message_id", "queue", "last_ack_epoch"))
    )
    with_problem = joined.withColumn("problem", problem)
    return outcome_rows(with_problem, STORED_MATCHES_PUBLISHED, F.col("problem").isNotNull(),
                        _pair_key(), F.col("problem"))


def run_checks(tables, last_epochs):
    """The outcome DataFrames of every per-run check (L{RUN_CHECKS}) and metric (L{RUN_METRICS})."""
    return [
        *confirmed_delivered_or_stored(tables),
        no_unflagged_duplicates(tables),
        order_per_publisher_and_priority(tables),
        *acked_not_redelivered(tables),
        delivered_bodies_match(tables),
        stored_matches_published(tables, last_epochs),
    ]
