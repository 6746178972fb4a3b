"""The file side of pipeline.delta_io: parquet data files written by Spark or by the Python
workers straight from Arrow batches, described as `add` actions (size, partition values,
rows and statistics from the footer), committed in one delta-rs transaction by the embedded
backend (delta-spark's by the native one: pipeline.delta_native); the table's
current files (what Spark or, for small tables, pyarrow reads: never delta-rs' own readers,
which can abort the process at exit: delta-io/delta-rs#2184).

A data file lies under a fresh directory of the table root (`w-<uuid>/<partition dirs>/`),
partition columns in the directory names only, as Spark lays them out.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions
from pyspark.sql.types import StructType

from pipeline.schemas import arrow_schema

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# What is known of a data file when it is committed (a DataFile row): path (relative to the
# table root), size, modified (epoch ms), partition_values (JSON), stats (Delta's JSON).
DataFile = dict[str, Any]


def table_exists(path: str) -> bool:
    return bool(DeltaTable.is_deltatable(path))


def txn_version(path: str, app_id: str) -> int | None:
    """The last `txn` version the table recorded for `app_id` (None: never)."""
    if not table_exists(path):
        return None
    version = DeltaTable(path).transaction_version(app_id)
    return None if version is None else int(version)


def stage_dir(table_path: str) -> str:
    return f"{table_path.rstrip('/')}/w-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Staged:
    """Data files written under a table's root (`stage`, a `stage_dir`) and not committed:
    their DataFile rows. Until a commit names them no reader sees them; `discard` drops them."""

    path: str  # the table's
    stage: str
    files: list[dict[str, Any]]

    @property
    def rows(self) -> int:
        return sum(rows_of(f["stats"]) for f in self.files)

    def discard(self) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)


def parquet_files(directory: str) -> list[str]:
    """The data files Spark wrote under `directory` (not its _SUCCESS or .crc files)."""
    return sorted(str(p) for p in Path(directory).rglob("*.parquet") if not p.name.startswith("."))


class PartitionedWriter:
    """Writes Arrow batches of a table as parquet files under `stage`, one file per partition
    value; `close` returns a DataFile row per file. No dictionaries (most columns of a
    message are unique: building them costs more than they save); no statistics for binary
    columns (bodies)."""

    def __init__(self, table_path: str, stage: str, schema: pa.Schema, partition_by: Sequence[str]):
        self.table_path = table_path
        self.stage = stage
        self.partition_by = list(partition_by)
        self.data_schema = pa.schema([f for f in schema if f.name not in self.partition_by])
        plain = [f.name for f in self.data_schema if not pa.types.is_binary(f.type)]
        self.options: dict[str, Any] = {
            "compression": "snappy",
            "use_dictionary": False,
            "write_statistics": plain,
        }
        self.writers: dict[tuple[str | None, ...], tuple[str, pq.ParquetWriter]] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        for values, rows in self._split(batch):
            key = tuple(values)
            if key not in self.writers:
                dirs = [
                    f"{p}={HIVE_NULL if v is None else quote(v, safe='')}"
                    for p, v in zip(self.partition_by, key, strict=True)
                ]
                path = os.path.join(self.stage, *dirs, f"part-{uuid.uuid4().hex}.parquet")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self.writers[key] = (path, pq.ParquetWriter(path, self.data_schema, **self.options))
            data = rows.select(self.data_schema.names)
            self.writers[key][1].write_batch(data)

    def _split(self, batch: pa.RecordBatch) -> list[tuple[list[str | None], pa.RecordBatch]]:
        """The batch's rows by partition value, as Spark writes them (a batch mostly has one)."""
        if not self.partition_by:
            return [([], batch)]
        texts = [batch.column(p).cast(pa.string()) for p in self.partition_by]
        if all(pc.count_distinct(t, mode="all").as_py() == 1 for t in texts):
            return [([t[0].as_py() for t in texts], batch)]
        keys = [f"k{i}" for i in range(len(texts))]
        rows = pa.array(np.arange(batch.num_rows))
        groups = pa.table([*texts, rows], names=[*keys, "row"]).group_by(keys, use_threads=False)
        out = []
        for g in groups.aggregate([("row", "list")]).to_pylist():
            out.append(([g[k] for k in keys], batch.take(pa.array(g["row_list"]))))
        return out

    def close(self) -> list[DataFile]:
        rows = []
        for key, (path, writer) in self.writers.items():
            writer.close()
            st = os.stat(path)
            values = dict(zip(self.partition_by, key, strict=True))
            rows.append(
                {
                    "path": os.path.relpath(path, self.table_path),
                    "size": st.st_size,
                    "modified": st.st_mtime_ns // 1_000_000,
                    "partition_values": json.dumps(values),
                    "stats": file_stats(path),
                }
            )
        self.writers.clear()
        return rows


