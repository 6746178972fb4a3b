"""Per-task Python code run in Spark's Python workers: the tasks are small dicts (a log range,
a list of files), the work is reading store files there instead of on the driver."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

# Makes one task's batches in a worker: see DeltaIO.append_generated.
Producer = Callable[[dict[str, Any]], Iterator[pa.RecordBatch]]


def run_tasks(
    spark: SparkSession,
    tasks: Sequence[dict[str, Any]],
    fn: Callable[[Iterable[dict[str, Any]]], list[Any]],
    slices: int | None = None,
) -> list[Any]:
    """What `fn` returns for each slice of the tasks, run in the Python workers (`slices`
    Spark tasks, default one per task). A plain RDD job: no query to plan or compile, which
    on a fresh JVM costs more than the job itself."""
    n = max(1, min(len(tasks), slices or len(tasks)))

    def run(part: Iterable[dict[str, Any]]) -> list[Any]:
        _freeze_old_objects()
        return fn(part)

    return spark.sparkContext.parallelize(list(tasks), n).mapPartitions(run).collect()


_frozen = False


def _freeze_old_objects() -> None:
    """Once per worker process: leave what is there (pyspark, pyarrow, pandas, the closures)
    out of the garbage collector's full passes. A worker's task makes objects at a rate that
    triggers them often, and each walked every module object: a fifth of the task's CPU."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True
