"""Buffered appends of outcome rows to a Delta table, through pipeline.delta_io.

A Delta commit costs a Spark job, so rows are flushed every `every_rows` rows or
`every_s` seconds and when the block ends, errors included. What a crash loses is at most
one buffer; the jobs reconcile such gaps against the broker.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from pipeline.delta_io import DeltaIO


class OutcomeLog:
    def __init__(
        self,
        spark: SparkSession,
        io: DeltaIO,
        path: str,
        schema: StructType,
        *,
        every_rows: int = 50,
        every_s: float = 5.0,
    ) -> None:
        self.spark = spark
        self.io = io
        self.path = path
        self.schema = schema
        self.every_rows = every_rows
        self.every_s = every_s
        self.written = 0
        self._rows: list[dict[str, Any]] = []
        self._last = time.monotonic()

    def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.every_rows or time.monotonic() - self._last >= self.every_s:
            self.flush()

    def extend(self, rows: list[dict[str, Any]]) -> None:
        """Add rows and commit them at once (e.g. a plan: all of it or nothing)."""
        self._rows.extend(rows)
        self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        df = self.spark.createDataFrame(rows, self.schema)
        self.written += max(self.io.append(df, self.path, self.schema), 0)

    def __enter__(self) -> OutcomeLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.flush()