def commit(
    path: str,
    schema: StructType,
    partition_by: Sequence[str],
    files: list[dict[str, Any]],
    mode: str,
    txn: tuple[str, int] | None,
    partition_filters: list[tuple[str, str, str]] | None = None,
) -> int:
    """Commit the DataFile rows' files in one transaction (creating the table if there is
    none); returns their rows."""
    adds = [add_action(f) for f in files]
    props = CommitProperties(app_transactions=[Transaction(*txn)] if txn else None)
    delta_schema = Schema.from_arrow(arrow_schema(schema))
    parts = list(partition_by) or None
    if not DeltaTable.is_deltatable(path):
        create_table_with_add_actions(
            path, delta_schema, adds, mode="append", partition_by=parts, commit_properties=props
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
    return sum(rows_of(f["stats"]) for f in files)


def live_files(path: str, version: int) -> list[dict[str, Any]]:
    """The `add` actions of the files live in the table's `version` (path, size_bytes,
    partition, ...), as delta-rs' log reader lists them."""
    return list(pa.table(DeltaTable(path, version=version).get_add_actions()).to_pylist())


def current_files(
    path: str, version: int | None = None, timestamp: datetime | None = None
) -> tuple[list[str], dict[tuple[str | None, ...], list[str]]]:
    """(partition columns, data files by partition value) of the table's current version, or
    of `version`, or of the last version committed at or before `timestamp`."""
    dt = DeltaTable(path, version=version)
    if timestamp is not None:
        dt.load_as_version(timestamp)
    parts = list(dt.metadata().partition_columns)
    groups: dict[tuple[str | None, ...], list[str]] = {}
    for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist():
        key = tuple(a.get(f"partition.{p}") for p in parts)
        groups.setdefault(key, []).append(f"{path.rstrip('/')}/{unquote(a['path'])}")
    return parts, groups


# `DeltaIO.read` reads a table whose current data files total at most this with pyarrow on
# the driver (read_arrow) and gives it to Spark in memory. Spark's own read of a Delta table
# is planning, a listing or snapshot job and a scan: the demo's ten ingested tables took
# 3.3 s warm and 23 s in a new JVM that way, 0.3 s with pyarrow. SMALL_READ_ENV sets another
# bound in bytes (0: every read is Spark's). The files are compressed: a table must also have
# at most SMALL_READ_ROWS rows (consume_queue's 2.7 million rows of a 4M-row lake are 12.9 MB
# of files, and in memory they took the driver's heap: an OutOfMemoryError in the audit).
SMALL_READ_BYTES = 16 << 20
SMALL_READ_ROWS = 100_000
SMALL_READ_ENV = "MQAUDIT_SMALL_READ_BYTES"


def small_read_bytes() -> int:
    """The bound of `DeltaIO.read`'s in-memory reads: SMALL_READ_ENV, else SMALL_READ_BYTES."""
    value = os.environ.get(SMALL_READ_ENV) or str(SMALL_READ_BYTES)
    if not value.isdigit():
        raise ValueError(f"{SMALL_READ_ENV} must be a number of bytes (0 or more), got {value!r}")
    return int(value)


def plain_and_small(path: str, max_bytes: int, max_rows: int = SMALL_READ_ROWS) -> bool:
    """Whether the table's current data files total at most `max_bytes` and `max_rows` (as
    their statistics count them) and hold all of its rows as they are: reader protocol 1 (no
    deletion vectors, no column mapping), which is what read_arrow reads exactly. Never with
    a bound of 0, nor for files without a row count."""
    if max_bytes <= 0 or not table_exists(path):
        return False
    dt = DeltaTable(path)
    if dt.protocol().min_reader_version > 1:
        return False
    files = pa.table(dt.get_add_actions(flatten=True))
    if not files.num_rows:
        return True  # no data files: nothing to read
    if "num_records" not in files.column_names:
        return False
    rows = files.column("num_records").to_pylist()
    if None in rows or sum(rows) > max_rows:
        return False
    return bool(sum(files.column("size_bytes").to_pylist()) <= max_bytes)


def read_arrow(path: str, schema: StructType) -> pa.Table:
    """A (small) table's current rows with `schema`'s columns, read with pyarrow on the
    driver, without a Spark job (no rows if there is no table yet)."""
    target = arrow_schema(schema)
    if not table_exists(path):
        return target.empty_table()
    parts, groups = current_files(path)
    tables = []
    for key, files in groups.items():
        for file in files:
            # Partition values come from the log (some writers also keep them in the file).
            have = set(pq.read_schema(file).names) - set(parts)
            t = pq.read_table(file, columns=[n for n in target.names if n in have])
            for n in target.names:  # a column added after the file was written: null
                if n not in have and n not in parts:
                    t = t.append_column(n, pa.nulls(t.num_rows, target.field(n).type))
            for p, value in zip(parts, key, strict=True):
                if p in target.names:
                    # delta-rs gives the value typed (a date, a number) or as text.
                    column = pa.array([value] * t.num_rows)
                    t = t.append_column(p, column.cast(target.field(p).type))
            tables.append(t.select(target.names).cast(target))
    return pa.concat_tables(tables) if tables else target.empty_table()


def add_action(row: dict[str, Any]) -> AddAction:
    """The `add` action of a DataFile row (delta-rs percent-encodes the path itself)."""
    values = json.loads(row["partition_values"])
    return AddAction(row["path"], row["size"], values, row["modified"], True, row["stats"])


def spark_file_row(table_path: str, file: str, partition_by: Sequence[str]) -> dict[str, Any]:
    """The DataFile row of a parquet file Spark wrote under the table root."""
    rel = os.path.relpath(file, table_path)
    values: dict[str, str | None] = {}
    for part in rel.split("/")[:-1]:
        name, sep, raw = part.partition("=")
        if sep and name in partition_by:
            # Spark escapes partition values as %XX; its null is this marker.
            values[name] = None if raw == HIVE_NULL else unquote(raw)
    st = os.stat(file)
    return {
        "path": rel,
        "size": st.st_size,
        "modified": st.st_mtime_ns // 1_000_000,
        "partition_values": json.dumps(values),
        "stats": file_stats(file),
    }


def file_stats(file: str) -> str:
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


def rows_of(stats: str) -> int:
    return int(json.loads(stats)["numRecords"])
