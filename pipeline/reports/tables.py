"""The audit tables a report shows, read from the lake and collected (they are summaries)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from pipeline.delta_io import DeltaIO
from pipeline.lake import AUDIT_TABLES, table_path
from pipeline.spark_session import apply_sql_conf, build_spark

Tables = dict[str, pd.DataFrame]


def load_tables(
    lake: str | Path,
    names: tuple[str, ...] = tuple(AUDIT_TABLES),
    spark: SparkSession | None = None,
    master: str | None = None,
) -> Tables:
    """Each named audit table as pandas (empty with its columns when the table is missing)."""
    spark = spark or build_spark("mqaudit-report", master)
    apply_sql_conf(spark)
    io = DeltaIO(spark)
    root = str(Path(lake).resolve())
    out = {}
    for name in names:
        schema = AUDIT_TABLES[name]
        out[name] = io.read(table_path(root, name), schema).toPandas()
    return out
