"""Real store files and ledgers -> ingest -> audit -> reports, finding injected faults.

A broker-a master store is written through the broker's own store and send-back/schedule
rules (a producer resend, a message that fails into the DLQ through two retries), copied to
its slave as replication would, with SQLite ledgers beside it (one stub confirmed at an
offset its queue never had) and two consumerOffset.json snapshots where group g2 does not
move; group g3 subscribes to TopicB by SQL92 (consumerFilter.json) and got one message its
expression excludes and missed one it matches. Ingest runs twice (one per snapshot), then
the audit and both reports.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker_runtime.broker.retry_policy import decide_send_back, send_back_message
from broker_runtime.cli.main import main
from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.delay import DelayLevels, from_schedule, to_schedule
from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.ledger.consumer import ConsumerLedger, Receipt
from broker_runtime.ledger.producer import Confirmation, ProducerLedger, StubRecord
from broker_runtime.ledger.schema import Outcome
from broker_runtime.offsets.consumer_filters import ConsumerFilterManager
from broker_runtime.offsets.consumer_offsets import ConsumerOffsets
from broker_runtime.store.message_store import MessageStore
from expectations.gates import run_all_gates
from pipeline.delta_io import DeltaIO, history
from pipeline.jobs import audit as audit_job
from pipeline.jobs.audit import run_audit
from pipeline.jobs.ingest import run_ingest
from pipeline.lake import AUDIT_TABLES, table_path
from pipeline.schemas import INGEST_CHECKPOINT
from tests.conftest import local_spark

pytestmark = [pytest.mark.slow, pytest.mark.integration]

T0 = 1_700_000_000_000
SNAPSHOT_1 = T0 + 3_600_000
SNAPSHOT_2 = SNAPSHOT_1 + 120_000
TOPIC = "TopicA"
TOPIC_B = "TopicB"
SQL = "color = 'red'"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    # The pipeline unit tests' session when they run in this process (getOrCreate).
    return local_spark()


def _write_store(store_dir: Path, clock: FakeClock) -> dict[str, Any]:
    """Messages U0..U5 in TopicA (U1 twice), U2's retries and dead letter; their positions."""
    config = StoreConfig(store_dir=store_dir, segment_size=1 << 20, cq_entries_per_file=1000)
    placed: dict[str, Any] = {}
    with MessageStore(config, clock=clock) as store:

        def put(msg: Message) -> Any:
            clock.advance(1000)
            if not msg.born_timestamp:  # the producer stamps its send (copies keep theirs)
                msg = replace(msg, born_timestamp=clock.now_ms() - 5)
            (result,) = store.put_messages([msg])
            return result

        for i in range(6):
            key = f"U{i}"
            placed[key] = put(Message(TOPIC, f"body {i}".encode(), {UNIQ_KEY: key}, queue_id=i % 2))
        # The producer never saw U1's acknowledgement and sent it again.
        placed["U1-again"] = put(Message(TOPIC, b"body 1", {UNIQ_KEY: "U1"}, queue_id=0))
        # U2 fails for g1 every time: two retries through the schedule topic, then the DLQ.
        levels = DelayLevels.parse()
        failed = store.message_at(placed["U2"].phys_offset)
        for reconsume in range(3):
            assert failed is not None
            decision = decide_send_back("g1", reconsume, max_reconsume_times=2)
            copy = send_back_message(failed, decision)
            if decision.target == "DLQ":
                placed["U2-dlq"] = put(copy)
                break
            waiting = store.message_at(put(to_schedule(copy, levels)).phys_offset)
            assert waiting is not None
            placed[f"U2-retry{reconsume + 1}"] = put(from_schedule(waiting))
            failed = store.message_at(placed[f"U2-retry{reconsume + 1}"].phys_offset)
        store.wait_dispatched()
        offsets = ConsumerOffsets(store_dir)
        for queue_id in (0, 1):
            offsets.commit(TOPIC, "g1", queue_id, store.max_offset(TOPIC, queue_id))
        offsets.commit(TOPIC, "g2", 0, 0)  # g2 consumed nothing from queue 0
        offsets.persist()
        placed["max0"] = store.max_offset(TOPIC, 0)
    return placed


def _write_ledgers(data_dir: Path, clock: FakeClock, placed: dict[str, Any]) -> None:
    producer = ProducerLedger.open(data_dir, clock=clock)
    keys = [f"U{i}" for i in range(6)] + ["L1"]
    producer.record_before_send([StubRecord(k, TOPIC, "0" * 64) for k in keys])
    confirmations = [
        Confirmation(k, "broker-a", placed[k].queue_id, placed[k].queue_offset) for k in keys[:6]
    ]
    # L1: the broker acknowledged it at an offset that its queue never held.
    confirmations.append(Confirmation("L1", "broker-a", 0, 99))
    producer.confirm(confirmations)
    producer.close()
    consumer = ConsumerLedger.open(data_dir, clock=clock)

    def receive(key: str, position: str, reconsume: int = 0, topic: str = TOPIC) -> int:
        p = placed[position]
        receipt = Receipt(key, topic, "g1", "c1", "broker-a", p.queue_id, p.queue_offset, reconsume)
        (row_id,) = consumer.record_received([receipt])
        return row_id

    done = [receive(k, k) for k in ("U0", "U1", "U3", "U4", "U5")]
    done.append(receive("U1", "U1-again"))  # the resent copy reached g1 as well
    consumer.record_outcome([(i, Outcome.CONSUMED) for i in done])
    failed = [receive("U2", "U2")]
    failed += [receive("U2", f"U2-retry{r}", r, "%RETRY%g1") for r in (1, 2)]
    consumer.record_outcome([(i, Outcome.RECONSUME_LATER) for i in failed])
    consumer.close()


