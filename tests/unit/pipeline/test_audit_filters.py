"""`audit_filters` over hand-built rows: each group's SQL92 expression (the latest
consumer_filters snapshot by T) applied by the broker's evaluator to the stored properties."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker_runtime.common import findings as K
from pipeline import schemas
from pipeline.transforms.filter_audit import audit_filters, expired_unreceived, sql_matches
from tests.unit.pipeline.audit_helpers import (
    T0,
    delivery,
    frame,
    log,
    msg,
    offsets,
    snapshot,
)

pytestmark = pytest.mark.slow
AS_OF = T0 + 10**6
RED = "color = 'red' AND n > 1"


def filter_row(ts: int, expression: str, **over: Any) -> dict[str, Any]:
    row = {
        "broker": "broker-a", "broker_id": 0, "snapshot_ts": T0 + ts, "topic": "TopicA",
        "consumer_group": "g1", "expression_type": "SQL92", "expression": expression,
        "client_version": 1, "born_ts": T0 + 150, "dead_ts": None, "ingest_run": 1,
    }  # fmt: skip
    return row | over


def stored(q: int, color: str | None, **over: Any) -> dict[str, Any]:
    """TopicA queue 0 offset q, stored at T0 + 100 (q + 1), with its properties."""
    props = {"n": "5", "UNIQ_KEY": f"K{q}", "TAGS": "A"} | ({"color": color} if color else {})
    return msg(100 * (q + 1), f"K{q}", q, properties=props) | over


def test_the_broker_evaluator_decides() -> None:
    assert sql_matches(RED, {"color": "red", "n": "5"}) is True
    assert sql_matches(RED, {"color": "red", "n": "x"}) is False  # a failed conversion
    assert sql_matches(RED, {"n": "5"}) is False  # null is not a match
    assert sql_matches("color = ", {"color": "red"}) is None  # does not compile: no verdict
    assert sql_matches(None, {}) is None


def test_delivered_but_excluded_and_matched_but_skipped(spark: SparkSession) -> None:
    filters = [
        filter_row(10, "color = 'blue'", born_ts=T0),  # an older expression of g1
        filter_row(20, RED),  # g1's expression as of T
        filter_row(20, RED, broker_id=1),  # the slave's copy of the file
        filter_row(10**7, "color = 'blue'"),  # snapshotted after T
        filter_row(20, "color = 'red'", consumer_group="g3", expression_type="TAG"),
    ]
    messages = [
        stored(0, "red"),  # stored before g1's expression was registered: not expected
        stored(1, "blue"),  # delivered twice to g1: excluded by its expression
        stored(1, "blue", broker_id=1),  # the slave's copy: one finding
        stored(2, "red"),  # matches, passed by g1's offset, never delivered
        stored(3, "blue"),  # excluded, not delivered (then redelivered as a retry: ignored)
        stored(4, None),  # no color: null, excluded
        stored(5, "red"),  # matches, not reached by the offset yet: lag, not a finding
        stored(6, "red", topic="TopicB"),  # a topic without an expression
    ]
    deliveries = [
        delivery(1, "K1", queue_offset=1),
        delivery(2, "K1", queue_offset=1, client="c2"),
        delivery(3, "K3", queue_offset=0, reconsume_times=1, topic="%RETRY%g1"),
        delivery(4, "K1", queue_offset=1, group="g2"),  # g2 has no expression
        delivery(5, "K6", queue_offset=6, topic="TopicB"),
    ]
    filter_rows = frame(spark, schemas.CONSUMER_FILTERS, filters)
    stored_rows = frame(spark, schemas.MESSAGES, messages)
    by_t = offsets(spark, [snapshot(100, 2, 7), snapshot(500, 5, 7)])  # by T, as the job gives
    got = audit_filters(filter_rows, stored_rows, log(spark, deliveries), by_t, AS_OF).collect()
    rows = sorted((r.asDict() for r in got), key=lambda r: r["msg_id"])
    assert [
        (r["msg_id"], r["group"], r["kind"], r["cause"], r["count"], r["committed_offset"])
        for r in rows
    ] == [
        ("K1", "g1", K.FILTERED_WRONGLY, K.DELIVERED_BUT_EXCLUDED, 2, None),
        ("K2", "g1", K.FILTERED_WRONGLY, K.MATCHED_BUT_SKIPPED, 1, 5),
    ]
    excluded, skipped = rows
    assert (excluded["expression"], excluded["queue_offset"], excluded["as_of_ms"]) == (
        RED,
        1,
        AS_OF,
    )
    assert (excluded["first_ts"], excluded["last_ts"]) == (T0 + 1000, T0 + 2000)
    assert "broker-a/TopicA/0@1 delivered 2 time(s)" in excluded["detail"]
    assert (skipped["first_ts"], skipped["system"]) == (T0 + 300, "rocketmq")


def test_a_matching_message_whose_file_went_first_is_expired_not_skipped(
    spark: SparkSession,
) -> None:
    messages = [
        stored(0, "red"),  # stored before g1's expression was registered
        stored(2, "red"),  # matches, below the min offset, never delivered: expired
        stored(3, "blue"),  # below it too, but excluded
        stored(4, "red"),  # matches, delivered
        stored(5, "red"),  # matches, not reached by the offset yet
    ]
    args = (
        frame(spark, schemas.CONSUMER_FILTERS, [filter_row(20, RED)]),
        frame(spark, schemas.MESSAGES, messages),
        log(spark, [delivery(1, "K4", queue_offset=4)]),
        offsets(spark, [snapshot(500, 5, 7, min_offset=4)]),
        AS_OF,
    )
    lost = [r.asDict() for r in expired_unreceived(*args).collect()]
    assert [
        (
            r["msg_id"],
            r["group"],
            r["kind"],
            r["cause"],
            r["count"],
            r["committed_offset"],
            r["min_offset"],
        )
        for r in lost
    ] == [("K2", "g1", K.EXPIRED_BEFORE_CONSUMED, K.FILE_DELETED_BEFORE_DELIVERY, 1, 5, 4)]
    assert "below the queue's min offset 4" in lost[0]["detail"]
    assert audit_filters(*args).collect() == []  # not matched_but_skipped as well
