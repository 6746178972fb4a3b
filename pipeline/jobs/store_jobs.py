"""The Spark side of reading store files: one Spark task per CommitLog range or per group of
ConsumeQueue files, decoded in the Python workers and appended to Delta from there
(DeltaIO.append_generated: on the embedded backend the workers write the data files).

What a range found besides its messages (damaged ranges, where its walk ended) comes back
through an accumulator keyed by range, so a retried task cannot count twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.accumulators import Accumulator, AccumulatorParam

from pipeline import schemas
from pipeline.delta_io import DeltaIO
from pipeline.jobs.ingest_state import TXN_APP
from pipeline.lake import TABLES
from pipeline.readers.commitlog import RangeTask, read_range, summary
from pipeline.readers.message_rows import to_messages
from pipeline.readers.segments import WalkResult
from pipeline.readers.store_files import CqFile, read_cq_file
from pipeline.spark_tasks import run_tasks
from pipeline.transforms.transactions import count_units

Summaries = dict[str, dict[str, Any]]


class ByKey(AccumulatorParam[Summaries]):
    """Range summaries by range id (a retried task replaces, never adds)."""

    def zero(self, value: Summaries) -> Summaries:
        return {}

    def addInPlace(self, value1: Summaries, value2: Summaries) -> Summaries:
        value1.update(value2)
        return value1


def ingest_log(
    io: DeltaIO, tasks: list[RangeTask], path: str, run: int, acc: Accumulator[Summaries]
) -> int:
    """Append the `messages` rows of every range to the table at `path` in one commit (or
    none, -1, when the table has the run's txn: then the ranges are only walked); returns the
    rows added. Each range's summary (with its `transaction_units`) goes to `acc` (a ByKey
    accumulator) as it finishes."""

    def produce(row: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        task, result, units = RangeTask(**row), WalkResult(), 0
        for raw in read_range(task, result):
            batch = to_messages(raw, run, task.cluster)
            units += count_units(batch)
            yield batch
        acc.add({task.range_id: {**summary(task, result), "transaction_units": units}})

    rows = [t.as_row() for t in tasks]
    txn = (TXN_APP, run)
    n = io.append_generated(
        rows, produce, path, schemas.MESSAGES, TABLES["messages"].partitions, txn
    )
    if n < 0:  # a resumed run whose messages are in: walk again for the summaries

        def walk(part: Iterable[dict[str, Any]]) -> list[None]:
            for row in part:
                for _ in produce(row):
                    pass
            return []

        run_tasks(io.spark, rows, walk)
    return n


def ingest_consume_queues(io: DeltaIO, files: list[CqFile], path: str, run: int) -> int:
    """Append the `consume_queue` rows of the files' entries in one commit (-1: the table has
    the run's txn); files are spread over a few tasks."""

    def produce(row: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        out = read_cq_file(CqFile(**row), run)
        if out.num_rows:
            yield out

    slices = 4 * io.spark.sparkContext.defaultParallelism
    return io.append_generated(
        [f.as_row() for f in files],
        produce,
        path,
        schemas.CONSUME_QUEUE,
        TABLES["consume_queue"].partitions,
        (TXN_APP, run),
        slices,
    )
