"""audit_lag on hand-built offset snapshots: lag in messages and time, and each status."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from pipeline.transforms.lag import LagThresholds, audit_lag
from tests.unit.pipeline.audit_helpers import T0, assert_rows, messages, msg, offsets, snapshot

pytestmark = pytest.mark.slow


def test_lag_and_status_follow_the_trend(spark: SparkSession) -> None:
    snapshots = [
        snapshot(0, 0, 0),  # caught up
        snapshot(60_000, 0, 5),  # messages arrived; not judged on one snapshot
        snapshot(120_000, 0, 8),  # still waiting, offset did not move: stalled
        snapshot(400_000, 0, 8),  # no move for 400 s >= 300 s: stopped
        snapshot(460_000, 8, 8),  # caught up again
        snapshot(30_000, 99, 99, broker_id=1),  # the slave's copy: not the series
        snapshot(0, 0, 2000, queue_id=1),  # far behind, moving: WARN; the message is not
        snapshot(60_000, 1500, 2100, queue_id=1),  # in the lake, so no lag in time
        snapshot(0, 3, 4, broker="broker-b", broker_id=1),  # only a slave: its series is used
    ]
    commitlog = [msg(0, "W0", 0, store_ts=T0 + 50_000), msg(0, "B3", 3, broker="broker-b")]
    df = audit_lag(offsets(spark, snapshots), messages(spark, commitlog), LagThresholds(), T0)
    cols = ["broker", "broker_id", "queue_id", "snapshot_ts", "count", "lag_messages", "lag_ms"]
    cols += ["stuck_ms", "status", "cause", "msg_id", "kind", "group"]
    lag = ("lag", "g1")
    assert_rows(
        df,
        cols,
        [
            ("broker-a", 0, 0, T0, 0, 0, 0, 0, "OK", "caught_up", None, *lag),
            ("broker-a", 0, 0, T0 + 60_000, 5, 5, 10_000, 0, "OK", "within_thresholds", "W0", *lag),
            (
                "broker-a",
                0,
                0,
                T0 + 120_000,
                8,
                8,
                70_000,
                120_000,
                "STALLED",
                "no_progress",
                "W0",
                *lag,
            ),
            (
                "broker-a",
                0,
                0,
                T0 + 400_000,
                8,
                8,
                350_000,
                400_000,
                "STOPPED",
                "no_progress_past_limit",
                "W0",
                *lag,
            ),
            ("broker-a", 0, 0, T0 + 460_000, 0, 0, 0, 0, "OK", "caught_up", None, *lag),
            ("broker-a", 0, 1, T0, 2000, 2000, None, 0, "WARN", "lag_over_threshold", None, *lag),
            (
                "broker-a",
                0,
                1,
                T0 + 60_000,
                600,
                600,
                None,
                0,
                "OK",
                "within_thresholds",
                None,
                *lag,
            ),
            ("broker-b", 1, 0, T0, 1, 1, 0, 0, "OK", "within_thresholds", "B3", *lag),
        ],
    )


def test_thresholds_are_parameters(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match="warn_lag_ms"):
        LagThresholds(warn_lag_ms=-1)
    snapshots = [snapshot(0, 0, 5), snapshot(10_000, 0, 5)]
    strict = LagThresholds(warn_lag_messages=1, stopped_after_ms=10_000)
    df = audit_lag(offsets(spark, snapshots), messages(spark, []), strict, T0)
    assert_rows(df, ["snapshot_ts", "status"], [(T0, "WARN"), (T0 + 10_000, "STOPPED")])