def _write_filtered(store_dir: Path, data_dir: Path, clock: FakeClock) -> None:
    """F0..F3 in TopicB, red and blue; g3's SQL92 expression registered before them; g3's
    offset past them all; g3 received F0 (red) and F1 (blue: excluded), not F2 (red)."""
    config = StoreConfig(store_dir=store_dir, segment_size=1 << 20, cq_entries_per_file=1000)
    filters = ConsumerFilterManager(store_dir, clock.now_ms())
    filters.register_group("g3", [(TOPIC_B, SQL, "SQL92", clock.now_ms())], clock.now_ms())
    filters.persist(clock.now_ms())
    placed = []
    with MessageStore(config, clock=clock) as store:
        for i, color in enumerate(("red", "blue", "red", "blue")):
            clock.advance(1000)
            props = {UNIQ_KEY: f"F{i}", "color": color}
            msg = Message(TOPIC_B, b"f", props, queue_id=0, born_timestamp=clock.now_ms() - 5)
            placed += store.put_messages([msg])
        store.wait_dispatched()
        offsets = ConsumerOffsets(store_dir)
        offsets.commit(TOPIC_B, "g3", 0, store.max_offset(TOPIC_B, 0))
        offsets.persist()
    consumer = ConsumerLedger.open(data_dir, clock=clock)
    got = [Receipt(f"F{i}", TOPIC_B, "g3", "c3", "broker-a", 0, placed[i].queue_offset, 0)
           for i in (0, 1)]  # fmt: skip
    consumer.record_outcome([(i, Outcome.CONSUMED) for i in consumer.record_received(got)])
    consumer.close()


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("cluster")
    master = data_dir / "brokers" / "broker-a" / "master"
    clock = FakeClock(T0)
    placed = _write_store(master, clock)
    _write_filtered(master, data_dir, clock)
    shutil.copytree(master, master.with_name("slave"))  # what replication gives the slave
    _write_ledgers(data_dir, clock, placed)
    lake = tmp_path_factory.mktemp("lake")
    offsets_files = [
        p / "config" / "consumerOffset.json" for p in (master, master.with_name("slave"))
    ]
    for snapshot in (SNAPSHOT_1, SNAPSHOT_2):  # the same offsets, two minutes apart
        for f in offsets_files:
            os.utime(f, ns=(snapshot * 1_000_000, snapshot * 1_000_000))
        run_ingest(data_dir, lake, spark, progress=False)
    return lake


def _rows(spark: SparkSession, lake: Path, table: str, where: str) -> list[dict[str, Any]]:
    df = DeltaIO(spark).read(table_path(lake, table), AUDIT_TABLES[table])
    return [r.asDict() for r in df.filter(where).collect()]


def _versions(lake: Path) -> dict[str, int]:
    return {name: len(history(table_path(lake, name))) for name in AUDIT_TABLES}


@pytest.fixture(scope="module")
def first_run(spark: SparkSession, lake: Path) -> dict[str, Any]:
    return run_audit(lake, spark, progress=False)


