"""Lakes written before rows named their cluster: refused with a clear message, or migrated
once by `mqaudit pipeline migrate-lake --lake LAKE --cluster NAME`.

A row without a cluster cannot be told apart from another cluster's row of a broker with the
same name, and a null `cluster` never joins: so ingest and audit refuse such a lake instead of
reading it (`refuse_unkeyed`). The migration adds the column to every table that lacks it and
names NAME, the cluster all the lake's data came from, in each of its rows: one commit per
table, under the lake's writer lock, the history kept (time travel to the old versions
works). Running it again changes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_runtime.common.topics import validate_group
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.jobs.maintenance import lake_lock
from pipeline.lake import TABLES
from pipeline.spark_session import build_spark

CLUSTER = "cluster"


class UnkeyedLake(ValueError):
    """The lake has tables written before rows named their cluster."""


def unkeyed(lake: str | Path) -> list[str]:
    """The lake's tables (of those whose rows name a cluster) that have no `cluster` column."""
    out = []
    for t in TABLES.values():
        path = t.path(lake)
        if CLUSTER in t.schema.fieldNames() and table_exists(path):
            if CLUSTER not in {f.name for f in DeltaTable(path).schema().fields}:
                out.append(t.name)
    return out


def refuse_unkeyed(lake: str | Path) -> None:
    """UnkeyedLake, saying how to migrate, when the lake has a table without `cluster`."""
    old = unkeyed(lake)
    if old:
        raise UnkeyedLake(
            f"lake {lake} was written before its rows named their cluster ({', '.join(old)} "
            f"have no `cluster` column); migrate it once: mqaudit pipeline migrate-lake "
            f"--lake {lake} --cluster NAME (NAME: the cluster its data came from)"
        )


def migrate_lake(
    lake: str | Path, cluster: str, spark: SparkSession | None = None
) -> dict[str, Any]:
    """Name `cluster` in every row of the lake's tables that lack the column; a summary:
    {"cluster", "tables": {name: rows named}, "seconds"}."""
    started = time.monotonic()
    name = validate_group(cluster)
    if not Path(lake).is_dir():
        raise FileNotFoundError(f"lake {lake} does not exist")
    old = unkeyed(lake)
    done: dict[str, int] = {}
    if old:
        io = DeltaIO(spark or build_spark("mqaudit-migrate"))
        with lake_lock(lake):
            for table in old:
                t = TABLES[table]
                io.ensure_table(t.path(lake), t.schema, t.partitions)  # adds the column
                done[table] = io.fill_nulls(t.path(lake), CLUSTER, name)
    return {"cluster": name, "tables": done, "seconds": round(time.monotonic() - started, 3)}
