"""Throughput and latency of each run, computed in Spark; only per-bucket
counts and percentiles reach the driver.

Throughput over time: publish and deliver events (every delivery,
redeliveries included) and their body bytes, counted per time bucket from the
run's first event of any kind, bucket C{floor((t - first_t) / width)}. The
width comes from the run's span, first to last event of any kind, and how
many events the series counts (L{bucket_seconds}): one of L{BUCKET_WIDTHS}
giving about L{EVENTS_PER_BUCKET} events per bucket, within L{MIN_POINTS} to
L{MAX_POINTS} buckets. So a run of a second or more gets at least 20 points,
a shorter one buckets of 10 ms (as many as fit) or more, and a long one never
more than L{MAX_POINTS}. Every bucket from the first to the one holding the
run's last event is in the series, empty ones as zeros (a broker down after a
crash shows as a drop, not a line across the gap). A point has its
C{start_s} (seconds since the run's first event), its counts, and its rates
per second: C{count / width} (MB are 10^6 bytes) under the same names as the
mean rates, so the two are read on one scale.

Mean rates: a kind's count (or bytes) divided by its active span, from its
first event to its last, 0 with fewer than two events (no span to measure).
The publishing span runs to the last confirm when that comes later: clients
send far ahead of what the broker has taken, and a confirmed publish is the
one the broker is done with. C{publish_active_s} and C{deliver_active_s} give
that span as C{[from, to]} in the series' seconds (null without a span).

How the series and the mean rates agree: every event of a kind lies in its
active span, so the k buckets that span touches hold all of them; those
buckets cover the span and stick out of it by less than one width at either
end, C{span <= k * width < span + 2 * width}. The series' average over them,
C{count / (k * width)}, is therefore at most the mean rate and short of it by
less than C{2 * width / span} of it: within 5% for a span of 40 buckets. The
chart draws the mean rate itself as a flat line over the active span, so the
table's figure is on the chart.

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

import math

from pyspark.sql import functions as F

from spark_jobs import events
from spark_jobs.tables import LABEL

CDF_FRACTIONS = [index / 100 for index in range(1, 101)]
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
PERCENTILE_ACCURACY = 10_000
CONFIRM, END_TO_END = "confirm", "end_to_end"
MEGABYTE = 1e6

# Bucket widths in seconds, smallest first; past the last, whole multiples of it.
# Each is at most 3 times the one before, which L{bucket_seconds} relies on.
BUCKET_WIDTHS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Buckets per series: at least MIN_POINTS when 10 ms buckets give that many, at
# most MAX_POINTS (detail for a 1,000-pixel-wide chart, and a summary.json of
# kilobytes whatever the run's length); in between, about EVENTS_PER_BUCKET
# events per bucket, so a short run's series is not all counting noise.
MIN_POINTS, MAX_POINTS = 20, 150
EVENTS_PER_BUCKET = 50
# The kinds a series counts: summary name prefix -> (event kind, count field).
SERIES_KINDS = {"publish": (events.PUBLISH, "published"), "deliver": (events.DELIVER, "delivered")}


def bucket_count(span, width):
    """How many buckets of C{width} seconds hold a run whose last event is C{span} seconds after
    its first."""
    return math.floor(span / width) + 1


def bucket_seconds(span, events=None):
    """
    The throughput series' bucket width, in seconds, for a run spanning C{span}
    seconds with C{events} events in its series (None: as many as you like).

    The aim is C{events / EVENTS_PER_BUCKET} buckets, kept within
    L{MIN_POINTS}..L{MAX_POINTS}: the smallest of L{BUCKET_WIDTHS} giving at
    most that many, or the next smaller one if that leaves fewer than
    L{MIN_POINTS} (neighbouring widths differ at most 3 times, so that one
    gives fewer than 3 * L{MIN_POINTS} + 1 <= L{MAX_POINTS}). Past the largest
    width, the smallest whole multiple of it giving at most L{MAX_POINTS}.
    """
    span = max(0.0, span)
    target = (MAX_POINTS if events is None
              else min(MAX_POINTS, max(MIN_POINTS, events // EVENTS_PER_BUCKET)))
    for index, width in enumerate(BUCKET_WIDTHS):
        if bucket_count(span, width) <= target:
            if bucket_count(span, width) < MIN_POINTS and index > 0:
                return BUCKET_WIDTHS[index - 1]
            return width
    largest = BUCKET_WIDTHS[-1]
    return largest * math.ceil(span / (largest * (MAX_POINTS - 1)))


def mean_rate(amount, first_t, last_t):
    """C{amount} per second over C{first_t}..C{last_t}; 0.0 when that span is empty."""
    if first_t is None or last_t is None or last_t <= first_t:
        return 0.0
    return amount / (last_t - first_t)


def _active_span(first_t, last_t, run_first_t):
    """C{[from, to]} seconds since the run's first event, or None when the span is empty."""
    if first_t is None or last_t is None or last_t <= first_t:
        return None
    return [first_t - run_first_t, last_t - run_first_t]


