"""All Delta Lake I/O of the pipeline, with two backends behind one small API.

- `native` (the default wherever Delta Lake's jars load; see pipeline.spark_session):
  delta-spark commits everything. DataFrames: `format("delta")` writes, `DeltaTable.merge`
  upserts, appends carry `txnAppId`/`txnVersion`. Rows made in the Python workers
  (`append_generated`) or on the driver (`append_rows`): pyarrow writes the data files
  there, and delta-spark's transaction commits them with the append's `txn`
  (pipeline.delta_native); a whole table's `overwrite` too, its files written by Spark's
  parquet writer as below (delta-spark's overwrite lists the files it removes with a job).
- `embedded` (where the jars cannot be fetched, or forced): delta-rs (`deltalake`) owns the
  transaction log and Spark does the compute. Large writes: Spark executors write plain
  parquet files into a fresh directory under the table root (`w-<uuid>/<partition dirs>`) -
  Spark's writer for a DataFrame, or, for rows made in the Python workers
  (`append_generated`), the workers themselves with pyarrow in a plain RDD job, so those
  rows never cross into the JVM - then the driver commits them all in ONE delta-rs commit of
  `add` actions (see pipeline.delta_files). A failed job leaves only unreferenced files
  (vacuum removes them). Reads give Spark the table's current file list.

Same tables, schemas and semantics in both, and each reads, appends to and merges into the
other's tables. Driver-side look-ups (the table's existence, `txn` versions, history, small
tables as Arrow, and `read`'s small current versions, which Spark gets in memory) use
delta-rs' log reader and pyarrow for either backend: no Spark job, and never delta-rs' own
pyarrow readers, which can abort the process at exit (delta-io/delta-rs#2184). Appends carry
a Delta `txn` (app id, version): an append whose version the table already has is skipped.
Set MQAUDIT_DELTA_BACKEND=embedded|native to force a backend.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipeline.delta_files import (
    PartitionedWriter,
    Staged,
    commit,
    current_files,
    parquet_files,
    plain_and_small,
    read_arrow,
    rows_of,
    small_read_bytes,
    spark_file_row,
    stage_dir,
)
from pipeline.delta_files import table_exists as table_exists  # importers' one name
from pipeline.delta_files import txn_version as txn_version
from pipeline.delta_native import commit_files
from pipeline.schemas import arrow_schema
from pipeline.spark_session import forced_backend, native_delta_available
from pipeline.spark_tasks import Producer, run_tasks

_WRITE_OPTIONS = {"parquet.enable.dictionary#body": "false"}  # 1 KiB bodies never repeat


def choose_backend(spark: SparkSession) -> str:
    """The forced backend, else native where the session has Delta Lake, else embedded."""
    return forced_backend() or ("native" if native_delta_available(spark) else "embedded")


def history(path: str) -> list[dict[str, Any]]:
    return list(DeltaTable(path).history()) if table_exists(path) else []


class DeltaIO:
    """Delta reads and writes for one Spark session (backend chosen once)."""

    def __init__(self, spark: SparkSession, backend: str | None = None) -> None:
        self.spark = spark
        self.backend = backend or choose_backend(spark)

    def read(
        self,
        path: str,
        schema: StructType,
        version: int | None = None,
        timestamp: datetime | None = None,
    ) -> DataFrame:
        """The table as a DataFrame with exactly `schema`'s columns (empty if no table): its
        current version, or as of a `version`, or as of a (UTC) `timestamp`. A small current
        version (`small_read_bytes`) is read on the driver and handed to Spark in memory.
        Every action on the DataFrame sees the version it was read at, with either backend
        (delta-spark's own DataFrame would look for a newer one each time)."""
        names = [f.name for f in schema.fields]
        if not table_exists(path):
            return self.spark.createDataFrame([], schema)
        if version is None and timestamp is None and plain_and_small(path, small_read_bytes()):
            # One chunk: Spark stops reading at an empty batch (a 0-row file), losing the rest.
            return self.spark.createDataFrame(read_arrow(path, schema).combine_chunks(), schema)
        if self.backend == "native":
            reader = self.spark.read.format("delta")
            if version is None and timestamp is None:
                version = DeltaTable(path).version()
            if version is not None:
                reader = reader.option("versionAsOf", version)
            if timestamp is not None:
                at = timestamp.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
                reader = reader.option("timestampAsOf", at)
            return reader.load(path).select(*names)
        parts, groups = current_files(path, version, timestamp)
        data_schema = StructType([f for f in schema.fields if f.name not in parts])
        frames = []
        for key, files in groups.items():
            df = self.spark.read.schema(data_schema).parquet(*files)
            for p, value in zip(parts, key, strict=True):
                df = df.withColumn(p, F.lit(value).cast(schema[p].dataType))
            frames.append(df.select(*names))
        if not frames:
            return self.spark.createDataFrame([], schema)
        return reduce(DataFrame.unionByName, frames)

    def read_small(self, path: str, schema: StructType) -> pa.Table:
        """A small table as Arrow with `schema`'s columns, without Spark (empty if no table)."""
        return read_arrow(path, schema)

    def append_rows(self, rows: list[dict[str, Any]], path: str, schema: StructType) -> int:
        """Append a few rows to an unpartitioned table in one commit, from the driver."""
        if not rows:
            return 0
        if self.backend == "native":  # a file written here, committed by delta-spark
            writer = PartitionedWriter(path, stage_dir(path), arrow_schema(schema), ())
            writer.write(pa.RecordBatch.from_pylist(rows, arrow_schema(schema)))
            return self._commit(path, schema, (), writer.close(), "append", None)
        write_deltalake(path, pa.Table.from_pylist(rows, arrow_schema(schema)), mode="append")
        return len(rows)

    def replace_rows(self, rows: list[dict[str, Any]], path: str, schema: StructType) -> None:
        """Make a small unpartitioned table hold exactly `rows`, in one commit."""
        if self.backend == "native":
            self.overwrite(self.spark.createDataFrame(rows, schema), path, schema)
            return
        data = pa.Table.from_pylist(rows, arrow_schema(schema))
        write_deltalake(path, data, mode="overwrite")

    def ensure_table(self, path: str, schema: StructType, partition_by: Sequence[str] = ()) -> None:
        """Create an empty table with `schema` if there is none (one commit); add the columns a
        table of an older version lacks (schemas only ever gain columns, at the end)."""
        if table_exists(path):
            have = {f.name for f in DeltaTable(path).schema().fields}
            missing = [f for f in schema.fields if f.name not in have]
            if missing and self.backend == "native":
                columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
                self.spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
            elif missing:
                added = Schema.from_arrow(arrow_schema(StructType(missing))).fields
                DeltaTable(path).alter.add_columns(added)
            return
        if self.backend == "native":  # one commit, no Spark job
            commit_files(self.spark, path, [], schema, partition_by, None)
            return
        delta_schema = Schema.from_arrow(arrow_schema(schema))
        parts = list(partition_by) or None
        DeltaTable.create(path, delta_schema, mode="ignore", partition_by=parts)

    def append(
        self,
        df: DataFrame,
        path: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        txn: tuple[str, int] | None = None,
    ) -> int:
        """Append `df` in one commit; returns the rows added, or -1 (nothing written) when the
        table already has `txn`."""
        if txn is not None:
            have = txn_version(path, txn[0])
            if have is not None and have >= txn[1]:
                return -1
        df = df.select(*[f.name for f in schema.fields])
        if self.backend == "native":
            if df.isEmpty():  # Delta would commit an empty version: noise in the history
                self.ensure_table(path, schema, partition_by)
                return 0
            return self._native_append(df, path, partition_by, txn)
        staged = self._write_files(df, path, partition_by)
        n = self._commit(path, schema, partition_by, staged.files, "append", txn)
        if n == 0:
            staged.discard()
        return n

    def append_generated(
        self,
        tasks: Sequence[dict[str, Any]],
        produce: Producer,
        path: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        txn: tuple[str, int] | None = None,
        slices: int | None = None,
    ) -> int:
        """Append, in one commit, the `schema` batches `produce(task)` makes in the Python
        workers for every task (`slices` Spark tasks, default one per task); returns the rows
        added, or -1 (nothing run) when the table already has `txn`.

        The workers write the data files themselves (pyarrow), so the rows never cross into
        the JVM; the driver commits them (delta-spark's transaction on the native backend,
        delta-rs' on the embedded one: see pipeline.delta_native).
        """
        if txn is not None:
            have = txn_version(path, txn[0])
            if have is not None and have >= txn[1]:
                return -1
        stage = stage_dir(path)
        target = arrow_schema(schema)

        def write(part: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
            writer = PartitionedWriter(path, stage, target, partition_by)
            for task in part:
                for out in produce(task):
                    writer.write(out)
            return writer.close()

        files = run_tasks(self.spark, tasks, write, slices) if tasks else []
        n = self._commit(path, schema, partition_by, files, "append", txn)
        if n <= 0:
            shutil.rmtree(stage, ignore_errors=True)
        return n

    def overwrite_partitions(
        self,
        df: DataFrame,
        path: str,
        schema: StructType,
        partition_by: Sequence[str],
        values: dict[str, str],
    ) -> None:
        """Replace the rows of the partition `values` (column -> value) with `df`'s rows."""
        df = df.select(*[f.name for f in schema.fields])
        if self.backend == "native":
            where = " AND ".join(f"{k} = '{_sql_str(v)}'" for k, v in values.items())
            w = df.write.format("delta").mode("overwrite").option("replaceWhere", where)
            w.partitionBy(*partition_by).save(path)
            return
        files = self._write_files(df, path, partition_by).files
        filters = [(k, "=", v) for k, v in values.items()]
        self._commit(path, schema, partition_by, files, "overwrite", None, filters)

    def stage_files(self, df: DataFrame, path: str, schema: StructType) -> Staged:
        """Spark writes `df`'s rows (`schema`'s columns) as data files of the table, not yet
        committed: `commit_overwrite` makes them the table's rows, or they are discarded."""
        return self._write_files(df.select(*schema.fieldNames()), path, ())

    def commit_overwrite(self, staged: Staged, schema: StructType) -> int:
        """The staged files become all of the table's rows in one commit; returns them."""
        mode = "overwrite" if table_exists(staged.path) else "append"
        n = self._commit(staged.path, schema, (), staged.files, mode, None)
        if n == 0 and mode == "append":  # nothing committed; an overwrite commits its file
            staged.discard()
        return n

    def overwrite(self, df: DataFrame, path: str, schema: StructType) -> int:
        return self.commit_overwrite(self.stage_files(df, path, schema), schema)  # returns its rows

    def fill_nulls(self, path: str, column: str, value: str) -> int:
        """Set `column` to `value` in each row where it is null, in one commit (none if no
        row is); returns the rows changed."""
        if self.backend == "native":
            table, where = f"delta.`{path}`", f"`{column}` IS NULL"
            n = self.spark.sql(f"SELECT * FROM {table} WHERE {where}").count()
            if n:
                self.spark.sql(f"UPDATE {table} SET `{column}` = '{_sql_str(value)}' WHERE {where}")
            return n
        metrics = DeltaTable(path).update(  # delta-rs' SQL (DataFusion): '' escapes a quote
            updates={column: "'" + value.replace("'", "''") + "'"}, predicate=f"{column} IS NULL"
        )
        return int(metrics.get("num_updated_rows", 0))

    def merge_upsert(
        self,
        df: DataFrame,
        path: str,
        schema: StructType,
        keys: Sequence[str],
        partition_by: Sequence[str] = (),
        delete_unmatched: Callable[[str], str] | None = None,
    ) -> int:
        """Upsert the rows of `df` that differ from the table by `keys`; returns how many.

        Rows equal to the table's are left out first, so a re-run commits nothing.
        `delete_unmatched(prefix)` gives SQL over the target's columns (each written as
        `{prefix}name`): target rows matching it that have no source row are deleted.
        Not for tables with map columns (they do not compare).
        """
        df = df.select(*[f.name for f in schema.fields])
        if _is_empty_table(path):
            return self.append(df, path, schema, partition_by)
        target = self.read(path, schema)
        changed = df.subtract(target)
        stale = 0
        if delete_unmatched is not None:
            gone = target.filter(delete_unmatched("")).join(df, on=list(keys), how="left_anti")
            stale = gone.limit(1).count()
        cond = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        # A delete of unmatched rows must see every source row, not only the changed ones.
        source = changed if delete_unmatched is None else df
        if self.backend == "native":
            from delta.tables import DeltaTable as SparkDeltaTable

            n = changed.count()
            if n == 0 and stale == 0:
                return 0
            m = SparkDeltaTable.forPath(self.spark, path).alias("t").merge(source.alias("s"), cond)
            m = m.whenMatchedUpdateAll().whenNotMatchedInsertAll()
            if delete_unmatched is not None:
                m = m.whenNotMatchedBySourceDelete(delete_unmatched("t."))
            m.execute()
            return n
        stages = [stage_dir(path)]
        try:
            n = self._stage(changed, stages[0])
            if n == 0 and stale == 0:
                return 0
            if source is not changed:
                stages.append(stage_dir(path))
                self._stage(source, stages[-1])
            files = parquet_files(stages[-1])
            dataset = ds.dataset(files, schema=arrow_schema(schema), format="parquet")
            reader = dataset.scanner().to_reader()
            merger = DeltaTable(path).merge(reader, cond, source_alias="s", target_alias="t")
            merger = merger.when_matched_update_all().when_not_matched_insert_all()
            if delete_unmatched is not None:
                merger = merger.when_not_matched_by_source_delete(delete_unmatched("t."))
            merger.execute()
        finally:
            for stage in stages:
                shutil.rmtree(stage, ignore_errors=True)
        return n

    def _native_append(
        self, df: DataFrame, path: str, partition_by: Sequence[str], txn: tuple[str, int] | None
    ) -> int:
        """delta-spark appends `df` in one commit carrying `txn`; returns the rows written."""
        w = df.write.format("delta").mode("append").partitionBy(*partition_by)
        for k, v in _WRITE_OPTIONS.items():
            w = w.option(k, v)
        if txn is not None:
            w = w.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
        w.save(path)
        return _last_output_rows(path)

    def _stage(self, df: DataFrame, stage: str) -> int:
        """Spark writes `df` as plain parquet under `stage`; returns its rows."""
        df.write.mode("errorifexists").parquet(stage)
        return sum(pq.read_metadata(f).num_rows for f in parquet_files(stage))

    def _write_files(self, df: DataFrame, path: str, partition_by: Sequence[str]) -> Staged:
        """Spark writes the data files under a fresh directory of the table (uncommitted)."""
        stage = stage_dir(path)
        w = df.write.mode("errorifexists").partitionBy(*partition_by)
        for k, v in _WRITE_OPTIONS.items():
            w = w.option(k, v)
        w.parquet(stage)
        files = [spark_file_row(path, f, partition_by) for f in parquet_files(stage)]
        return Staged(path, stage, files)

    def _commit(
        self,
        path: str,
        schema: StructType,
        partition_by: Sequence[str],
        files: list[dict[str, Any]],
        mode: str,
        txn: tuple[str, int] | None,
        partition_filters: list[tuple[str, str, str]] | None = None,
    ) -> int:
        """Commit the DataFile rows' files in one transaction; returns their rows. An append
        of no rows commits nothing (an empty commit would only be noise in the history)."""
        if mode == "append" and not sum(rows_of(f["stats"]) for f in files):
            self.ensure_table(path, schema, partition_by)
            return 0
        if self.backend == "native":  # (partition overwrites are delta-spark's replaceWhere)
            overwrite = mode == "overwrite"
            return commit_files(self.spark, path, files, schema, partition_by, txn, overwrite)
        return commit(path, schema, partition_by, files, mode, txn, partition_filters)


def _last_output_rows(path: str) -> int:
    """Rows the native backend's last commit wrote (its operation metrics)."""
    last = DeltaTable(path).history(1)[0]
    return int((last.get("operationMetrics") or {}).get("numOutputRows", 0))


def _sql_str(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _is_empty_table(path: str) -> bool:
    return not table_exists(path) or not DeltaTable(path).file_uris()
