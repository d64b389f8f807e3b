"""Throughput and latency of each run, computed in Spark; only per-second
counts and percentiles reach the driver.

Throughput: publish and deliver events (every delivery, redeliveries
included) and their body bytes per whole second since the run's first event
of any kind, ``floor(t - first_t)``; seconds without any are filled with
zeros up to the last second that has some. The mean rates divide a kind's
count (or bytes; MB is 10^6 bytes) by its active span, from its first event
to its last, and are 0 with fewer than two events (no span to measure). The
publishing span runs to the last confirm when that comes later: clients send
far ahead of what the broker has taken, and a confirmed publish is the one
the broker is done with.

Latency, in milliseconds, as the publishing and consuming clients saw it:
confirm = the message's confirm time minus its publish time (basic.ack and
basic.nack alike); end-to-end = the first delivery of a (message, queue) pair
minus the message's publish time, whether or not that delivery was flagged
redelivered. Percentiles come from Spark's C{percentile_approx} (nearest rank:
the smallest value with at least that fraction of values at or below it,
exact below C{PERCENTILE_ACCURACY} values, within 1/PERCENTILE_ACCURACY of
the rank above); the CDF is the minimum at fraction 0 and the 1st..100th
percentiles. With no values, every figure is 0.0 and the CDF is empty.
"""

from pyspark.sql import functions as F

from spark_jobs import events
from spark_jobs.tables import LABEL

CDF_FRACTIONS = [index / 100 for index in range(1, 101)]
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
PERCENTILE_ACCURACY = 10_000
CONFIRM, END_TO_END = "confirm", "end_to_end"
MEGABYTE = 1e6


def mean_rate(amount, first_t, last_t):
    """C{amount} per second over C{first_t}..C{last_t}; 0.0 when that span is empty."""
    if first_t is None or last_t is None or last_t <= first_t:
        return 0.0
    return amount / (last_t - first_t)


def throughput(tables, inventory):
    """
    The throughput part of the summary for every label.

    @param inventory: L{spark_jobs.analysis.Inventory} (first event time and per-kind spans).
    @return: a dict of label to C{{"publish_msgs_per_s": ..., "series": [...]}}.
    """
    starts = tables.spark.createDataFrame(
        [(label, inventory.first_t(label)) for label in tables.labels], f"{LABEL} string, first_t double")
    is_publish = F.col("kind") == events.PUBLISH
    is_deliver = F.col("kind") == events.DELIVER
    per_second = (
        tables.of_kind(events.PUBLISH, events.DELIVER)
        .join(F.broadcast(starts), [LABEL])
        .groupBy(LABEL, F.floor(F.col("t") - F.col("first_t")).cast("long").alias("second"))
        .agg(F.sum(is_publish.cast("long")).alias("published"),
             F.sum(is_deliver.cast("long")).alias("delivered"),
             F.sum(F.when(is_publish, F.col("size")).otherwise(0)).alias("published_bytes"),
             F.sum(F.when(is_deliver, F.col("size")).otherwise(0)).alias("delivered_bytes"))
    )
    rows = {label: {} for label in tables.labels}
    for row in per_second.collect():
        rows[row[LABEL]][row["second"]] = row
    results = {}
    for label in tables.labels:
        last_second = max(rows[label], default=-1)
        series = []
        for second in range(last_second + 1):
            row = rows[label].get(second)
            series.append({
                "second": second,
                "published": row["published"] if row else 0,
                "delivered": row["delivered"] if row else 0,
                "published_bytes": row["published_bytes"] if row else 0,
                "delivered_bytes": row["delivered_bytes"] if row else 0,
            })
        published, delivered = inventory.kind(label, events.PUBLISH), inventory.kind(label, events.DELIVER)
        confirmed = inventory.kind(label, events.CONFIRM)
        published_until = max(filter(None, (published.last_t, confirmed.last_t)), default=None)
        results[label] = {
            "publish_msgs_per_s": mean_rate(published.count, published.first_t, published_until),
            "deliver_msgs_per_s": mean_rate(delivered.count, delivered.first_t, delivered.last_t),
            "publish_mb_per_s": mean_rate(published.bytes / MEGABYTE, published.first_t, published_until),
            "deliver_mb_per_s": mean_rate(delivered.bytes / MEGABYTE, delivered.first_t, delivered.last_t),
            "series": series,
        }
    return results


def _distribution(count, minimum, maximum, quantiles):
    if not count:
        return {"count": 0, **{name: 0.0 for name in PERCENTILES}, "max": 0.0, "cdf": []}
    by_fraction = dict(zip(CDF_FRACTIONS, quantiles))
    return {
        "count": count,
        **{name: float(by_fraction[fraction]) for name, fraction in PERCENTILES.items()},
        "max": float(maximum),
        "cdf": [[float(minimum), 0.0]] + [[float(value), fraction] for fraction, value in by_fraction.items()],
    }


def latency(tables):
    """The latency part of the summary: label to C{{"confirm": {...}, "end_to_end": {...}}}."""
    confirm_ms = tables.messages.where(F.col("confirmed_at").isNotNull()).select(
        LABEL, F.lit(CONFIRM).alias("measure"),
        ((F.col("confirmed_at") - F.col("published_at")) * 1000.0).alias("ms"))
    first_delivery_ms = tables.pair_events.where(
        (F.col("kind") == events.DELIVER) & (F.col("delivery_number") == 1) & F.col("published")
    ).select(LABEL, F.lit(END_TO_END).alias("measure"), ((F.col("t") - F.col("published_at")) * 1000.0).alias("ms"))
    aggregates = confirm_ms.unionByName(first_delivery_ms).groupBy(LABEL, "measure").agg(
        F.count(F.lit(1)).alias("count"), F.min("ms").alias("min"), F.max("ms").alias("max"),
        F.percentile_approx("ms", CDF_FRACTIONS, PERCENTILE_ACCURACY).alias("quantiles"),
    )
    found = {(row[LABEL], row["measure"]): row for row in aggregates.collect()}
    results = {}
    for label in tables.labels:
        results[label] = {}
        for measure in (CONFIRM, END_TO_END):
            row = found.get((label, measure))
            results[label][measure] = (_distribution(row["count"], row["min"], row["max"], row["quantiles"])
                                       if row else _distribution(0, None, None, None))
    return results