def _point(index, width, row):
    """One series point: the bucket's start, counts and per-second rates."""
    point = {"start_s": round(index * width, 9)}
    for prefix, (_, field) in SERIES_KINDS.items():
        count = row[field] if row else 0
        size = row[f"{field}_bytes"] if row else 0
        point.update({field: count, f"{field}_bytes": size,
                      f"{prefix}_msgs_per_s": count / width,
                      f"{prefix}_mb_per_s": size / MEGABYTE / width})
    return point


def throughput(tables, inventory):
    """
    The throughput part of the summary for every label.

    @param inventory: L{spark_jobs.analysis.Inventory} (first and last event
        times and per-kind spans).
    @return: a dict of label to C{{"publish_msgs_per_s": ..., "bucket_seconds":
        ..., "series": [...]}} (see the module docstring).
    """
    widths = {
        label: bucket_seconds(inventory.last_t(label) - inventory.first_t(label),
                              inventory.kind(label, events.PUBLISH).count
                              + inventory.kind(label, events.DELIVER).count)
        for label in tables.labels
    }
    starts = tables.spark.createDataFrame(
        [(label, inventory.first_t(label), float(widths[label])) for label in tables.labels],
        f"{LABEL} string, first_t double, width double")
    is_publish = F.col("kind") == events.PUBLISH
    is_deliver = F.col("kind") == events.DELIVER
    bucket = F.floor((F.col("t") - F.col("first_t")) / F.col("width")).cast("long").alias("bucket")
    per_bucket = (
        tables.of_kind(events.PUBLISH, events.DELIVER)
        .join(F.broadcast(starts), [LABEL])
        .groupBy(LABEL, bucket)
        .agg(F.sum(is_publish.cast("long")).alias("published"),
             F.sum(is_deliver.cast("long")).alias("delivered"),
             F.sum(F.when(is_publish, F.col("size")).otherwise(0)).alias("published_bytes"),
             F.sum(F.when(is_deliver, F.col("size")).otherwise(0)).alias("delivered_bytes"))
    )
    rows = {label: {} for label in tables.labels}
    for row in per_bucket.collect():
        rows[row[LABEL]][row["bucket"]] = row
    results = {}
    for label in tables.labels:
        width, run_first_t = widths[label], inventory.first_t(label)
        buckets = max(bucket_count(inventory.last_t(label) - run_first_t, width),
                      max(rows[label], default=-1) + 1)
        published = inventory.kind(label, events.PUBLISH)
        delivered = inventory.kind(label, events.DELIVER)
        confirmed = inventory.kind(label, events.CONFIRM)
        published_until = max(filter(None, (published.last_t, confirmed.last_t)), default=None)
        results[label] = {
            "publish_msgs_per_s": mean_rate(published.count, published.first_t, published_until),
            "deliver_msgs_per_s": mean_rate(delivered.count, delivered.first_t, delivered.last_t),
            "publish_mb_per_s": mean_rate(published.bytes / MEGABYTE, published.first_t,
                                          published_until),
            "deliver_mb_per_s": mean_rate(delivered.bytes / MEGABYTE, delivered.first_t,
                                          delivered.last_t),
            "publish_active_s": _active_span(published.first_t, published_until, run_first_t),
            "deliver_active_s": _active_span(delivered.first_t, delivered.last_t, run_first_t),
            "bucket_seconds": width,
            "series": [_point(index, width, rows[label].get(index)) for index in range(buckets)],
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
        "cdf": [[float(minimum), 0.0]]
               + [[float(value), fraction] for fraction, value in by_fraction.items()],
    }


def latency(tables):
    """The latency part of the summary: label to C{{"confirm": {...}, "end_to_end": {...}}}."""
    confirm_ms = tables.messages.where(F.col("confirmed_at").isNotNull()).select(
        LABEL, F.lit(CONFIRM).alias("measure"),
        ((F.col("confirmed_at") - F.col("published_at")) * 1000.0).alias("ms"))
    first_delivery_ms = tables.pair_events.where(
        (F.col("kind") == events.DELIVER) & (F.col("delivery_number") == 1) & F.col("published")
    ).select(LABEL, F.lit(END_TO_END).alias("measure"),
             ((F.col("t") - F.col("published_at")) * 1000.0).alias("ms"))
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
            results[label][measure] = (
                _distribution(row["count"], row["min"], row["max"], row["quantiles"])
                if row else _distribution(0, None, None, None))
    return results

