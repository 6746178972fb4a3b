"""Ingest runs over time: re-runs change nothing, new data is picked up once, damage is
quarantined (and a damaged tail that completes later is taken back), ledger updates merge."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from sqlalchemy import insert, update

from broker_runtime.common.message import (
    PRODUCER_GROUP,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    UNIQ_KEY,
    Message,
)
from broker_runtime.common.topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker_runtime.offsets import offset_history
from broker_runtime.offsets.consumer_filters import consumer_filter_path
from broker_runtime.offsets.consumer_offsets import ConsumerOffsets
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore
from pipeline.lake import table_path
from pipeline.readers.commitlog import segment_files
from pipeline.transforms.transactions import count_units
from tests.unit.pipeline import ledgers
from tests.unit.pipeline.stores import T0, config, stored, varied, write_store
from tests.unit.pipeline.test_ingest import ingest, make_cluster, rows, versions

pytestmark = pytest.mark.slow


def test_reruns_change_nothing_and_new_data_is_read_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = make_cluster(tmp_path)
    lake = tmp_path / "lake"
    first = ingest(spark, data, lake)
    before = versions(lake)
    snapshot = {
        t: sorted(map(repr, rows(spark, lake, t)))
        for t in ("messages", "consume_queue", "quarantine")
    }

    again = ingest(spark, data, lake)
    assert again["run"] is None and again["messages"] == 0
    assert versions(lake) == before  # no commit at all, so no duplicate append
    assert {t: sorted(map(repr, rows(spark, lake, t))) for t in snapshot} == snapshot

    b = data / "brokers" / "broker-b" / "master"
    store = MessageStore(config(b), disk_ratio=lambda _p: 0.0)
    store.put_messages(varied(40, start=5000))
    store.wait_dispatched(None)
    store.shutdown()
    co = ConsumerOffsets(b)
    co.commit("Topic2", "groupB", 1, 4)
    co.persist()
    stub = ledgers.message_stub
    voided = update(stub).where(stub.c.msg_id == "UNIQ00000003")
    ledgers.execute(data / "ledger" / "producer.db", voided.values(status="VOID", updated_at=2))
    ledgers.execute(
        data / "ledger" / "consumer.db", insert(ledgers.message_log).values(ledgers.log(99))
    )

    third = ingest(spark, data, lake)
    assert third["run"] == first["run"] + 1 and third["messages"] == 40
    msgs = rows(spark, lake, "messages")
    keys = [(m["broker"], m["broker_id"], m["phys_offset"]) for m in msgs]
    assert len(keys) == len(set(keys)) == 360 + 40
    new = [m for m in msgs if m["ingest_run"] == third["run"]]
    assert {m["broker"] for m in new} == {"broker-b"}
    assert sorted(m["phys_offset"] for m in new) == [m.phys_offset for m in stored(b)[-40:]]
    assert len(rows(spark, lake, "consume_queue")) == 400
    offsets = rows(spark, lake, "consumer_offsets")
    assert [(o["topic"], o["committed_offset"]) for o in offsets if o["broker"] == "broker-b"] == [
        ("Topic2", 4)
    ]
    stubs = {s["msg_id"]: s for s in rows(spark, lake, "message_stub")}
    assert len(stubs) == 20 and stubs["UNIQ00000003"]["status"] == "VOID"
    assert len(rows(spark, lake, "message_log")) == 31
    # One append per run: the history holds no duplicate append of the same data.
    hist = versions(lake)
    assert (
        hist["messages"] == before["messages"] + 1
        and hist["consume_queue"] == before["consume_queue"] + 1
    )


def test_count_units_takes_system_topics_and_commits_only() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "topic": [TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, "T", "T", "T", "T"],
            "sys_flag": [4, 0, TRANSACTION_COMMIT_TYPE, 4, 0, TRANSACTION_COMMIT_TYPE | 2],
        }
    )
    assert count_units(batch) == 4  # the two system units and the two commits


def test_transactions_are_rebuilt_by_a_run_that_read_transactional_units(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = make_cluster(tmp_path)
    lake = tmp_path / "lake"
    ingest(spark, data, lake)
    before = versions(lake)["transactions"]
    b = data / "brokers" / "broker-b" / "master"
    props = {UNIQ_KEY: "TX-HALF-1", PRODUCER_GROUP: "pg", REAL_TOPIC: "Topic0", REAL_QUEUE_ID: "1"}
    write_store(b, [Message(TRANS_HALF_TOPIC, b"x", props, sys_flag=4, born_timestamp=T0)])
    run = ingest(spark, data, lake)
    assert run["appended"]["transactions"] >= 1 and versions(lake)["transactions"] == before + 1
    tx = {(r["uniq_key"], r["state"]) for r in rows(spark, lake, "transactions")}
    assert ("TX-HALF-1", "pending") in tx
    # No transactional unit in these (prepared flags in real topics are not units): the
    # table stays as it is, with the rows of the run that built it.
    write_store(b, varied(12, start=7000))
    plain = ingest(spark, data, lake)
    assert plain["messages"] == 12 and plain["appended"]["transactions"] == 0
    assert versions(lake)["transactions"] == before + 1
    assert {(r["uniq_key"], r["state"]) for r in rows(spark, lake, "transactions")} == tx


def _corrupt(store: Path, offset: int, data: bytes) -> None:
    path = [p for p in segment_files(store) if int(p.name) <= offset][-1]
    with open(path, "r+b") as f:
        f.seek(offset - int(path.name))
        f.write(data)


def test_damage_is_quarantined_and_a_completed_tail_is_taken_back(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    store = data / "brokers" / "broker-a" / "master"
    write_store(store, varied(90))
    msgs = stored(store)
    crc_victim, magic_victim, last = msgs[20], msgs[60], msgs[-1]
    _corrupt(store, crc_victim.phys_offset + codec.HEADER_SIZE, bytes([crc_victim.body[0] ^ 0x55]))
    _corrupt(store, magic_victim.phys_offset + 4, b"\x0b\xad\xf0\x0d")
    path = segment_files(store)[-1]
    unit = path.read_bytes()[last.phys_offset - int(path.name) :][: last.total_size]
    end = last.phys_offset + last.total_size
    _corrupt(store, end, unit[:40])  # a write torn after 40 bytes
    lake = tmp_path / "lake"

    first = ingest(spark, data, lake)
    assert first["quarantine"] == {"bad_crc": 1, "bad_magic": 1, "torn": 1}
    q = {(r["log_offset"], r["reason"]): r for r in rows(spark, lake, "quarantine")}
    assert set(q) == {
        (crc_victim.phys_offset, "bad_crc"),
        (magic_victim.phys_offset, "bad_magic"),
        (end, "torn"),
    }
    assert q[(magic_victim.phys_offset, "bad_magic")]["length"] == magic_victim.total_size
    assert q[(end, "torn")]["final"] is False and q[(end, "torn")]["file"] == path.name
    got = {m["phys_offset"]: m for m in rows(spark, lake, "messages")}
    assert len(got) == 89 and magic_victim.phys_offset not in got
    assert got[crc_victim.phys_offset]["crc_ok"] is False

    before = versions(lake)
    assert ingest(spark, data, lake)["run"] is None  # the same damaged tail: nothing new
    assert versions(lake) == before

    # The torn write completes (the rest of a valid unit lands, phys offset and all).
    tail = bytearray(unit)
    tail[28:36] = end.to_bytes(8, "big")
    _corrupt(store, end, bytes(tail))
    third = ingest(spark, data, lake)
    assert third["messages"] == 1
    assert {(r["log_offset"], r["reason"]) for r in rows(spark, lake, "quarantine")} == {
        (crc_victim.phys_offset, "bad_crc"), (magic_victim.phys_offset, "bad_magic"),
    }  # fmt: skip
    assert end in {m["phys_offset"] for m in rows(spark, lake, "messages")}


def test_expired_log_files_and_missing_ledgers_are_reported(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    store = data / "brokers" / "broker-a" / "master"
    write_store(store, varied(200))
    first_file = segment_files(store)[0]
    gone = first_file.stat().st_size
    os.remove(first_file)  # as cleanup deletes an expired file
    lake = tmp_path / "lake"
    summary = ingest(spark, data, lake)
    assert summary["quarantine"] == {"expired": 1}
    [q] = rows(spark, lake, "quarantine")
    assert (q["log_offset"], q["length"], q["reason"]) == (0, gone, "expired")
    assert summary["messages"] == len(stored(store))
    assert rows(spark, lake, "message_stub") == [] and rows(spark, lake, "message_log") == []
    assert os.path.isdir(table_path(lake, "message_log") + "/_delta_log")


def test_offset_snapshots_record_the_queue_bounds_the_broker_reports(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    store_dir = data / "brokers" / "broker-a" / "master"
    write_store(store_dir, varied(400))
    # The broker's own cleanup expires the older log files, and with them the first entries
    # of each queue (its first ConsumeQueue file stays: its last entries are still good).
    store = MessageStore(
        dataclasses.replace(config(store_dir), file_reserved_hours=0), disk_ratio=lambda _p: 0.0
    )
    try:
        assert store.run_cleanup(force=True).commitlog_deleted
        queues = [*store.queues(), ("Topic0", 1)]  # the last one has no messages at all
        want = {q: (store.min_offset(*q), store.max_offset(*q)) for q in queues}
    finally:
        store.shutdown()
    assert sum(lo > 0 for lo, _ in want.values()) == len(queues) - 1 and want[("Topic0", 1)] == (
        0,
        0,
    )
    offsets = ConsumerOffsets(store_dir)
    for topic, queue_id in queues:
        offsets.commit(topic, "groupA", queue_id, 1)
    offsets.persist()

    ingest(spark, data, tmp_path / "lake")
    got = {
        (r["topic"], r["queue_id"]): (r["min_offset"], r["max_offset"])
        for r in rows(spark, tmp_path / "lake", "consumer_offsets")
    }
    assert got == want


def test_a_masters_offset_history_is_ingested_once_as_snapshots_of_their_own(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = make_cluster(tmp_path)
    store_dir = next(data.glob("brokers/*/master"))
    for ts, committed in ((1_000, 1), (2_000, 2), (3_000, 3)):
        entry = offset_history.snapshot(ts, {"Topic0@hist": {0: committed}}, lambda t, q: (0, 5))
        offset_history.write(store_dir, entry, keep=10)
    (offset_history.history_dir(store_dir) / "4000.json").write_text("{not json")
    consumer_filter_path(store_dir).write_text('{"filterDataByTopic": {"T": [1]}}')
    lake = tmp_path / "lake"
    ingest(spark, data, lake)
    ingest(spark, data, lake)  # the same snapshots again: nothing added
    history = sorted(
        (r["snapshot_ts"], r["committed_offset"], r["max_offset"])
        for r in rows(spark, lake, "consumer_offsets")
        if r["consumer_group"] == "hist"
    )
    assert history == [(1_000, 1, 5), (2_000, 2, 5), (3_000, 3, 5)]
    (bad,) = [q for q in rows(spark, lake, "quarantine") if q["reason"] == "bad_offsets_json"]
    assert "4000.json" in bad["detail"] and bad["file"] == "config/offsetHistory"
    # A damaged consumerFilter.json (no .bak) is said, and read from no other broker.
    (bad,) = [q for q in rows(spark, lake, "quarantine") if q["reason"] == "bad_filters_json"]
    assert "not a filterDataByTopic table" in bad["detail"]
    assert bad["file"] == "config/consumerFilter.json"
    assert (bad["broker"], bad["broker_id"]) == (store_dir.parent.name, 0)
    kept = {(r["broker"], r["broker_id"]) for r in rows(spark, lake, "consumer_filters")}
    assert (store_dir.parent.name, 0) not in kept and ("broker-a", 1) in kept


def test_a_consumer_offset_file_older_than_the_history_adds_no_snapshot(
    spark: SparkSession, tmp_path: Path
) -> None:
    """consumerOffset.json is dated by its last write and its queues' bounds are read by the
    ingest: where the master's history has a snapshot since that write, the file's would put
    later bounds before it (the queue seen to shrink), so it is left out. A replica without
    history keeps the file's snapshot."""
    data = make_cluster(tmp_path)
    master = data / "brokers" / "broker-a" / "master"
    written = 1_700_000_000_000
    ns = written * 1_000_000
    os.utime(master / "config" / "consumerOffset.json", ns=(ns, ns))
    # Half a second after the file's write, Topic0's queue 0 held 2 messages; it holds more now.
    entry = offset_history.snapshot(written + 500, {"Topic0@groupA": {0: 2}}, lambda t, q: (0, 2))
    offset_history.write(master, entry, keep=10)
    lake = tmp_path / "lake"
    ingest(spark, data, lake)
    dated: dict[tuple[str, int], set[int]] = {}
    for r in rows(spark, lake, "consumer_offsets"):
        dated.setdefault((r["broker"], r["broker_id"]), set()).add(r["snapshot_ts"])
    assert dated[("broker-a", 0)] == {written + 500}
    assert len(dated[("broker-a", 1)]) == 1  # the slave's copy of the file, as it was
