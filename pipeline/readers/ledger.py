"""The producer and consumer ledgers (SQLite files or PostgreSQL) -> Arrow batches.

Tables are reflected by name and their columns selected by the names of the pipeline's
schema, so this reader depends on the shared table contract only, not on the writer's code.
Rows are streamed in chunks (server-side cursor where the driver has one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType
from sqlalchemy import MetaData, Table, create_engine, inspect, literal, select

from pipeline.schemas import LEDGER_DEFAULTS, arrow_schema

CHUNK_ROWS = 50_000


class LedgerError(RuntimeError):
    """A ledger table exists but lacks columns of the contract."""


def read_table(url: str, table: str, schema: StructType, cluster: str) -> Iterator[pa.RecordBatch]:
    """Batches of `table` with `schema`'s columns, `cluster` (the ledger's cluster, not a
    ledger column) in each row; nothing if the table does not exist."""
    engine = create_engine(url)
    target = arrow_schema(schema)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(table):
                return
            t = Table(table, MetaData(), autoload_with=conn)
            given = {**LEDGER_DEFAULTS, "cluster": cluster}
            missing = [f.name for f in schema.fields if f.name not in t.c and f.name not in given]
            if missing:
                raise LedgerError(f"{table} in {engine.url!r} has no column(s) {missing}")
            # A ledger older than the added columns: their defaults in their place.
            picked: list[Any] = [
                t.c[f.name]  # the lake's cluster wins over a ledger's own column
                if f.name in t.c and f.name != "cluster"
                else literal(given[f.name]).label(f.name)
                for f in schema.fields
            ]
            query = select(*picked).order_by(*[t.c[c.name] for c in t.primary_key.columns])
            result = conn.execution_options(stream_results=True, yield_per=CHUNK_ROWS).execute(
                query
            )
            for rows in result.partitions():
                columns = list(zip(*rows, strict=True)) if rows else []
                arrays = [
                    pa.array(list(col), type=field.type)
                    for col, field in zip(columns, target, strict=True)
                ]
                yield pa.RecordBatch.from_arrays(arrays, schema=target)
    finally:
        engine.dispose()
