"""Derived check columns: pure DataFrame transforms run before a suite validates a table.

GX 1.x checks rows one by one or a column as a whole, with no per-group ordering on Spark
(`expect_column_values_to_be_increasing` orders the whole column, not each queue). So the
ordered, per-group facts are computed here with Spark window functions and validated as
ordinary columns, which keeps the failing rows visible: a row whose `prev_queue_offset` is
not below its `queue_offset` is shown with the broker, queue and offsets that broke order.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

# A queue as the broker knows it: its offsets are dense and ordered per (topic, queue) of one
# store; master and slave each have their own commitlog, hence broker_id.
QUEUE = ("cluster", "broker", "broker_id", "topic", "queue_id")
# A consumer group's view of one such queue, as audit_lag reports it per snapshot.
LAG_QUEUE = ("group", *QUEUE)


def with_message_checks(df: DataFrame) -> DataFrame:
    """Add `prev_queue_offset` (queue order by commitlog position) and `store_before_born_ms`.

    `prev_queue_offset` is the queue offset of the message stored just before this one in the
    same queue, so queue offsets are strictly increasing with phys_offset iff every row has
    queue_offset > prev_queue_offset. `store_before_born_ms` = born_ts - store_ts: how far the
    broker's store time lies before the producer's born time (positive only with clock skew).
    """
    # lag() has a fixed one-row frame; Spark rejects an explicit frame on it.
    by_position = Window.partitionBy(*QUEUE).orderBy(F.col("phys_offset"))
    return df.withColumn(
        "prev_queue_offset", F.lag(F.col("queue_offset")).over(by_position)
    ).withColumn("store_before_born_ms", F.col("born_ts") - F.col("store_ts"))


def with_consume_queue_checks(df: DataFrame) -> DataFrame:
    """Add `prev_phys_offset`: the commitlog position of the entry before in the same queue."""
    by_offset = Window.partitionBy(*QUEUE).orderBy(F.col("queue_offset"))
    return df.withColumn("prev_phys_offset", F.lag(F.col("phys_offset")).over(by_offset))


def with_latest_snapshot(df: DataFrame) -> DataFrame:
    """Add `is_latest`: whether the row belongs to its queue's most recent lag snapshot.

    Lag thresholds judge where each group stands now; an old STALLED snapshot that has since
    recovered must not fail today's gate.
    """
    queue = Window.partitionBy(*LAG_QUEUE).rowsBetween(
        Window.unboundedPreceding, Window.unboundedFollowing
    )
    return df.withColumn(
        "is_latest", F.col("snapshot_ts") == F.max(F.col("snapshot_ts")).over(queue)
    )
