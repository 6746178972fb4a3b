"""Lake maintenance on both backends: OPTIMIZE compacts (Z-ordered where set), VACUUM deletes
only what no version within the retention needs, the rows stay, and it never runs while the
lake's writer lock (ingest's) is held."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipeline.delta_io import DeltaIO, history
from pipeline.jobs.maintenance import LakeBusy, data_files_on_disk, lake_lock, maintain_lake
from pipeline.schemas import struct_of
from pipeline.spark_session import BACKEND_ENV

SCHEMA = struct_of("msg_id:str, part:str, v:long")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "embedded"])
def test_optimize_and_vacuum_keep_the_rows_and_report_what_they_did(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setenv(BACKEND_ENV, backend)
    lake, io = tmp_path / "lake", DeltaIO(spark)
    path = str(lake / "message_log")  # Z-ordered by msg_id
    want = []
    for i in range(3):  # three appends: three small files per partition
        rows = [(f"m{i}{k}", "a" if k % 2 else "b", i * 10 + k) for k in range(4)]
        io.append(spark.createDataFrame(rows, SCHEMA), path, SCHEMA, ["part"])
        want += rows
    io.ensure_table(str(lake / "message_stub"), SCHEMA)  # an empty table: nothing to do
    (lake / "not_a_table").mkdir()  # not in the catalog: left alone
    files = len(DeltaTable(path).file_uris())
    assert files >= 6
    report = maintain_lake(lake, spark, retention_hours=0)
    assert report["backend"] == backend and set(report["tables"]) == {"message_log", "message_stub"}
    done = report["tables"]["message_log"]
    assert done["zorder"] == ["msg_id"] and done["files_before"] == files
    assert done["files_after"] == 2 == done["optimize_added"]  # one per partition
    assert done["optimize_removed"] == files
    assert done["vacuum_deleted"] == files  # retention 0: the replaced files go
    assert data_files_on_disk(path) == 2
    assert report["tables"]["message_stub"]["files_after"] == 0
    got = sorted(tuple(r) for r in io.read(path, SCHEMA).collect())
    assert got == sorted(want)
    assert history(path)[0]["operation"] in ("OPTIMIZE", "VACUUM END")


def test_maintenance_waits_for_the_writer_lock_and_gives_up_clearly(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    spark = object()  # never reached: the lock is taken first
    with lake_lock(lake), pytest.raises(LakeBusy, match="is being written"):
        maintain_lake(lake, spark, 0, wait_s=0.3)  # type: ignore[arg-type]
    got: list[str] = []

    def second() -> None:
        with lake_lock(lake, wait_s=30):
            got.append("second")

    t = threading.Thread(target=second)
    with lake_lock(lake):
        t.start()
        t.join(0.3)
        assert t.is_alive() and got == []  # still held: the second one waits
    t.join(30)
    assert got == ["second"]
