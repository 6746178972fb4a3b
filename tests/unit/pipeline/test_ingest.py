"""Ingest: store files and ledgers -> Delta tables, checked field by field against the store."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.common.message import (
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    REPLAY_OF_PROPERTY,
    RETRY_TOPIC,
)
from broker_runtime.common.topics import SCHEDULE_TOPIC, group_of
from broker_runtime.offsets.consumer_filters import ConsumerFilterManager, consumer_filter_path
from pipeline import schemas
from pipeline.delta_io import DeltaIO, history
from pipeline.jobs.ingest import run_ingest
from pipeline.lake import INGESTED_TABLES, table_path
from tests.unit.pipeline import ledgers
from tests.unit.pipeline.stores import stored, varied, write_store

pytestmark = pytest.mark.slow
RANGE = 24 * 1024
FILTER_BORN = 1_700_000_000_000  # several ranges per 64 KiB segment: split points are exercised


def make_cluster(root: Path) -> Path:
    data = root / "data"
    a = data / "brokers" / "broker-a" / "master"
    write_store(a, varied(150), offsets={("Topic0", "groupA", 0): 7, ("Topic1", "groupA", 2): 3})
    filters = ConsumerFilterManager(a, now_ms=0)  # groupA's SQL92 subscription, since left
    filters.register_group(
        "groupA", [("Topic0", "a > 1", "SQL92", 5), ("Topic1", "*", "TAG", 5)], FILTER_BORN
    )
    filters.unregister("groupA", FILTER_BORN + 10)
    filters.persist(FILTER_BORN + 20)
    shutil.copytree(a, data / "brokers" / "broker-a" / "slave")
    write_store(data / "brokers" / "broker-b" / "master", varied(60, start=1000))
    ledgers.create(data, [ledgers.stub(i) for i in range(20)], [ledgers.log(i) for i in range(30)])
    return data


def ingest(spark: SparkSession, data: Path, lake: Path) -> dict[str, Any]:
    return run_ingest(data, lake, spark, range_bytes=RANGE, progress=False)


def rows(spark: SparkSession, lake: Path, table: str) -> list[dict[str, Any]]:
    df = DeltaIO(spark).read(table_path(lake, table), INGESTED_TABLES[table])
    return [r.asDict(recursive=True) for r in df.collect()]


def versions(lake: Path) -> dict[str, int]:
    return {t: len(history(table_path(lake, t))) for t in INGESTED_TABLES}


@pytest.fixture(scope="module")
def ingested(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ingest")
    data = make_cluster(root)
    summary = ingest(spark, data, root / "lake")
    assert summary["messages"] == 150 + 150 + 60 and summary["quarantine"] == {}
    return data, root / "lake"


def test_round_trip_every_field(spark: SparkSession, ingested: tuple[Path, Path]) -> None:
    data, lake = ingested
    got = {
        (r["broker"], r["broker_id"], r["phys_offset"]): r for r in rows(spark, lake, "messages")
    }
    want = {
        ("broker-a", 0): stored(data / "brokers" / "broker-a" / "master"),
        ("broker-a", 1): stored(data / "brokers" / "broker-a" / "slave"),
        ("broker-b", 0): stored(data / "brokers" / "broker-b" / "master"),
    }
    assert len(got) == sum(len(v) for v in want.values())
    for (broker, broker_id), msgs in want.items():
        for m in msgs:
            r = got[(broker, broker_id, m.phys_offset)]
            p = m.properties
            delivery = p.get(REAL_TOPIC, m.topic) if m.topic == SCHEDULE_TOPIC else m.topic
            expect = {
                "total_size": m.total_size, "msg_id": m.msg_id, "topic": m.topic,
                "queue_id": m.queue_id, "queue_offset": m.queue_offset, "uniq_key": m.uniq_key,
                "keys": m.keys, "tags": m.tags, "born_ts": m.born_timestamp,
                "store_ts": m.store_timestamp, "reconsume_times": m.reconsume_times,
                "body_crc": m.body_crc, "crc_ok": True, "flag": m.flag, "sys_flag": m.sys_flag,
                "born_host": f"{m.born_host[0]}:{m.born_host[1]}",
                "store_host": f"{m.store_host[0]}:{m.store_host[1]}",
                "prepared_tx_offset": m.prepared_transaction_offset, "body_size": len(m.body),
                "body": m.body, "properties": p, "delivery_topic": delivery,
                "original_topic": p.get(RETRY_TOPIC) or p.get(REAL_TOPIC) or m.topic,
                "origin_msg_id": p.get(ORIGIN_MESSAGE_ID) or p.get(REPLAY_OF_PROPERTY)
                or m.uniq_key,
                "consumer_group": group_of(delivery),
                "is_retry": delivery.startswith("%RETRY%"), "is_dlq": delivery.startswith("%DLQ%"),
                "is_scheduled": m.topic == SCHEDULE_TOPIC,
                "delay_level": int(p["DELAY"]) if "DELAY" in p else None, "ingest_run": 1,
                "store_date": dt.datetime.fromtimestamp(m.store_timestamp / 1000, dt.UTC).date(),
                "cluster": DEFAULT_CLUSTER,
            }  # fmt: skip
            assert {k: r[k] for k in expect} == expect
    assert set(schemas.MESSAGES.fieldNames()) == set(next(iter(got.values())))


def test_consume_queue_offsets_and_ledgers(
    spark: SparkSession, ingested: tuple[Path, Path]
) -> None:
    _, lake = ingested
    cq = rows(spark, lake, "consume_queue")
    msgs = rows(spark, lake, "messages")
    assert len(cq) == len(msgs)
    by_key = {
        (m["broker"], m["broker_id"], m["topic"], m["queue_id"], m["queue_offset"]): m for m in msgs
    }
    for e in cq:
        m = by_key[(e["broker"], e["broker_id"], e["topic"], e["queue_id"], e["queue_offset"])]
        assert (e["phys_offset"], e["size"]) == (m["phys_offset"], m["total_size"])
    offsets = rows(spark, lake, "consumer_offsets")
    got = {
        (o["broker_id"], o["topic"], o["consumer_group"], o["queue_id"]): (
            o["committed_offset"],
            o["max_offset"],
            o["min_offset"],  # nothing expired: every queue starts at 0
        )
        for o in offsets
    }
    qmax = {}
    for m in msgs:
        if m["broker"] == "broker-a" and m["broker_id"] == 0:
            k = (m["topic"], m["queue_id"])
            qmax[k] = max(qmax.get(k, 0), m["queue_offset"] + 1)
    assert got[(0, "Topic0", "groupA", 0)] == (7, qmax[("Topic0", 0)], 0)
    assert got[(1, "Topic1", "groupA", 2)] == (3, qmax[("Topic1", 2)], 0)  # the slave's copy
    assert {o["broker"] for o in offsets} == {"broker-a"}
    stubs = sorted(rows(spark, lake, "message_stub"), key=lambda r: r["msg_id"])
    assert stubs == [{**ledgers.stub(i), "cluster": DEFAULT_CLUSTER} for i in range(20)]
    logs = sorted(rows(spark, lake, "message_log"), key=lambda r: r["id"])
    assert [{k: v for k, v in r.items() if k != "id"} for r in logs] == [
        {**ledgers.log(i), "cluster": DEFAULT_CLUSTER} for i in range(30)
    ]
    assert [r["id"] for r in logs] == list(range(1, 31))


def test_consumer_filters_are_read_from_consumerfilter_json(
    spark: SparkSession, ingested: tuple[Path, Path]
) -> None:
    data, lake = ingested
    got = sorted(rows(spark, lake, "consumer_filters"), key=lambda r: r["broker_id"])
    master = data / "brokers" / "broker-a" / "master"
    when = {
        b: consumer_filter_path(data / "brokers" / "broker-a" / n).stat().st_mtime_ns // 10**6
        for b, n in ((0, "master"), (1, "slave"))
    }
    assert master.exists() and [(r["broker"], r["broker_id"]) for r in got] == [
        ("broker-a", 0),
        ("broker-a", 1),  # the slave's copy (copied with the store)
    ]
    for r in got:
        assert r == {
            "broker": "broker-a", "broker_id": r["broker_id"], "snapshot_ts": when[r["broker_id"]],
            "topic": "Topic0", "consumer_group": "groupA", "expression_type": "SQL92",
            "expression": "a > 1", "client_version": 5, "born_ts": FILTER_BORN,
            "dead_ts": FILTER_BORN + 10, "ingest_run": 1, "cluster": DEFAULT_CLUSTER,
        }  # fmt: skip


def test_tables_readable_by_deltalake_and_spark(
    spark: SparkSession, ingested: tuple[Path, Path]
) -> None:
    _, lake = ingested
    for name, schema in INGESTED_TABLES.items():
        path = table_path(lake, name)
        table = DeltaTable(path)
        assert table.protocol().min_reader_version == 1
        assert [f.name for f in table.schema().fields] == schema.fieldNames()
        n_delta = sum(pq.read_metadata(u).num_rows for u in table.file_uris())
        n_spark = (
            spark.read.schema(schema).parquet(*table.file_uris()).count()
            if table.file_uris()
            else 0
        )
        assert n_delta == n_spark == len(rows(spark, lake, name)), name
    assert sorted(
        table.metadata().partition_columns for table in [DeltaTable(table_path(lake, "messages"))]
    ) == [["broker", "store_date"]]
