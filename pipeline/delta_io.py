"""All Delta Lake I/O of the pipeline, with two backends behind one small API.

- `embedded` (default here and in CI): delta-rs (`deltalake`) owns the transaction log and
  Spark does the compute. Large writes: Spark executors write plain parquet files into a
  fresh directory under the table root (`w-<uuid>/<partition dirs>`), then the driver
  commits them all in ONE delta-rs commit of `add` actions (sizes, row counts and min/max of
  numeric columns read from the parquet footers). Nothing goes through the driver but file
  names and footers. A failed job leaves only unreferenced files (vacuum removes them).
  Reads give Spark the table's current file list (never delta-rs' pyarrow readers, which
  can abort the process at exit: delta-io/delta-rs#2184).
- `native`: delta-spark's `format("delta")`, chosen when the Delta classes load in the JVM
  and the Delta session extension is configured (cluster images with the jars baked in).

Same tables, schemas and semantics in both. Appends carry a Delta `txn` (app id, version):
an append whose version the table already has is skipped, so re-running a job changes
nothing. Set MQAUDIT_DELTA_BACKEND=embedded|native to force a backend.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipeline.schemas import arrow_schema

BACKEND_ENV = "MQAUDIT_DELTA_BACKEND"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_WRITE_OPTIONS = {"parquet.enable.dictionary#body": "false"}  # 1 KiB bodies never repeat


def native_delta_available(spark: SparkSession) -> bool:
    """Whether delta-spark's classes load in this session's JVM and its extension is on."""
    try:
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()  # type: ignore[union-attr]
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, loader)  # type: ignore[union-attr]
    except Exception:  # py4j raises its own error types for a missing class
        return False
    return "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")


def choose_backend(spark: SparkSession) -> str:
    forced = os.environ.get(BACKEND_ENV)
    if forced:
        if forced not in ("embedded", "native"):
            raise ValueError(f"{BACKEND_ENV} must be embedded or native, got {forced!r}")
        return forced
    return "native" if native_delta_available(spark) else "embedded"


def table_exists(path: str) -> bool:
    return bool(DeltaTable.is_deltatable(path))


def txn_version(path: str, app_id: str) -> int | None:
    """The last `txn` version the table recorded for `app_id` (None: never)."""
    if not table_exists(path):
        return None
    version = DeltaTable(path).transaction_version(app_id)
    return None if version is None else int(version)


def history(path: str) -> list[dict[str, Any]]:
    return list(DeltaTable(path).history()) if table_exists(path) else []


class DeltaIO:
    """Delta reads and writes for one Spark session (backend chosen once)."""

    def __init__(self, spark: SparkSession, backend: str | None = None) -> None:
        self.spark = spark
        self.backend = backend or choose_backend(spark)

    # -- reads ----------------------------------------------------------------------------

    def read(self, path: str, schema: StructType) -> DataFrame:
        """The table as a DataFrame with exactly `schema`'s columns (empty if no table)."""
        names = [f.name for f in schema.fields]
        if not table_exists(path):
            return self.spark.createDataFrame([], schema)
        if self.backend == "native":
            return self.spark.read.format("delta").load(path).select(*names)
        dt = DeltaTable(path)
        parts = list(dt.metadata().partition_columns)
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        data_schema = StructType([f for f in schema.fields if f.name not in parts])
        groups: dict[tuple[str | None, ...], list[str]] = {}
        for a in actions:
            key = tuple(a.get(f"partition.{p}") for p in parts)
            groups.setdefault(key, []).append(_join(path, unquote(a["path"])))
        frames = []
        for key, files in groups.items():
            df = self.spark.read.schema(data_schema).parquet(*files)
            for p, value in zip(parts, key, strict=True):
                df = df.withColumn(p, F.lit(value).cast(schema[p].dataType))
            frames.append(df.select(*names))
        if not frames:
            return self.spark.createDataFrame([], schema)
        out = frames[0]
        for df in frames[1:]:
            out = out.unionByName(df)
        return out

    # -- writes ---------------------------------------------------------------------------

    def ensure_table(self, path: str, schema: StructType, partition_by: Sequence[str] = ()) -> None:
        """Create an empty table with `schema` if there is none (one commit, once)."""
        if table_exists(path):
            return
        if self.backend == "native":
            empty = self.spark.createDataFrame([], schema)
            empty.write.format("delta").partitionBy(*partition_by).mode("append").save(path)
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
            w = df.write.format("delta").mode("append").partitionBy(*partition_by)
            if txn is not None:
                w = w.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
            w.save(path)
            return _last_output_rows(self.spark, path)
        stage, files = self._write_files(df, path, partition_by)
        n = self._commit(path, schema, partition_by, files, "append", txn)
        if n == 0:
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
        _, files = self._write_files(df, path, partition_by)
        filters = [(k, "=", v) for k, v in values.items()]
        self._commit(path, schema, partition_by, files, "overwrite", None, filters)

    def overwrite(self, df: DataFrame, path: str, schema: StructType) -> int:
        """Replace all of the table's rows with `df`'s in one commit (creating the table);
        returns the rows written."""
        df = df.select(*[f.name for f in schema.fields])
        if self.backend == "native":
            df.write.format("delta").mode("overwrite").save(path)
            return _last_output_rows(self.spark, path)
        stage, files = self._write_files(df, path, ())
        mode = "overwrite" if table_exists(path) else "append"
        n = self._commit(path, schema, (), files, mode, None)
        if n == 0 and mode == "append":  # nothing committed; an overwrite commits its file
            shutil.rmtree(stage, ignore_errors=True)
        return n

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
        stages = [_stage_dir(path)]
        try:
            n = self._stage(changed, stages[0])
            if n == 0 and stale == 0:
                return 0
            if source is not changed:
                stages.append(_stage_dir(path))
                self._stage(source, stages[-1])
            files = _parquet_files(stages[-1])
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

    # -- embedded internals ---------------------------------------------------------------

    def _stage(self, df: DataFrame, stage: str) -> int:
        """Spark writes `df` as plain parquet under `stage`; returns its rows."""
        df.write.mode("errorifexists").parquet(stage)
        return sum(pq.read_metadata(f).num_rows for f in _parquet_files(stage))

    def _write_files(
        self, df: DataFrame, path: str, partition_by: Sequence[str]
    ) -> tuple[str, list[str]]:
        """Spark writes the data files under a fresh directory of the table: (it, the files)."""
        stage = _stage_dir(path)
        w = df.write.mode("errorifexists").partitionBy(*partition_by)
        for k, v in _WRITE_OPTIONS.items():
            w = w.option(k, v)
        w.parquet(stage)
        return stage, _parquet_files(stage)

    def _commit(
        self,
        path: str,
        schema: StructType,
        partition_by: Sequence[str],
        files: list[str],
        mode: str,
        txn: tuple[str, int] | None,
        partition_filters: list[tuple[str, str, str]] | None = None,
    ) -> int:
        """Commit the files in one transaction; returns their rows. An append of no rows
        commits nothing (an empty commit would only be noise in the history)."""
        adds = [_add_action(path, f, partition_by) for f in files]
        rows = sum(int(json.loads(a.stats)["numRecords"]) for a in adds)
        if rows == 0 and mode == "append":
            self.ensure_table(path, schema, partition_by)
            return 0
        props = CommitProperties(app_transactions=[Transaction(*txn)] if txn else None)
        delta_schema = Schema.from_arrow(arrow_schema(schema))
        parts = list(partition_by) or None
        if not table_exists(path):
            create_table_with_add_actions(
                path,
                delta_schema,
                adds,
                mode="append",
                partition_by=parts,
                commit_properties=props,
            )
        else:
            actions: list[AddAction | RemoveAction] = [*adds]
            DeltaTable(path).create_write_transaction(
                actions,
                mode,
                delta_schema,
                partition_by=parts,
                partition_filters=partition_filters,
                commit_properties=props,
            )
        return rows


