"""The producer and consumer ledgers into the lake: `message_stub` and `message_log`, each
read in Arrow batches (SQLite file or a database URL), staged as parquet (a file per
cluster) and merged by the table's key (a row the ledger changed since replaces the
lake's). Part of every ingest, and alone for a system with no broker store to read
(RabbitMQ)."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.common.progress import reporter
from broker_runtime.common.topics import validate_group
from pipeline import schemas
from pipeline.delta_io import DeltaIO
from pipeline.jobs.ingest_sources import Ledgers
from pipeline.lake import TABLES, table_path
from pipeline.readers.layout import cluster_of, ledger_sources
from pipeline.readers.ledger import read_table
from pipeline.spark_session import apply_sql_conf


def merge_ledgers(
    spark: SparkSession,
    io: DeltaIO,
    lake: str,
    ledgers: Sequence[Ledgers],
    say: Callable[[str], None],
) -> dict[str, int]:
    """Merge the ledgers of every cluster in `ledgers` into each ledger table, one merge per
    table (rows of other clusters stay as they are); the rows new or changed per table.
    One merge of all clusters' rows rather than one per cluster: a merge is several Spark
    jobs and a commit whatever its size, and the clusters' keys never meet."""
    appended: dict[str, int] = {}
    for name, schema in (
        ("message_stub", schemas.MESSAGE_STUB),
        ("message_log", schemas.MESSAGE_LOG),
    ):
        stage = Path(lake) / "_ingest_tmp" / f"{name}-{uuid.uuid4().hex}"
        stage.mkdir(parents=True, exist_ok=True)
        try:
            staged = [x.cluster for x in ledgers if _stage(x, name, schema, stage)]
            if not staged:
                continue
            df = spark.read.schema(schema).parquet(str(stage))
            n = io.merge_upsert(df, table_path(lake, name), schema, TABLES[name].key)
            appended[name] = n
            say(f"{name} ({', '.join(staged)}): {max(n, 0):,} new or changed rows")
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            with contextlib.suppress(OSError):  # another run's stage may be in it
                stage.parent.rmdir()
    return appended


def _stage(ledgers: Ledgers, name: str, schema: StructType, stage: Path) -> bool:
    """`name`'s rows of one cluster's ledger as a parquet file in `stage`; whether any."""
    url = getattr(ledgers.sources, name)
    if url is None:
        return False
    writer = None
    try:
        for batch in read_table(url, name, schema, ledgers.cluster):
            writer = writer or pq.ParquetWriter(stage / f"{ledgers.cluster}.parquet", batch.schema)
            writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()
    return writer is not None


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
    name = cluster_of(where, cluster) if where else validate_group(cluster or DEFAULT_CLUSTER)
    ledgers = Ledgers(name, ledger_sources(where, ledger_url))
    return merge_ledgers(spark, io, root, [ledgers], reporter("ingest", progress))
