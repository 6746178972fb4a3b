"""Tiny hand-built inputs for the audit rules: rows as dicts over the ingested tables' schemas."""

from __future__ import annotations

from typing import Any

from chispa import assert_basic_rows_equality
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import StructType

from broker_runtime.common.constants import DEFAULT_CLUSTER
from pipeline import schemas
from pipeline.audit_schemas import DLQ_REPLAY_LOG
from pipeline.schemas import struct_of
from pipeline.transforms.audit_common import MESSAGE_COLUMNS, preferred_offsets

T0 = 1_700_000_000_000
Rows = list[dict[str, Any]]


def frame(spark: SparkSession, schema: StructType, rows: Rows) -> DataFrame:
    """Rows given as dicts over `schema`; unnamed columns are null, but `cluster`: the
    default cluster's rows unless they name one."""
    names = schema.fieldNames()
    for row in rows:
        stray = set(row) - set(names)
        assert not stray, f"columns not in the schema: {stray}"
    rows = [{"cluster": DEFAULT_CLUSTER, **row} for row in rows]
    return spark.createDataFrame([tuple(row.get(n) for n in names) for row in rows], schema)


def msg(phys: int, key: str | None, queue_offset: int, **over: Any) -> dict[str, Any]:
    """A message in broker-a's master commitlog, topic TopicA queue 0, 200 bytes."""
    row = {
        "broker": "broker-a",
        "broker_id": 0,
        "phys_offset": phys,
        "total_size": 200,
        "msg_id": f"OFF{phys:08d}",
        "topic": "TopicA",
        "queue_id": 0,
        "queue_offset": queue_offset,
        "uniq_key": key,
        "tags": None,
        "store_ts": T0 + phys,
        "reconsume_times": 0,
        "original_topic": "TopicA",
        "origin_msg_id": key,
        "consumer_group": None,
        "is_retry": False,
        "is_dlq": False,
        "is_scheduled": False,
    }
    return row | over


def messages(spark: SparkSession, rows: Rows) -> DataFrame:
    return frame(spark, schemas.MESSAGES, rows).select(*MESSAGE_COLUMNS)


def delivery(row_id: int, key: str, client: str = "c1", **over: Any) -> dict[str, Any]:
    """One message_log row of group g1 from broker-a TopicA queue 0, CONSUMED 10 ms later."""
    row = {
        "id": row_id,
        "msg_id": key,
        "topic": "TopicA",
        "group": "g1",
        "client_id": client,
        "broker": "broker-a",
        "queue_id": 0,
        "queue_offset": 0,
        "reconsume_times": 0,
        "received_at": T0 + 1000 * row_id,
        "outcome": "CONSUMED",
        "finished_at": T0 + 1000 * row_id + 10,
    }
    return row | over


def log(spark: SparkSession, rows: Rows) -> DataFrame:
    return frame(spark, schemas.MESSAGE_LOG, rows)


def stub(key: str, **over: Any) -> dict[str, Any]:
    """A stub CONFIRMED at broker-a TopicA 0@0, sent once."""
    row = {
        "msg_id": key,
        "topic": "TopicA",
        "tags": None,
        "keys": None,
        "body_hash": "0" * 64,
        "status": "CONFIRMED",
        "send_count": 1,
        "broker": "broker-a",
        "queue_id": 0,
        "queue_offset": 0,
        "next_resend_at": None,
        "created_at": T0,
        "updated_at": T0 + 5,
    }
    return row | over


def stubs(spark: SparkSession, rows: Rows) -> DataFrame:
    return frame(spark, schemas.MESSAGE_STUB, rows)


def snapshot(ts: int, committed: int, max_offset: int, **over: Any) -> dict[str, Any]:
    """Group g1's offset in broker-a (master) TopicA queue 0 at T0 + ts."""
    row = {
        "broker": "broker-a",
        "broker_id": 0,
        "snapshot_ts": T0 + ts,
        "topic": "TopicA",
        "consumer_group": "g1",
        "queue_id": 0,
        "committed_offset": committed,
        "max_offset": max_offset,
        "min_offset": None,
    }
    return row | over


def offsets(spark: SparkSession, rows: Rows) -> DataFrame:
    """The snapshot rows as the audit job hands them to the transforms: one replica's
    (audit_common.preferred_offsets)."""
    schema = schemas.CONSUMER_OFFSETS
    if "min_offset" not in schema.fieldNames():
        schema = StructType([*schema.fields, *struct_of("min_offset:long").fields])
    return preferred_offsets(frame(spark, schema, rows))


def ingested(spark: SparkSession, until: int = T0 + 10**9) -> DataFrame:
    """broker-a's commitlog read to its end at `until`."""
    return spark.createDataFrame(
        [(DEFAULT_CLUSTER, "broker-a", until)], "cluster string, broker string, ingested_to_ms long"
    )


def replays(spark: SparkSession, rows: Rows) -> DataFrame:
    return frame(spark, DLQ_REPLAY_LOG, rows)


def _order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is not None, v if v is not None else 0) for v in row)


def assert_rows(actual: DataFrame, columns: list[str], expected: list[tuple[Any, ...]]) -> None:
    """The projection of `actual` on `columns` equals `expected`, in any order.

    One Spark job: the rows are collected once and compared (with chispa's row diff) here.
    """
    got = sorted((tuple(r) for r in actual.select(*columns).collect()), key=_order)
    want = sorted(expected, key=_order)
    assert_basic_rows_equality(
        [Row(**dict(zip(columns, r, strict=True))) for r in got],
        [Row(**dict(zip(columns, r, strict=True))) for r in want],
    )
