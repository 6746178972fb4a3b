"""`DeltaIO.read`'s in-memory way for a small current version (pyarrow on the driver, handed
to Spark) against Spark's own read, and the whole-table overwrite, on both backends."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipeline.delta_files import (
    SMALL_READ_BYTES,
    SMALL_READ_ENV,
    commit,
    plain_and_small,
    spark_file_row,
    stage_dir,
)
from pipeline.delta_io import DeltaIO, history
from pipeline.schemas import arrow_schema, struct_of
from tests.unit.pipeline.test_delta_io import ODD


@pytest.mark.slow
def test_a_small_current_version_is_read_in_memory_with_the_same_rows_as_sparks_read(
    io: DeltaIO, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    typed = struct_of("k:long, day:date, v:str, m:map")
    path = str(tmp_path / "t")
    days = [date(2025, 1, 1), date(2025, 1, 2), None]
    rows = [
        (k, days[k % 3], [ODD, None][k % 2], {"x": str(k)} if k % 4 else None) for k in range(9)
    ]
    io.append(spark.createDataFrame(rows, typed), path, typed, ["day"])
    io.append(spark.createDataFrame(rows[:2], typed), path, typed, ["day"])  # two commits

    def read(bound: int) -> tuple[list[tuple[Any, ...]], bool]:
        monkeypatch.setenv(SMALL_READ_ENV, str(bound))
        df = io.read(path, typed)
        assert df.schema == typed
        return sorted((tuple(r) for r in df.collect()), key=repr), not df.inputFiles()

    in_memory, by_spark = read(SMALL_READ_BYTES), read(0)
    assert in_memory[1] and not by_spark[1]  # no files for Spark to scan: rows in memory
    assert in_memory[0] == by_spark[0] == sorted(rows + rows[:2], key=repr)
    size = sum(DeltaTable(path).get_add_actions(flatten=True).column("size_bytes").to_pylist())
    assert read(size)[1] and not read(size - 1)[1]  # the bound is on the files' bytes
    assert plain_and_small(path, size, max_rows=11) and not plain_and_small(path, size, 10)
    monkeypatch.setattr("pipeline.delta_io.plain_and_small", lambda p, b: plain_and_small(p, b, 10))
    assert not read(SMALL_READ_BYTES)[1]  # and on the rows: eleven are more than ten
    monkeypatch.setenv(SMALL_READ_ENV, "16M")
    with pytest.raises(ValueError, match=SMALL_READ_ENV):
        io.read(path, typed)


@pytest.mark.slow
def test_a_table_with_deletion_vectors_is_read_by_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "dv")
    df = spark.range(10).selectExpr("id AS k", "CAST(id AS STRING) AS v")
    df.write.format("delta").option("delta.enableDeletionVectors", "true").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k < 3")
    assert DeltaTable(path).protocol().min_reader_version == 3  # a file's rows are not all live
    assert not plain_and_small(path, SMALL_READ_BYTES)
    got = DeltaIO(spark, "native").read(path, struct_of("k:long, v:str")).collect()
    assert sorted(r["k"] for r in got) == list(range(3, 10))


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), [("native", "embedded"), ("embedded", "native")])
def test_an_overwrite_replaces_every_row_of_either_backends_table(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str
) -> None:
    a, b = DeltaIO(spark, first), DeltaIO(spark, second)
    flat = struct_of("k:long, v:str")
    path = str(tmp_path / "t")
    a.append(spark.createDataFrame([(1, "a")], flat), path, flat)
    a.append(spark.createDataFrame([(2, "b")], flat), path, flat)  # files of two commits
    assert b.overwrite(spark.createDataFrame([(3, "c")], flat), path, flat) == 1
    assert a.overwrite(spark.createDataFrame([], flat), path, flat) == 0
    assert b.overwrite(spark.createDataFrame([(4, "d")], flat), path, flat) == 1
    for bound in ("0", str(SMALL_READ_BYTES)):  # Spark's reader, and in memory
        monkeypatch.setenv(SMALL_READ_ENV, bound)
        for io in (a, b):
            assert [tuple(r) for r in io.read(path, flat).collect()] == [(4, "d")]
            assert sorted(tuple(r) for r in io.read(path, flat, version=1).collect()) == [
                (1, "a"),
                (2, "b"),
            ]
            assert [tuple(r) for r in io.read(path, flat, version=2).collect()] == [(3, "c")]
            assert io.read(path, flat, version=3).collect() == []
    ops = [(h["operation"], h["operationParameters"].get("mode")) for h in reversed(history(path))]
    assert ops[2:] == [("WRITE", "Overwrite")] * 3, ops


@pytest.mark.slow
def test_files_of_no_rows_between_others_lose_no_row_of_the_in_memory_read(
    io: DeltaIO, spark: SparkSession, tmp_path: Path
) -> None:
    # A log table's appends can leave 0-row files; Spark's reading of Arrow batches stopped
    # at an empty one after rows (the repair log lost a run's rows that way).
    flat = struct_of("k:long, v:str")
    path = str(tmp_path / "t")
    batches = [[1], [], [2, 3], [], [4]]
    for keys in batches:  # one file and one commit each
        stage = Path(stage_dir(path))
        stage.mkdir(parents=True)
        rows = [{"k": k, "v": f"v{k}"} for k in keys]
        pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(flat)), stage / "f.parquet")
        commit(path, flat, (), [spark_file_row(path, str(stage / "f.parquet"), ())], "append", None)
    files = DeltaTable(path).get_add_actions(flatten=True).column("num_records").to_pylist()
    assert sorted(files) == [0, 0, 1, 1, 2]
    df = io.read(path, flat)
    assert not df.inputFiles()  # in memory
    assert sorted(r["k"] for r in df.collect()) == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("bound", ["0", str(SMALL_READ_BYTES)])  # Spark's reader, in memory
def test_a_dataframe_read_keeps_its_version_while_the_table_moves_on(
    io: DeltaIO, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    # The audit scans its large inputs once per use: every use must see the same rows even
    # if an ingest commits in between (delta-spark's own DataFrame would see the new ones).
    monkeypatch.setenv(SMALL_READ_ENV, bound)
    flat = struct_of("k:long, v:str")
    path = str(tmp_path / "t")
    io.append(spark.createDataFrame([(1, "a")], flat), path, flat)
    df = io.read(path, flat)
    assert [tuple(r) for r in df.collect()] == [(1, "a")]
    io.append(spark.createDataFrame([(2, "b")], flat), path, flat)
    assert [tuple(r) for r in df.collect()] == [(1, "a")]
    assert df.count() == 1
    assert sorted(tuple(r) for r in io.read(path, flat).collect()) == [(1, "a"), (2, "b")]
