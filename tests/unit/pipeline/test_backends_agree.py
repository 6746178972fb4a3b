"""The embedded delta-rs backend, forced, against the native default on the same input:
ingest, audit and the replay log give the same rows (read by Spark and in memory), and
re-runs commit nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import audit_schemas as A
from pipeline.delta_files import SMALL_READ_BYTES, SMALL_READ_ENV
from pipeline.delta_io import DeltaIO, history
from pipeline.jobs.audit import run_audit
from pipeline.lake import AUDIT_TABLES, INGESTED_TABLES, table_path
from pipeline.remediation.outcome_log import OutcomeLog
from pipeline.spark_session import BACKEND_ENV
from tests.unit.pipeline.test_ingest import ingest, make_cluster

# Two ingests and audits.
pytestmark = [pytest.mark.slow, pytest.mark.native_delta, pytest.mark.timeout(1200)]
BACKENDS = ("native", "embedded")
AS_OF = 4_102_444_800_000  # 2100-01-01: after every ingest of the tests
VOLATILE = {"created_at", "ingested_at", "written_at"}  # wall-clock columns of a run


def _rows(spark: SparkSession, path: str, schema: Any) -> list[tuple[Any, ...]]:
    names = [f.name for f in schema.fields if f.name not in VOLATILE]
    df = DeltaIO(spark, "native").read(path, schema).select(*names)
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.fixture(scope="module")
def lakes(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backends")
    data = make_cluster(root)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        # The native lake's jobs read every table with Spark (delta-spark's reader), the
        # embedded one's read these small tables in memory: both reads give the same rows.
        for backend in BACKENDS:
            mp.setenv(BACKEND_ENV, backend)
            mp.setenv(SMALL_READ_ENV, "0" if backend == "native" else str(SMALL_READ_BYTES))
            lake = root / f"lake-{backend}"
            assert ingest(spark, data, lake)["backend"] == backend
            out[backend] = lake
        for backend in BACKENDS:  # one audit time for both (by default, each lake's ingest's)
            mp.setenv(BACKEND_ENV, backend)
            mp.setenv(SMALL_READ_ENV, "0" if backend == "native" else str(SMALL_READ_BYTES))
            audited = run_audit(out[backend], spark, AS_OF, progress=False)
            assert audited["backend"] == backend
    return out


def test_ingest_gives_the_same_tables(spark: SparkSession, lakes: dict[str, Path]) -> None:
    for name, schema in INGESTED_TABLES.items():
        native, embedded = (_rows(spark, table_path(lakes[b], name), schema) for b in BACKENDS)
        assert native == embedded, name
        # Empty on both for this store: no damage, no RabbitMQ, no transactions, no SQL92.
        empty = ("quarantine", "rabbit_topology", "transactions", "consumer_filters")
        assert native or name in empty, name


def test_audit_gives_the_same_findings(spark: SparkSession, lakes: dict[str, Path]) -> None:
    for name, schema in AUDIT_TABLES.items():
        native, embedded = (_rows(spark, table_path(lakes[b], name), schema) for b in BACKENDS)
        assert native == embedded, name


def test_forced_embedded_reruns_commit_nothing(
    spark: SparkSession, lakes: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BACKEND_ENV, "embedded")
    lake = lakes["embedded"]
    data = lake.parent / "data"
    before = {t: len(history(table_path(lake, t))) for t in [*INGESTED_TABLES, *AUDIT_TABLES]}
    assert ingest(spark, data, lake)["backend"] == "embedded"
    run_audit(lake, spark, AS_OF, progress=False)
    after = {t: len(history(table_path(lake, t))) for t in before}
    assert after == before


def test_forced_embedded_replay_log_appends_once_per_flush(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BACKEND_ENV, "embedded")
    io = DeltaIO(spark)
    assert io.backend == "embedded"
    path = str(tmp_path / "dlq_replay_log")
    names = [f.name for f in A.DLQ_REPLAY_LOG.fields]
    rows = [dict.fromkeys(names) | {"replay_id": "r1", "msg_id": f"m{i}"} for i in range(5)]
    with OutcomeLog(spark, io, path, A.DLQ_REPLAY_LOG, every_rows=3) as log:
        for row in rows:
            log.add(row)
    assert log.written == 5
    assert len(history(path)) == 2  # 3 rows, then 2 at the end
    got = DeltaIO(spark, "native").read(path, A.DLQ_REPLAY_LOG).collect()
    assert sorted(r["msg_id"] for r in got) == [f"m{i}" for i in range(5)]
