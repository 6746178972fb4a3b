"""`audit_lag`: per group, queue and consumer offset snapshot, how far the group is behind in
messages and in time, with a status from the trend across snapshots.

Status of a snapshot (thresholds in `LagThresholds`):
- OK: nothing waiting, or progressing within the thresholds;
- WARN: progressing, but lag in messages or in time (age of the oldest waiting message) is at
  or over its threshold;
- STALLED: messages were waiting at this and the previous snapshot and the committed offset
  did not move in between;
- STOPPED: STALLED, and no move for `stopped_after_ms` or longer (counted from the last
  snapshot at which the offset moved or the group had caught up).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from broker_runtime.common import findings
from pipeline import audit_schemas
from pipeline.transforms.audit_common import (
    QUEUE,
    Transform,
    conform,
    queue_positions,
)


@dataclass(frozen=True)
class LagThresholds:
    warn_lag_messages: int = 1_000
    warn_lag_ms: int = 60_000
    stopped_after_ms: int = 300_000

    def __post_init__(self) -> None:
        for name in ("warn_lag_messages", "warn_lag_ms", "stopped_after_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def lag_snapshots(offsets: DataFrame, messages: DataFrame) -> DataFrame:
    """Each snapshot row (`offsets`: as audit_common.preferred_offsets returns them) with
    lag_messages, lag_ms and the oldest waiting message."""
    rows = offsets.withColumn(
        "lag_messages",
        F.greatest(F.col("max_offset") - F.col("committed_offset"), F.lit(0)).cast("long"),
    )
    # Only the positions some snapshot's committed offset points at (a few, in a large lake).
    points = rows.select(*QUEUE, F.col("committed_offset").alias("queue_offset")).distinct()
    at_points = messages.join(points, on=[*QUEUE, "queue_offset"], how="left_semi")
    waiting = queue_positions(at_points).select(
        *QUEUE,
        F.col("queue_offset").alias("committed_offset"),
        F.col("store_ts").alias("oldest_ts"),
        F.col("uniq_key").alias("oldest_key"),
    )
    rows = rows.join(waiting, on=[*QUEUE, "committed_offset"], how="left")
    behind = F.col("lag_messages") > 0
    return rows.withColumns(
        {
            # Unknown (null) when the waiting message is not in the lake.
            "lag_ms": F.when(~behind, F.lit(0).cast("long")).when(
                F.col("oldest_ts").isNotNull(),
                F.greatest(F.col("snapshot_ts") - F.col("oldest_ts"), F.lit(0)),
            ),
            "oldest_ts": F.when(behind, F.col("oldest_ts")),
            "oldest_key": F.when(behind, F.col("oldest_key")),
        }
    )


def with_status(thresholds: LagThresholds) -> Transform:
    """Add `status`, `cause` and `stuck_ms` from the trend within each group and queue."""

    def apply(rows: DataFrame) -> DataFrame:
        series = Window.partitionBy("group", *QUEUE).orderBy(F.col("snapshot_ts"))
        so_far = series.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        prev_committed = F.lag("committed_offset").over(series)
        prev_lag = F.lag("lag_messages").over(series)
        rows = rows.withColumns(
            {
                "_moved": prev_committed.isNull() | (F.col("committed_offset") != prev_committed),
                "_prev_lag": prev_lag,
            }
        )
        reset = F.col("_moved") | (F.col("lag_messages") == 0)
        rows = rows.withColumn("_reset_ts", F.max(F.when(reset, F.col("snapshot_ts"))).over(so_far))
        stalled = (F.col("lag_messages") > 0) & (F.col("_prev_lag") > 0) & ~F.col("_moved")
        stuck_ms = F.when(stalled, F.col("snapshot_ts") - F.col("_reset_ts")).otherwise(0)
        rows = rows.withColumn("stuck_ms", stuck_ms.cast("long"))
        over = (F.col("lag_messages") >= thresholds.warn_lag_messages) | (
            F.col("lag_ms") >= thresholds.warn_lag_ms
        )
        stopped = stalled & (F.col("stuck_ms") >= thresholds.stopped_after_ms)
        status = (
            F.when(F.col("lag_messages") == 0, "OK")
            .when(stopped, "STOPPED")
            .when(stalled, "STALLED")
            .when(over, "WARN")
            .otherwise("OK")
        )
        cause = (
            F.when(F.col("lag_messages") == 0, "caught_up")
            .when(stopped, "no_progress_past_limit")
            .when(stalled, "no_progress")
            .when(over, "lag_over_threshold")
            .otherwise("within_thresholds")
        )
        return rows.withColumns({"status": status, "cause": cause}).drop(
            "_moved", "_prev_lag", "_reset_ts"
        )

    return apply


def audit_lag(
    offsets: DataFrame, messages: DataFrame, thresholds: LagThresholds, as_of_ms: int
) -> DataFrame:
    """The `audit_lag` table."""
    return (
        lag_snapshots(offsets, messages)
        .transform(with_status(thresholds))
        .select(
            F.col("oldest_key").alias("msg_id"),
            "group",
            F.lit(findings.LAG).alias("kind"),
            "cause",
            F.col("lag_messages").alias("count"),
            *QUEUE,
            "broker_id",
            "snapshot_ts",
            "committed_offset",
            "max_offset",
            "lag_messages",
            "lag_ms",
            "stuck_ms",
            "status",
            F.col("oldest_ts").alias("first_ts"),
        )
        .transform(conform(audit_schemas.AUDIT_LAG, as_of_ms))
    )
