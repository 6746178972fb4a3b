"""The producer and consumer ledgers into the lake: `message_stub` and `message_log`, each
read in Arrow batches (SQLite file or a database URL), staged as one parquet file and merged
by the table's key (a row the ledger changed since replaces the lake's). Part of every
ingest, and alone for a system with no broker store to read (RabbitMQ)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.common.progress import reporter
from broker_runtime.common.topics import validate_group
from pipeline import schemas
from pipeline.delta_io import DeltaIO
from pipeline.lake import TABLES, table_path
from pipeline.readers.layout import LedgerSources, cluster_of, ledger_sources
from pipeline.readers.ledger import read_table
from pipeline.spark_session import apply_sql_conf


def merge_ledgers(
    spark: SparkSession,
    io: DeltaIO,
    lake: str,
    sources: LedgerSources,
    cluster: str,
    say: Callable[[str], None],
) -> dict[str, int]:
    """Merge each ledger table of `cluster` that has a source (rows of other clusters stay
    as they are); the rows new or changed per table."""
    appended: dict[str, int] = {}
    for name, url, schema in (
        ("message_stub", sources.message_stub, schemas.MESSAGE_STUB),
        ("message_log", sources.message_log, schemas.MESSAGE_LOG),
    ):
        if url is None:
            continue
        stage = Path(lake) / "_ingest_tmp" / f"{name}-{uuid.uuid4().hex}.parquet"
        stage.parent.mkdir(parents=True, exist_ok=True)
        try:
            writer = None
            for batch in read_table(url, name, schema, cluster):
                writer = writer or pq.ParquetWriter(stage, batch.schema)
                writer.write_batch(batch)
            if writer is None:
                continue
            writer.close()
            df = spark.read.schema(schema).parquet(str(stage))
            n = io.merge_upsert(df, table_path(lake, name), schema, TABLES[name].key)
            appended[name] = n
            say(f"{name} ({cluster}): {max(n, 0):,} new or changed rows")
        finally:
            shutil.rmtree(stage.parent, ignore_errors=True)
    return appended


def ingest_ledgers(
    spark: SparkSession,
    lake: str | Path,
    data_dir: str | Path | None = None,
    ledger_url: str | None = None,
    *,
    cluster: str | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Only the ledgers into `lake` (a RabbitMQ system has no broker store to read), as rows
    of `cluster` (default: the data dir's, see cluster_of); the rows new or changed per
    table."""
    apply_sql_conf(spark)
    io, root = DeltaIO(spark), str(Path(lake).resolve())
    for name in ("message_stub", "message_log"):
        io.ensure_table(table_path(root, name), TABLES[name].schema)
    where = Path(data_dir) if data_dir else None
    sources = ledger_sources(where, ledger_url)
    name = cluster_of(where, cluster) if where else validate_group(cluster or DEFAULT_CLUSTER)
    return merge_ledgers(spark, io, root, sources, name, reporter("ingest", progress))