def _last_output_rows(spark: SparkSession, path: str) -> int:
    """Rows the native backend's last commit wrote (its operation metrics)."""
    from delta.tables import DeltaTable as SparkDeltaTable

    last = SparkDeltaTable.forPath(spark, path).history(1).collect()[0]
    return int((last["operationMetrics"] or {}).get("numOutputRows", 0))


def _join(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel}"


def _sql_str(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _parquet_files(directory: str) -> list[str]:
    """The data files Spark wrote under `directory` (not its _SUCCESS or .crc files)."""
    return sorted(str(p) for p in Path(directory).rglob("*.parquet") if not p.name.startswith("."))


def _is_empty_table(path: str) -> bool:
    return not table_exists(path) or not DeltaTable(path).file_uris()


def _stage_dir(table_path: str) -> str:
    return _join(table_path, f"w-{uuid.uuid4().hex}")


def _add_action(table_path: str, file: str, partition_by: Sequence[str]) -> AddAction:
    """The `add` action of a parquet file Spark wrote under the table root."""
    rel = os.path.relpath(file, table_path)
    values: dict[str, str | None] = {}
    for part in rel.split("/")[:-1]:
        name, sep, raw = part.partition("=")
        if sep and name in partition_by:
            # Spark escapes partition values as %XX; its null is this marker.
            values[name] = None if raw == _HIVE_NULL else unquote(raw)
    st = os.stat(file)
    return AddAction(  # delta-rs percent-encodes the path itself
        rel, st.st_size, values, st.st_mtime_ns // 1_000_000, True, _stats(file)
    )


def _stats(file: str) -> str:
    """Delta file statistics from the parquet footer: rows, nulls, numeric min/max."""
    meta = pq.read_metadata(file)
    out: dict[str, Any] = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}}
    nulls: dict[str, int] = {}
    schema = meta.schema.to_arrow_schema()
    numeric = {f.name for f in schema if pa.types.is_integer(f.type)}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    complete: set[str] = set(numeric)
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for c in range(group.num_columns):
            col = group.column(c)
            name = col.path_in_schema
            if "." in name:
                continue  # nested (map) columns: no stats
            st = col.statistics
            if st is None or not st.has_null_count:
                nulls[name] = -(1 << 62)
            else:
                nulls[name] = nulls.get(name, 0) + st.null_count
            if name in numeric:
                if st is None or not st.has_min_max:
                    complete.discard(name)
                    continue
                lo[name] = st.min if name not in lo else min(lo[name], st.min)
                hi[name] = st.max if name not in hi else max(hi[name], st.max)
    out["minValues"] = {k: v for k, v in lo.items() if k in complete}
    out["maxValues"] = {k: v for k, v in hi.items() if k in complete}
    out["nullCount"] = {k: v for k, v in nulls.items() if v >= 0}
    return json.dumps(out)