def test_audit_finds_the_injected_faults(
    spark: SparkSession, lake: Path, first_run: dict[str, Any], tmp_path: Path
) -> None:
    summary = first_run
    ingested = DeltaIO(spark).read(table_path(lake, "ingest_checkpoint"), INGEST_CHECKPOINT)
    assert summary["as_of_ms"] == ingested.agg({"created_at": "max"}).first()[0]  # type: ignore[index]
    tables = summary["tables"]
    assert all(t["written"] for t in tables.values())
    assert tables["audit_duplicates"]["kinds"] == {
        "stored_twice": {"producer_resend": 1},
        "delivered_twice": {"producer_resend": 1},
        "duplicate_effect": {"producer_resend": 1},
    }
    (stored,) = _rows(spark, lake, "audit_duplicates", "kind = 'stored_twice'")
    assert (stored["msg_id"], stored["count"]) == ("U1", 2)  # master + slave: still 2 copies

    assert tables["audit_losses"]["kinds"] == {"lost_after_ack": {"absent_from_commitlog": 1}}
    (lost,) = _rows(spark, lake, "audit_losses", "true")
    assert (lost["msg_id"], lost["queue_id"], lost["queue_offset"]) == ("L1", 0, 99)

    (dead,) = _rows(spark, lake, "audit_dead_letters", "true")
    assert (dead["msg_id"], dead["group"], dead["original_topic"]) == ("U2", "g1", TOPIC)
    assert (dead["count"], dead["retries"], dead["deliveries"]) == (3, 2, 3)
    assert [s["reconsume_times"] for s in dead["retry_chain"]] == [1, 2]
    assert dead["last_outcome"] == "RECONSUME_LATER" and dead["replayed"] is False

    lag = _rows(spark, lake, "audit_lag", "group = 'g2'")
    assert [
        (r["snapshot_ts"], r["lag_messages"], r["status"])
        for r in sorted(lag, key=lambda r: r["snapshot_ts"])
    ] == [(SNAPSHOT_1, 4, "WARN"), (SNAPSHOT_2, 4, "STALLED")]
    assert lag[0]["msg_id"] == "U0"  # the oldest message g2 has not consumed
    assert tables["audit_lag"]["latest_status"] == {"OK": 3, "STALLED": 1}
    assert tables["consistency"]["rows"] == 0

    # g3's SQL92 expression, judged by the broker's evaluator over the stored properties; the
    # losses audit (nothing but L1 above) leaves g3's filtered TopicB to it.
    filtered = _rows(spark, lake, "audit_filters", "true")
    assert sorted((r["msg_id"], r["group"], r["cause"], r["expression"]) for r in filtered) == [
        ("F1", "g3", "delivered_but_excluded", SQL),
        ("F2", "g3", "matched_but_skipped", SQL),
    ]

    # The reports, through the command line as the DAGs' shell tasks would run them.
    assert main(["pipeline", "report", "--lake", str(lake), "--out", str(tmp_path / "r")]) == 0
    html = (tmp_path / "r" / "audit_report.html").read_text()
    for png in ("lag_over_time", "duplicates_by_cause", "dead_letters_by_group_age"):
        assert (tmp_path / "r" / f"{png}.png").is_file() and f'src="{png}.png"' in html
    assert main(["pipeline", "dlq-report", "--lake", str(lake), "--out", str(tmp_path / "d")]) == 0
    lines = (tmp_path / "d" / "dead_letters.csv").read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("g1,U2,TopicA,")


def test_audit_tables_pass_their_gates_bar_the_injected_faults(
    spark: SparkSession, lake: Path, first_run: dict[str, Any]
) -> None:
    """The expectation suites hold the audit tables; only the thresholds the injected faults
    break fail, and with those raised every gate passes."""
    io = DeltaIO(spark)
    tables = {n: io.read(table_path(lake, n), schema) for n, schema in AUDIT_TABLES.items()}
    strict = run_all_gates(tables, raise_on_failure=False, progress=None)
    failed = {
        (table, f["parameters"].get("max_value") or f["parameters"].get("value_set"))
        for table, result in strict["tables"].items()
        for f in result["failures"]
    }
    assert failed == {
        ("audit_duplicates", "max_duplicate_effects"),  # U1 consumed twice
        ("audit_losses", "max_losses"),  # L1
        ("audit_lag", "max_lag_ms"),  # g2 waits since U0 was stored
        ("audit_lag", "failing_lag_statuses"),  # g2 STALLED
        ("audit_dead_letters", "max_dead_letter_age_ms"),  # U2, stored in 2023
        ("audit_filters", "max_filtered_wrongly"),  # F1 and F2
    }
    relaxed = {
        "audit_duplicates": {"max_duplicate_effects": 1},
        "audit_losses": {"max_losses": 1},
        "audit_lag": {"max_lag_ms": 10**13, "failing_lag_statuses": []},
        "audit_dead_letters": {"max_dead_letter_age_ms": 10**13},
        "audit_filters": {"max_filtered_wrongly": 2},
    }
    assert run_all_gates(tables, params=relaxed, raise_on_failure=False, progress=None)["success"]


def test_a_rerun_at_the_same_as_of_commits_nothing(
    spark: SparkSession, lake: Path, first_run: dict[str, Any]
) -> None:
    before = _versions(lake)
    again = run_audit(lake, spark, as_of_ms=first_run["as_of_ms"], progress=False)
    assert not any(t["written"] for t in again["tables"].values())
    assert again["tables"] == {n: t | {"written": False} for n, t in first_run["tables"].items()}
    assert _versions(lake) == before


def test_a_table_that_fails_fails_the_audit_and_the_tables_after_it_stay_unwritten(
    spark: SparkSession, lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables are computed on a pool: a table's failure is the audit's, and the tables
    not started yet are not written (one at a time here: none is)."""
    copy = tmp_path / "lake"
    shutil.copytree(lake, copy, ignore=shutil.ignore_patterns(*AUDIT_TABLES))
    real = audit_job.audit_tables

    def first_fails(*args: Any) -> dict[str, Any]:
        builds = real(*args)
        first = next(iter(builds))

        def fail() -> Any:
            raise RuntimeError(f"{first} failed")

        return builds | {first: fail}

    monkeypatch.setattr(audit_job, "audit_tables", first_fails)
    monkeypatch.setattr(audit_job, "TABLES_AT_ONCE", 1)
    with pytest.raises(RuntimeError, match="audit_duplicates failed"):
        run_audit(copy, spark, progress=False)
    assert [n for n in AUDIT_TABLES if (copy / n).exists()] == []
