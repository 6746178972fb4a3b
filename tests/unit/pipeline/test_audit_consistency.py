"""consistency on hand-built rows: ConsumeQueue entries, offset regressions, offset gaps."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import schemas
from pipeline.transforms.consistency import audit_consistency
from tests.unit.pipeline.audit_helpers import (
    T0,
    assert_rows,
    frame,
    messages,
    msg,
    offsets,
    snapshot,
)

pytestmark = pytest.mark.slow


def cq(queue_id: int, queue_offset: int, phys: int, **over: Any) -> dict[str, Any]:
    row = {"broker": "broker-a", "broker_id": 0, "topic": "TopicA", "queue_id": queue_id}
    return row | {"queue_offset": queue_offset, "phys_offset": phys, "size": 200} | over


def test_consistency_findings(spark: SparkSession) -> None:
    commitlog = [
        msg(0, "M0", 0),
        msg(200, "M1", 1),
        msg(1000, "M4", 4),  # 2 and 3 missing; bytes at [400, 600) were quarantined
        msg(1200, "N0", 0, queue_id=1),
        msg(1400, "N3", 3, queue_id=1),  # 1 and 2 missing, nothing quarantined
        msg(1200, "N0", 0, queue_id=1, broker_id=1),  # the slave has N0 only: no gap
    ]
    entries = [
        cq(0, 0, 0),
        cq(0, 1, 200),
        cq(0, 2, 400),  # its bytes were quarantined
        cq(0, 3, 800),  # no message starts there
        cq(0, 4, 1000),
        cq(0, 5, 1200),  # another queue's message is there
        cq(0, 6, 1000, size=180),  # wrong size for the message there
    ]
    damage = [
        {
            "broker": "broker-a",
            "broker_id": 0,
            "file": "0",
            "position": 400,
            "log_offset": 400,
            "length": 200,
            "reason": "bad_crc",
            "detail": "",
            "final": True,
            "first_run": 1,
        },
    ]
    snapshots = [
        snapshot(0, 5, 8),
        snapshot(60_000, 3, 8),  # committed offset went back by 2
        snapshot(120_000, 4, 6),  # the queue's max offset went back by 2
        snapshot(60_000, 0, 8, broker_id=1),  # the slave's series is not judged
    ]
    df = audit_consistency(
        frame(spark, schemas.CONSUME_QUEUE, entries),
        messages(spark, commitlog),
        offsets(spark, snapshots),
        frame(spark, schemas.QUARANTINE, damage),
        T0,
    )
    assert_rows(
        df,
        ["kind", "cause", "count", "group", "msg_id", "queue_id", "queue_offset", "phys_offset"],
        [
            ("cq_without_message", "message_quarantined", 1, None, None, 0, 2, 400),
            ("cq_without_message", "no_message_at_offset", 1, None, None, 0, 3, 800),
            ("cq_without_message", "points_at_other_message", 1, None, "N0", 0, 5, 1200),
            ("cq_without_message", "points_at_other_message", 1, None, "M4", 0, 6, 1000),
            ("offset_regression", "committed_offset_went_back", 2, "g1", None, 0, 3, None),
            ("offset_regression", "max_offset_went_back", 2, None, None, 0, 6, None),
            ("queue_offset_gap", "quarantined_bytes_between", 2, None, None, 0, 4, 1000),
            ("queue_offset_gap", "offsets_missing", 2, None, None, 1, 3, 1400),
        ],
    )
