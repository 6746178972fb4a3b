"""The native backend's commit of data files written outside delta-spark's writer: one
delta-spark transaction (`DeltaLog.startTransaction()` -> `OptimisticTransaction.commit`) of
their `add` actions, carrying the `txn` (app id, version) of an idempotent append, over py4j;
for an overwrite, with the `remove` actions of the files of the version it read.

Why: rows made in the Python workers (the CommitLog's messages, decoded to Arrow there) are
written there as parquet files (pipeline.delta_files.PartitionedWriter) and only their
paths and statistics travel to the driver. Handing the rows to delta-spark's writer instead
(`mapInArrow` then `format("delta")`) sends every 1 KiB body through the JVM's row format
and its parquet writer: measured 18x the CPU of the whole ingest (benchmarks/ingest_bench.py).
The commit itself is delta-spark's, with its conflict checks on files. The `txn` already
recorded is read from the log by delta-rs (as both backends do before an append's job
runs): asking delta-spark's transaction for it (`txnVersion`) reconstructs the table's
state with a Spark job, seconds per commit on two busy cores (5-7 s measured), and appends
with a `txn` (ingest's) run under the lake's writer lock, so none commits beside another.

The actions are parsed by delta-spark's own `Action.fromJson` from the Delta protocol's JSON
(the same `add` fields delta-rs commits for the embedded backend).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from pipeline.delta_files import DataFile, live_files, rows_of, txn_version


def commit_files(
    spark: SparkSession,
    path: str,
    files: list[DataFile],
    schema: StructType,
    partition_by: Sequence[str],
    txn: tuple[str, int] | None,
    overwrite: bool = False,
) -> int:
    """Append the DataFile rows' files to the table at `path` in one commit carrying `txn`
    (the table's first commit, with `schema` and `partition_by`, when there is none);
    returns their rows, or -1 (nothing committed) when the table has `txn`. `overwrite`: the
    commit also removes every file of the version it read (the whole table was read: a
    concurrent commit that adds files conflicts with it)."""
    have = None if txn is None else txn_version(path, txn[0])
    if txn is not None and have is not None and have >= txn[1]:
        return -1
    jvm: Any = spark._jvm
    delta = jvm.org.apache.spark.sql.delta
    transaction = delta.DeltaLog.forTable(spark._jsparkSession, path).startTransaction()
    if transaction.readVersion() < 0:  # a new table (its directory may hold staged files)
        metadata = {
            "id": str(uuid.uuid4()),
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema.json(),
            "partitionColumns": list(partition_by),
            "configuration": {},
            "createdTime": int(time.time() * 1000),
        }
        parsed = delta.actions.Action.fromJson(json.dumps({"metaData": metadata}))
        transaction.updateMetadataForNewTable(parsed)
    actions = [{"add": _add(f)} for f in files]
    now, read = int(time.time() * 1000), transaction.readVersion()
    if overwrite and read >= 0:
        transaction.readWholeTable()
        actions += [{"remove": _remove(a, now)} for a in live_files(path, read)]
    if txn is not None:
        actions.append({"txn": {"appId": txn[0], "version": txn[1], "lastUpdated": now}})
    parsed = [delta.actions.Action.fromJson(json.dumps(a)) for a in actions]
    operation = _write_operation(jvm, "Overwrite" if overwrite else "Append", partition_by)
    transaction.commit(jvm.PythonUtils.toSeq(parsed), operation)
    return sum(rows_of(f["stats"]) for f in files)


def _add(f: DataFile) -> dict[str, Any]:
    """The protocol's `add` action of a DataFile row: its path relative to the table root,
    as a URI (a partition directory's own %XX escapes are escaped again)."""
    return {
        "path": quote(f["path"]),
        "partitionValues": json.loads(f["partition_values"]),
        "size": f["size"],
        "modificationTime": f["modified"],
        "dataChange": True,
        "stats": f["stats"],
    }


def _remove(a: dict[str, Any], now: int) -> dict[str, Any]:
    """The protocol's `remove` action of a live file (its `add` as delta-rs lists it: the
    path as the log has it, partition values typed)."""
    values = {k: None if v is None else str(v) for k, v in (a.get("partition") or {}).items()}
    return {
        "path": a["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": values,
        "size": a["size_bytes"],
    }


def _write_operation(jvm: Any, mode: str, partition_by: Sequence[str]) -> Any:
    """DeltaOperations.Write(mode, partitionBy): what the history shows, as for a write by
    delta-spark's writer (mode: "Append" or "Overwrite")."""
    scala_none = getattr(getattr(jvm.scala, "None$"), "MODULE$")
    write = getattr(getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Write$"), "MODULE$")
    parts = jvm.scala.Some(jvm.PythonUtils.toSeq(list(partition_by)))
    rest = [scala_none] * 7  # predicate, user metadata, ... : none
    return write.apply(getattr(jvm.org.apache.spark.sql.SaveMode, mode), parts, *rest)
