"""Small good and bad lakes: rows for every gated table, each defect placed where it shows.

Every defect of a bad table sits in a queue (or row) of its own, so the expectations it
breaks are exactly the ones listed in BAD_FAILURES and nothing cascades.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pipeline.lake import AUDIT_TABLES
from pipeline.lake import INGESTED_TABLES as TABLES
from tests.unit.pipeline.audit_helpers import frame

T0 = 1_700_000_000_000
MINUTE = 60_000
DAY = 86_400_000

Rows = list[dict[str, Any]]


def msg(phys: int, queue_id: int, queue_offset: int | None, **over: Any) -> dict[str, Any]:
    born = T0 + phys
    row = {
        "broker": "broker-a",
        "broker_id": 0,
        "phys_offset": phys,
        "topic": "TopicA",
        "queue_id": queue_id,
        "queue_offset": queue_offset,
        "uniq_key": f"U{phys:08d}",
        "born_ts": born,
        "store_ts": born + 3,
        "reconsume_times": 0,
        "crc_ok": True,
        "is_retry": False,
        "is_dlq": False,
    }
    return row | over


def good_messages() -> Rows:
    """Master and slave hold the same offsets (broker_id is part of the key), plus a retry."""
    rows = [msg(i * 200, i % 2, i // 2, broker_id=b) for b in (0, 1) for i in range(6)]
    retry = msg(1200, 0, 0, topic="%RETRY%g1", reconsume_times=1, is_retry=True)
    return [*rows, retry]


def bad_messages() -> Rows:
    return [
        *good_messages(),
        msg(0, 5, 0),  # same broker/broker_id/phys_offset as a good row
        msg(5000, 6, 3),
        msg(5200, 6, 2),  # queue offset goes back within queue 6
        msg(6000, 7, 0, store_ts=T0 + 6000 - 5000),  # stored 5 s before it was born
        msg(6200, 8, 0, crc_ok=False),
        msg(6400, 9, 0, reconsume_times=99),
        msg(6600, 10, 0, topic="no spaces allowed"),
        msg(6800, 11, None),
    ]


def cq(queue_id: int, queue_offset: int, phys: int, **over: Any) -> dict[str, Any]:
    row = {"broker": "broker-a", "broker_id": 0, "topic": "TopicA", "queue_id": queue_id}
    return row | {"queue_offset": queue_offset, "phys_offset": phys, "size": 180} | over


def good_consume_queue() -> Rows:
    return [cq(0, o, o * 400) for o in range(4)] + [cq(1, o, 200 + o * 400) for o in range(2)]


def bad_consume_queue() -> Rows:
    return [
        *good_consume_queue(),
        cq(5, 0, 2000),
        cq(5, 0, 2000),  # the same entry twice (and so not increasing)
        cq(6, 0, 3000, size=0),
        cq(7, 0, 4000),
        cq(7, 1, 3900),  # points back into the commitlog
    ]


def offset(ts: int, queue_id: int, committed: int, **over: Any) -> dict[str, Any]:
    row = {"broker": "broker-a", "broker_id": 0, "snapshot_ts": ts, "topic": "TopicA"}
    row |= {"consumer_group": "g1", "queue_id": queue_id, "committed_offset": committed}
    return row | {"max_offset": committed + 2} | over


def good_offsets() -> Rows:
    return [offset(T0 + s * MINUTE, q, s * 3 + q) for s in range(2) for q in range(2)]


def bad_offsets() -> Rows:
    return [
        *good_offsets(),
        offset(T0, 0, 7),  # a second offset for one snapshot/group/queue
        offset(T0, 2, -1),
        offset(T0, 3, 1, consumer_group="g 1"),
        offset(1_700_000_000, 4, 1),  # seconds, not milliseconds
    ]


def stub(msg_id: str, **over: Any) -> dict[str, Any]:
    row = {"msg_id": msg_id, "topic": "TopicA", "status": "CONFIRMED", "send_count": 1}
    row |= {"body_hash": hashlib.sha256(msg_id.encode()).hexdigest(), "broker": "broker-a"}
    row |= {"queue_id": 0, "queue_offset": 3, "created_at": T0, "updated_at": T0 + 50}
    return row | over


def good_stubs() -> Rows:
    return [
        stub("M1"),
        stub("M2", status="UNCONFIRMED", queue_offset=None, send_count=3),
        stub("M3", status="VOID"),
        # RabbitMQ: the default exchange, a confirm without queue coordinates.
        stub("R1", system="rabbitmq", topic="", broker="/", queue_id=None, queue_offset=None),
        stub(
            "R2",
            system="rabbitmq",
            topic="orders.eu",
            broker="/",
            queue_id=None,
            queue_offset=None,
            routing_key="order.7.paid",
            return_reason="NO_ROUTE",
        ),
    ]


def bad_stubs() -> Rows:
    return [
        *good_stubs(),
        stub("M1"),
        stub("M4", status="DONE"),
        stub("M5", body_hash="not-a-sha256"),
        stub("M6", updated_at=T0 - 1),
        stub("M7", send_count=17),
        stub("M8", queue_offset=None),  # confirmed, yet nobody knows where it was stored
        stub("M9", topic="orders.eu"),  # a RocketMQ topic cannot have a dot
    ]


def delivery(row_id: int, **over: Any) -> dict[str, Any]:
    row = {"id": row_id, "msg_id": f"M{row_id}", "topic": "TopicA", "group": "g1"}
    row |= {"client_id": "127.0.0.1@1", "broker": "broker-a", "queue_id": 0}
    row |= {"queue_offset": row_id, "reconsume_times": 0, "received_at": T0 + row_id}
    return row | {"outcome": "CONSUMED", "finished_at": T0 + row_id + 20} | over


def good_log() -> Rows:
    return [
        delivery(1),
        delivery(2, outcome="RECONSUME_LATER", reconsume_times=1),
        delivery(3, outcome=None, finished_at=None),  # still being consumed
        delivery(
            8,
            system="rabbitmq",
            topic="",
            group="work.eu",
            client_id="ctag-1.x",
            redelivered=True,
            settle="nack",
            requeue=True,
            outcome="RECONSUME_LATER",
            reconsume_times=20,  # x-delivery-count: RocketMQ's bound is not RabbitMQ's
        ),
    ]


def bad_log() -> Rows:
    return [
        *good_log(),
        delivery(1),
        delivery(4, outcome="OK"),
        delivery(5, finished_at=T0),  # finished before it was received
        delivery(6, finished_at=None),  # an outcome but no finish time
        delivery(7, group="bad group!"),
    ]


def damage(offset: int, final: bool, **over: Any) -> dict[str, Any]:
    row = {"broker": "broker-a", "broker_id": 0, "file": "00000000000000000000"}
    row |= {"position": offset, "log_offset": offset, "length": 64, "reason": "torn"}
    return row | {"detail": "TOTALSIZE 300, 64 bytes left", "final": final} | over


def finding(kind: str, msg_id: str | None, group: str | None, count: int, **over: Any) -> Rows:
    return [{"kind": kind, "msg_id": msg_id, "group": group, "count": count} | over]


def lag(ts: int, status: str, lag_messages: int, lag_ms: int, queue_id: int = 0) -> Rows:
    row = {"topic": "TopicA", "broker": "broker-a", "broker_id": 0, "queue_id": queue_id}
    row |= {"snapshot_ts": ts}
    row |= {"lag_messages": lag_messages, "lag_ms": lag_ms, "status": status}
    return finding("lag", None, "g1", lag_messages, cause="snapshot", **row)


def dead_letter(msg_id: str, queue_offset: int, age_ms: int, replayed: bool) -> Rows:
    row = {"topic": "%DLQ%g1", "broker": "broker-a", "queue_id": 0, "queue_offset": queue_offset}
    row |= {"original_topic": "TopicA", "age_ms": age_ms, "replayed": replayed}
    return finding("dead_lettered", msg_id, "g1", 17, cause="max_reconsume_times", **row)


def rabbit_dead_letter(msg_id: str) -> Rows:
    row = {"topic": "dlx", "broker": "/", "queue_id": None, "queue_offset": None}
    row |= {"original_topic": "orders", "age_ms": DAY, "replayed": False, "system": "rabbitmq"}
    return finding("dead_lettered", msg_id, "shipping", 1, cause="rejected", **row)


def transaction(state: str = "committed", **over: Any) -> Rows:
    """One row of `transactions`: committed 20 ms after its half message, by default."""
    row = {"broker": "broker-a", "producer_group": "pg", "uniq_key": "TX1", "topic": "TopicA"}
    row |= {"queue_id": 0, "half_queue_offset": 0, "half_phys_offset": 0, "half_units": 1}
    row |= {"checks": 0, "half_ts": T0, "last_half_ts": T0, "ops": 1, "op_ts": T0 + 20}
    row |= {"commits": 1, "commit_offsets": 1, "commit_ts": T0 + 20, "state": state}
    return [row | over]


def consumer_filter(group: str = "g1", **over: Any) -> dict[str, Any]:
    """One consumerFilter.json entry of broker-a's master, snapshotted at T0."""
    row = {"broker": "broker-a", "broker_id": 0, "snapshot_ts": T0, "topic": "TopicA"}
    row |= {"consumer_group": group, "expression_type": "SQL92", "expression": "a > 1"}
    row |= {"client_version": T0 - 5, "born_ts": T0 - 5, "dead_ts": None}
    return row | over


