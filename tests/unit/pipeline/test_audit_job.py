"""run_audit over a small Delta lake of hand-built ingested tables: the tables it writes, the
as-of default, idempotent re-runs; and the audit tables against the expectation suites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from expectations.suites import audits as suites
from expectations.suites.common import referenced_columns
from pipeline import schemas as S
from pipeline.audit_schemas import AUDIT_TABLES, KINDS
from pipeline.delta_io import DeltaIO, history
from pipeline.jobs.audit import AuditThresholds, run_audit
from pipeline.jobs.ingest import table_path
from tests.unit.pipeline.audit_helpers import T0, delivery, frame, msg, snapshot, stub

pytestmark = pytest.mark.slow

INGESTED_AT = T0 + 500_000
AS_OF = T0 + 600_000
DLQ = {"topic": "%DLQ%g1", "is_dlq": True, "consumer_group": "g1", "reconsume_times": 17}


def _ingested() -> dict[str, list[dict[str, Any]]]:
    snapshot_rows = [snapshot(0, 1, 3), snapshot(60_000, 1, 3)]  # g1 stalled at offset 1
    for row in snapshot_rows:
        row.pop("min_offset")
    checkpoint = {
        "run": 1,
        "broker": "broker-a",
        "broker_id": 0,
        "store_dir": "/x",
        "source": "commitlog",
        "start_offset": 0,
        "plan_end": 800,
        "next_offset": 800,
        "rows": 4,
        "quarantined": 0,
    }
    return {
        "messages": [
            msg(0, "K1", 0),
            msg(200, "K1", 1),  # stored twice
            msg(400, "K2", 2),
            msg(600, "D1", 0, **DLQ),
        ],
        "message_log": [delivery(1, "K1"), delivery(2, "K1"), delivery(3, "K2", queue_offset=2)],
        "message_stub": [
            stub("K1"),
            stub("L1", queue_offset=9),  # acknowledged, not stored
            stub("U1", status="UNCONFIRMED", queue_offset=None, next_resend_at=T0),
            stub("U2", status="UNCONFIRMED", queue_offset=None, send_count=16),
        ],
        "consumer_offsets": snapshot_rows,
        "ingest_checkpoint": [
            checkpoint | {"status": "planned", "created_at": INGESTED_AT - 100},
            checkpoint | {"status": "done", "created_at": INGESTED_AT},
        ],
    }


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    io = DeltaIO(spark)
    for name, rows in _ingested().items():
        schema = S.TABLES[name]
        io.append(frame(spark, schema, rows), table_path(root, name), schema)
    return root


@pytest.fixture(scope="module")
def first_run(spark: SparkSession, lake: Path) -> dict[str, Any]:
    return run_audit(lake, spark, progress=False)


def _versions(lake: Path) -> dict[str, int]:
    return {name: len(history(table_path(lake, name))) for name in AUDIT_TABLES}


def test_audit_writes_every_table(first_run: dict[str, Any], lake: Path) -> None:
    # The default as-of is the lake's last ingest: the checkpoint's newest row.
    assert first_run["as_of_ms"] == INGESTED_AT
    tables = first_run["tables"]
    assert set(tables) == set(AUDIT_TABLES)
    assert all(t["written"] for t in tables.values())
    kinds = {name: t["kinds"] for name, t in tables.items()}
    assert kinds == {
        "audit_duplicates": {
            "stored_twice": {"producer_resend": 1},
            "delivered_twice": {"offset_not_committed": 1},
            "duplicate_effect": {"offset_not_committed": 1},
        },
        "audit_losses": {"lost_after_ack": {"absent_from_commitlog": 1}},
        "audit_lag": {"lag": {"within_thresholds": 1, "no_progress": 1}},
        "audit_dead_letters": {"dead_lettered": {"max_reconsume_times": 1}},
        "resend_candidates": {"resend_due": {"never_acknowledged": 1}},
        "manual_handling": {"max_send_count": {"send_count_at_max": 1}},
        "consistency": {},
    }
    assert tables["audit_lag"]["latest_status"] == {"STALLED": 1}


def test_rerun_at_the_same_as_of_commits_nothing(
    spark: SparkSession, lake: Path, first_run: dict[str, Any]
) -> None:
    before = _versions(lake)
    again = run_audit(lake, spark, as_of_ms=first_run["as_of_ms"], progress=False)
    assert not any(t["written"] for t in again["tables"].values())
    assert {n: t["rows"] for n, t in again["tables"].items()} == {
        n: t["rows"] for n, t in first_run["tables"].items()
    }
    assert _versions(lake) == before


def test_a_new_as_of_replaces_every_table(
    spark: SparkSession, lake: Path, first_run: dict[str, Any]
) -> None:
    before = _versions(lake)
    later = run_audit(lake, spark, as_of_ms=AS_OF, thresholds=AuditThresholds(), progress=False)
    # Every row carries the as-of, so every table with rows changes; an empty one does not.
    written = {n for n, t in later["tables"].items() if t["written"]}
    assert written == set(AUDIT_TABLES) - {"consistency"}
    assert _versions(lake) == {n: v + (n in written) for n, v in before.items()}
    io = DeltaIO(spark)
    dead = io.read(table_path(lake, "audit_dead_letters"), AUDIT_TABLES["audit_dead_letters"])
    (row,) = dead.select("as_of_ms", "age_ms").collect()
    assert (row["as_of_ms"], row["age_ms"]) == (AS_OF, AS_OF - (T0 + 600))


def test_a_missing_lake_is_a_clear_error(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        run_audit(tmp_path / "nowhere", spark)


def test_audit_tables_meet_their_suites() -> None:
    """Every column a suite reads exists, and every kind an audit writes is one it accepts."""
    assert {spec.table for spec in suites.SPECS} == set(AUDIT_TABLES)
    for spec in suites.SPECS:
        ours = set(AUDIT_TABLES[spec.table].fieldNames())
        derived = {"is_latest"} if spec.prepare is not None else set()
        needed = (referenced_columns(spec.build()) | set(spec.row_id)) - derived
        assert needed <= ours, f"{spec.table} lacks {sorted(needed - ours)}"
        (accepted,) = [v for k, v in spec.defaults.items() if k.endswith("_kinds")]
        assert set(KINDS[spec.table]) <= set(accepted), spec.table
