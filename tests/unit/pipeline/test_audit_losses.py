"""audit_losses on hand-built rows: acked but not stored, passed but never delivered, expired;
and the look-alikes (backlog, tag filter, not yet ingested, other broker, unacknowledged)."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession

from pipeline.transforms.losses import audit_losses
from tests.unit.pipeline.audit_helpers import (
    T0,
    assert_rows,
    delivery,
    ingested,
    log,
    messages,
    msg,
    offsets,
    snapshot,
    stub,
    stubs,
)

pytestmark = pytest.mark.slow

COLUMNS = ["msg_id", "group", "kind", "cause", "count", "queue_id", "queue_offset"]


def _audit(spark: SparkSession, min_offset: int | None) -> DataFrame:
    tag = {"tags": "TagA"}
    commitlog = [
        msg(0, "K1", 0, **tag),  # delivered
        msg(200, "K2", 1, **tag),  # passed by g1's offset, never delivered
        msg(400, "K3", 2, tags="TagB"),  # g1 never receives TagB: filtered out, not lost
        msg(600, "K4", 5, **tag),  # not reached yet (backlog)
        msg(800, "E1", 0, queue_id=1, **tag),  # below queue 1's min offset, never delivered
        msg(1000, "E2", 1, queue_id=1, **tag),  # below the min offset too, but delivered
    ]
    deliveries = [
        delivery(1, "K1"),
        delivery(2, "E2", queue_id=1, queue_offset=1),
        delivery(3, "L2", queue_offset=7),
    ]
    snapshots = [
        snapshot(0, 1, 6),  # older snapshot: g1 had not passed K2 yet
        snapshot(60_000, 4, 6),
        snapshot(60_000, 2, 2, queue_id=1, min_offset=min_offset),
        snapshot(60_000, 0, 6, consumer_group="g2"),  # g2 never received anything
    ]
    ledger = [
        stub("K1"),
        stub("L1", queue_offset=6),  # acked, not in any commitlog
        stub("L2", queue_offset=7),  # acked, not stored, yet a consumer logged it
        stub("L3", queue_offset=8, updated_at=T0 + 2 * 10**9),  # acked after the ingest read
        stub("L4", broker="broker-z"),  # a broker the lake does not hold
        stub("L5", status="UNCONFIRMED", queue_offset=None),  # never acknowledged
        stub("L6", status="UNCONFIRMED", queue_offset=9),  # an offset, but never acknowledged
        stub("L7", queue_id=1, queue_offset=2),  # acked at the queue's min offset: not expired
        stub("X1", queue_id=1, queue_offset=0, tags="TagA"),  # expired before ingest
    ]
    return audit_losses(
        messages(spark, commitlog),
        stubs(spark, ledger),
        log(spark, deliveries),
        offsets(spark, snapshots),
        ingested(spark),
        T0,
    )


def test_losses_by_kind(spark: SparkSession) -> None:
    assert_rows(
        _audit(spark, min_offset=2),
        COLUMNS,
        [
            ("L1", None, "lost_after_ack", "absent_from_commitlog", 1, 0, 6),
            ("L2", None, "lost_after_ack", "absent_from_commitlog_after_delivery", 1, 0, 7),
            ("L7", None, "lost_after_ack", "absent_from_commitlog", 1, 1, 2),
            ("K2", "g1", "never_delivered", "offset_passed_without_delivery", 1, 0, 1),
            ("E1", "g1", "expired_before_consumed", "file_deleted_before_delivery", 1, 1, 0),
            ("X1", "g1", "expired_before_consumed", "file_deleted_before_delivery", 1, 1, 0),
        ],
    )


def test_without_min_offsets_nothing_counts_as_expired(spark: SparkSession) -> None:
    """Ingest that records no queue min offset: the same messages are judged as plain losses."""
    assert_rows(
        _audit(spark, min_offset=None),
        COLUMNS,
        [
            ("L1", None, "lost_after_ack", "absent_from_commitlog", 1, 0, 6),
            ("L2", None, "lost_after_ack", "absent_from_commitlog_after_delivery", 1, 0, 7),
            ("L7", None, "lost_after_ack", "absent_from_commitlog", 1, 1, 2),
            ("X1", None, "lost_after_ack", "absent_from_commitlog", 1, 1, 0),
            ("K2", "g1", "never_delivered", "offset_passed_without_delivery", 1, 0, 1),
            ("E1", "g1", "never_delivered", "offset_passed_without_delivery", 1, 1, 0),
        ],
    )


def test_a_message_one_subscriber_received_is_lost_for_the_other(spark: SparkSession) -> None:
    """Two groups take TagA: a message only g2 received is never_delivered for g1 alone; one
    both received, and one of TagB (g2's alone), are nobody's loss."""
    commitlog = [
        msg(0, "K1", 0, tags="TagA"),
        msg(200, "K2", 1, tags="TagA"),
        msg(400, "K3", 2, tags="TagB"),
    ]
    deliveries = [
        delivery(1, "K1"),
        delivery(2, "K1", group="g2"),
        delivery(3, "K2", group="g2", queue_offset=1),
        delivery(4, "K3", group="g2", queue_offset=2),
    ]
    snapshots = [snapshot(60_000, 3, 3), snapshot(60_000, 3, 3, consumer_group="g2")]
    found = audit_losses(
        messages(spark, commitlog),
        stubs(spark, [stub("K1"), stub("K2", queue_offset=1), stub("K3", queue_offset=2)]),
        log(spark, deliveries),
        offsets(spark, snapshots),
        ingested(spark),
        T0,
    )
    assert_rows(
        found, COLUMNS, [("K2", "g1", "never_delivered", "offset_passed_without_delivery", 1, 0, 1)]
    )