def good_filters() -> Rows:
    return [consumer_filter(), consumer_filter("g2", dead_ts=T0 - 1)]


def bad_filters() -> Rows:
    return [
        *good_filters(),
        consumer_filter(expression="b = 2"),  # g1 twice in one snapshot
        consumer_filter("g3", expression_type="TAG"),
        consumer_filter("g4", born_ts=1_700_000_000),  # seconds, not milliseconds
        consumer_filter("g 5"),
    ]


BAD_FILTER = {"cause": "delivered_but_excluded", "expression": "a > 1", "topic": "TopicA"}
BAD_FILTER |= {"queue_offset": 1}


def good_audits() -> dict[str, Rows]:
    return {
        "audit_duplicates": finding("stored_twice", "U1", None, 2, cause="producer_resend")
        + finding("delivered_twice", "U2", "g1", 2, cause="rebalance_overlap"),
        "audit_losses": [],
        # An old STALLED snapshot that has since recovered does not fail today's gate.
        "audit_lag": lag(T0, "STALLED", 50_000, 3_600_000) + lag(T0 + MINUTE, "OK", 5, 200),
        "audit_dead_letters": dead_letter("D1", 0, 30 * DAY, replayed=True)
        + dead_letter("D2", 1, DAY, replayed=False)
        + dead_letter("D2", 2, DAY, replayed=False)  # stored twice by the producer
        + rabbit_dead_letter("R1")
        + rabbit_dead_letter("R2"),  # RabbitMQ's name no queue position
        "resend_candidates": finding(
            "resend_due", "M1", None, 1, cause="unconfirmed", send_count=1
        ),
        "manual_handling": [],
        "consistency": [],
        "audit_transactions": [],
        "audit_filters": [],
    }


