"""The audit job's writes (a changed table replaced in one commit, an unchanged one not
written), its input checks, and the audit tables against the expectation suites. Whole runs
over real ingested data, and their idempotence, are in tests/integration/test_audit_pipeline.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from broker_runtime.common.findings import KINDS
from expectations.suites import audits as suites
from expectations.suites.common import referenced_columns
from pipeline.delta_io import DeltaIO, history
from pipeline.jobs.audit import run_audit, write_if_changed
from pipeline.lake import AUDIT_TABLES
from tests.unit.pipeline.audit_helpers import frame

pytestmark = pytest.mark.slow


def test_a_changed_table_is_replaced_in_one_commit(spark: SparkSession, tmp_path: Path) -> None:
    """What a run at a new as-of does to each table with rows: one overwrite commit."""
    schema = AUDIT_TABLES["resend_candidates"]
    path = str(tmp_path / "resend_candidates")
    io = DeltaIO(spark)

    def rows(as_of: int) -> DataFrame:
        found = {"msg_id": "U1", "kind": "resend_due", "cause": "c", "count": 1}
        return frame(spark, schema, [found | {"as_of_ms": as_of}])

    assert write_if_changed(io, rows(1), path, "resend_candidates")[1]
    profile, written = write_if_changed(io, rows(2), path, "resend_candidates")
    assert written and profile.kinds == {"resend_due": {"c": 1}}
    assert [r["as_of_ms"] for r in io.read(path, schema).collect()] == [2]
    stages = sorted(p.name for p in Path(path).glob("w-*"))
    again, written = write_if_changed(io, rows(2), path, "resend_candidates")
    assert not written and again == profile  # the observed fingerprint is the table's
    assert len(history(path)) == 2  # created, replaced; the unchanged write committed nothing
    assert sorted(p.name for p in Path(path).glob("w-*")) == stages  # and left no files


def test_a_table_whose_findings_are_gone_is_replaced_by_an_empty_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A candidate resent since: the next run's table has no rows, and reads as such."""
    schema = AUDIT_TABLES["resend_candidates"]
    path = str(tmp_path / "resend_candidates")
    io = DeltaIO(spark)
    found = {"msg_id": "U1", "kind": "resend_due", "cause": "c", "count": 1, "as_of_ms": 1}
    assert write_if_changed(io, frame(spark, schema, [found]), path, "resend_candidates")[1]
    profile, written = write_if_changed(io, frame(spark, schema, []), path, "resend_candidates")
    assert written and profile.rows == 0
    assert io.read(path, schema).collect() == []  # every file the table names is there


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
