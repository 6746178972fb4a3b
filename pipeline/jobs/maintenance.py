"""Table maintenance of the lake: OPTIMIZE (bin-packing small files; Z-ordered where a table
is looked up by key), VACUUM of the files no version within the retention still needs, and
a report of what was done per table. On either Delta backend.

It runs under the lake's writer lock (`lake_lock`), which ingest holds while it writes: the
two never overlap, so a VACUUM never sees files an ingest has written but not committed.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipeline.delta_io import DeltaIO
from pipeline.lake import TABLES, existing, table_path

LOCK_FILE = ".mqaudit-writer.lock"
# Columns a table is looked up by (joins and lookups by key): files are Z-ordered on them so
# that a look-up reads few files. Partition columns cannot be Z-ordered.
ZORDER = {
    "messages": ["uniq_key"],
    "consume_queue": ["topic", "queue_id"],
    "message_log": ["msg_id"],
}
DELTA_DEFAULT_RETENTION_HOURS = 168.0  # delta-spark refuses less unless its check is off


class LakeBusy(RuntimeError):
    """The lake's writer lock was not free in time (an ingest is writing)."""


@contextmanager
def lake_lock(lake: str | Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold the lake's writer lock (an exclusive flock on LAKE/.mqaudit-writer.lock), waiting
    for it up to `wait_s` seconds (None: as long as it takes); LakeBusy when time runs out."""
    Path(lake).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(lake) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise LakeBusy(
                        f"lake {lake} is being written (its writer lock is held)"
                    ) from None
                time.sleep(0.2)  # flock has no timed wait
        yield
    finally:
        os.close(fd)  # releases the lock


def data_files_on_disk(path: str) -> int:
    """Parquet data files under the table's directory, referenced or not (not the log's
    checkpoints)."""
    count = 0
    for _, dirs, files in os.walk(path):
        if "_delta_log" in dirs:
            dirs.remove("_delta_log")
        count += sum(1 for f in files if f.endswith(".parquet") and not f.startswith("."))
    return count


def maintain_lake(
    lake: str | Path,
    spark: SparkSession,
    retention_hours: float = DELTA_DEFAULT_RETENTION_HOURS,
    *,
    wait_s: float | None = 3600.0,
) -> dict[str, Any]:
    """OPTIMIZE then VACUUM every table of the catalog that `lake` holds, under the writer
    lock; returns what was done per table (files before and after, what OPTIMIZE added and
    removed, what VACUUM deleted)."""
    if retention_hours < 0:
        raise ValueError(f"retention_hours must be >= 0, got {retention_hours}")
    root = Path(lake).resolve()
    with lake_lock(root, wait_s):
        io = DeltaIO(spark)
        tables = sorted(existing(root, TABLES))
        done = {t: _maintain(io, table_path(root, t), retention_hours) for t in tables}
    return {
        "lake": str(root),
        "backend": io.backend,
        "retention_hours": retention_hours,
        "tables": done,
    }


def _maintain(io: DeltaIO, path: str, retention_hours: float) -> dict[str, Any]:
    name = Path(path).name
    zorder = ZORDER.get(name, [])
    before = len(DeltaTable(path).file_uris())
    on_disk = data_files_on_disk(path)
    if io.backend == "native":
        added, removed = _native_optimize(io.spark, path, zorder)
        _native_vacuum(io.spark, path, retention_hours)
    else:
        dt = DeltaTable(path)
        metrics = dt.optimize.z_order(zorder) if zorder else dt.optimize.compact()
        added, removed = int(metrics["numFilesAdded"]), int(metrics["numFilesRemoved"])
        DeltaTable(path).vacuum(
            retention_hours=int(retention_hours), dry_run=False, enforce_retention_duration=False
        )
    return {
        "zorder": zorder,
        "files_before": before,
        "files_after": len(DeltaTable(path).file_uris()),
        "optimize_added": added,
        "optimize_removed": removed,
        "vacuum_deleted": on_disk + added - data_files_on_disk(path),
    }


def _native_optimize(spark: SparkSession, path: str, zorder: list[str]) -> tuple[int, int]:
    from delta.tables import DeltaTable as SparkDeltaTable

    builder = SparkDeltaTable.forPath(spark, path).optimize()
    result = builder.executeZOrderBy(*zorder) if zorder else builder.executeCompaction()
    metrics = result.collect()[0]["metrics"]
    return int(metrics["numFilesAdded"]), int(metrics["numFilesRemoved"])


def _native_vacuum(spark: SparkSession, path: str, retention_hours: float) -> None:
    from delta.tables import DeltaTable as SparkDeltaTable

    # The retention is the Variable's, chosen by the operator: below delta-spark's default
    # its safety check would refuse it. VACUUM lists the table's directories in as many
    # tasks as partition discovery may use (10,000 by default: 30 s of empty tasks for a
    # small table on two cores); twice the cores is plenty.
    check = "false" if retention_hours < DELTA_DEFAULT_RETENTION_HOURS else "true"
    settings = {
        "spark.databricks.delta.retentionDurationCheck.enabled": check,
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(
            2 * spark.sparkContext.defaultParallelism
        ),
    }
    saved = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        SparkDeltaTable.forPath(spark, path).vacuum(retention_hours)
    finally:
        for key, old in saved.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)