def bad_audits() -> dict[str, Rows]:
    good = good_audits()
    return good | {
        "audit_duplicates": good["audit_duplicates"]
        + finding("duplicate_effect", "U3", "g1", 2, cause="offset_not_committed")
        + finding("delivered_twice", "U4", "g1", 1, cause="retry"),
        "audit_losses": finding("vanished", "U5", "g1", 0, cause="?"),
        "audit_lag": good["audit_lag"][:1]
        + lag(T0 + MINUTE, "STOPPED", 20_000, 2 * 3_600_000)  # queue 0 now: stopped, behind
        + lag(T0 + 2 * MINUTE, "BROKEN", 1, 1, queue_id=1),
        "audit_dead_letters": good["audit_dead_letters"]
        + dead_letter("D3", 3, 30 * DAY, replayed=False)
        + dead_letter("D4", 3, DAY, replayed=False),  # the same DLQ position twice
        "resend_candidates": good["resend_candidates"] * 2,
        "manual_handling": finding("max_send_count", "M9", None, 1, cause="send_count 16"),
        "consistency": finding("offset_regression", None, "g1", 1, cause="offset 9 -> 4"),
        "audit_transactions": finding(
            "committed_twice",
            "TX1",
            None,
            2,
            cause="end_transaction_repeated",
            producer_group="pg",
            state="committed",
        ),
        "audit_filters": finding("filtered_wrongly", "K1", "g1", 1, **BAD_FILTER),
    }


def lake(spark: SparkSession, bad: bool) -> dict[str, DataFrame]:
    """Every gated table, plus one without a suite (listed as unvalidated)."""
    ingested = {
        "messages": bad_messages() if bad else good_messages(),
        "consume_queue": bad_consume_queue() if bad else good_consume_queue(),
        "consumer_offsets": bad_offsets() if bad else good_offsets(),
        "message_stub": bad_stubs() if bad else good_stubs(),
        "message_log": bad_log() if bad else good_log(),
        "quarantine": [damage(0, True)] if bad else [damage(4096, False)],
        "transactions": transaction("half_done", half_units=0, commit_ts=T0 - 1)
        if bad
        else transaction(),
        "consumer_filters": bad_filters() if bad else good_filters(),
    }
    tables = {t: frame(spark, TABLES[t], rows) for t, rows in ingested.items()}
    audits = bad_audits() if bad else good_audits()
    tables |= {t: frame(spark, AUDIT_TABLES[t], rows) for t, rows in audits.items()}
    tables["ingest_checkpoint"] = frame(spark, TABLES["ingest_checkpoint"], [])
    return tables


_BETWEEN = "expect_column_values_to_be_between"
_NOT_NULL = "expect_column_values_to_not_be_null"
_PAIR = "expect_column_pair_values_a_to_be_greater_than_b"
_IN_SET = "expect_column_values_to_be_in_set"
_UNIQUE = "expect_column_values_to_be_unique"
_COMPOUND = "expect_compound_columns_to_be_unique"
_REGEX = "expect_column_values_to_match_regex"
_ROWS = "expect_table_row_count_to_be_between"

_REPLICA = ("cluster", "broker", "broker_id")  # one store of one broker

# table -> the (expectation, columns) each bad table must fail, and nothing else.
BAD_FAILURES: dict[str, set[tuple[str, tuple[str, ...]]]] = {
    "messages": {
        (_COMPOUND, (*_REPLICA, "phys_offset")),
        (_PAIR, ("queue_offset", "prev_queue_offset")),
        (_BETWEEN, ("store_before_born_ms",)),
        (_IN_SET, ("crc_ok",)),
        (_BETWEEN, ("reconsume_times",)),
        (_REGEX, ("topic",)),
        (_NOT_NULL, ("queue_offset",)),
    },
    "consume_queue": {
        (_COMPOUND, (*_REPLICA, "topic", "queue_id", "queue_offset")),
        (_PAIR, ("phys_offset", "prev_phys_offset")),
        (_BETWEEN, ("size",)),
    },
    "consumer_offsets": {
        (_COMPOUND, (*_REPLICA, "snapshot_ts", "topic", "consumer_group", "queue_id")),
        (_BETWEEN, ("committed_offset",)),
        (_REGEX, ("consumer_group",)),
        (_BETWEEN, ("snapshot_ts",)),
    },
    "message_stub": {
        (_COMPOUND, ("cluster", "msg_id")),
        (_IN_SET, ("status",)),
        (_REGEX, ("body_hash",)),
        (_PAIR, ("updated_at", "created_at")),
        (_BETWEEN, ("send_count",)),
        (_NOT_NULL, ("queue_offset",)),
        (_REGEX, ("topic",)),
    },
    "message_log": {
        (_COMPOUND, ("cluster", "id")),
        (_IN_SET, ("outcome",)),
        (_PAIR, ("finished_at", "received_at")),
        (_NOT_NULL, ("finished_at",)),
        (_REGEX, ("group",)),
    },
    "quarantine": {(_ROWS, ())},
    "audit_duplicates": {(_ROWS, ()), (_BETWEEN, ("count",))},
    "audit_losses": {(_ROWS, ()), (_IN_SET, ("kind",)), (_BETWEEN, ("count",))},
    "audit_lag": {
        (_IN_SET, ("status",)),
        (_BETWEEN, ("lag_messages",)),
        (_BETWEEN, ("lag_ms",)),
        ("expect_column_values_to_not_be_in_set", ("status",)),
    },
    "audit_dead_letters": {
        (_BETWEEN, ("age_ms",)),
        (_COMPOUND, ("cluster", "broker", "topic", "queue_id", "queue_offset")),
    },
    "resend_candidates": {(_UNIQUE, ("msg_id",))},
    "manual_handling": {(_ROWS, ())},
    "consistency": {(_ROWS, ())},
    "transactions": {
        (_IN_SET, ("state",)),
        (_BETWEEN, ("half_units",)),
        (_PAIR, ("commit_ts", "half_ts")),
    },
    "audit_transactions": {(_ROWS, ())},
    "consumer_filters": {
        (_COMPOUND, (*_REPLICA, "snapshot_ts", "topic", "consumer_group")),
        (_IN_SET, ("expression_type",)),
        (_BETWEEN, ("born_ts",)),
        (_REGEX, ("consumer_group",)),
    },
    "audit_filters": {(_ROWS, ())},
}
