"""The Spark side of reading store files: one task per CommitLog range or per group of
ConsumeQueue files, decoded in the Python workers with `mapInArrow`.

What a range found besides its messages (damaged ranges, where its walk ended) comes back
through an accumulator keyed by range, so a retried task cannot count twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession

from pipeline.readers.commitlog import RangeTask, read_range, summary
from pipeline.readers.segments import WalkResult
from pipeline.readers.store_files import CqFile, read_cq_file
from pipeline.schemas import CONSUME_QUEUE, RAW_MESSAGE, struct_of

Summaries = dict[str, dict[str, Any]]

RANGE_TASK = struct_of(
    "broker:str, broker_id:int, path:str, file_from:long, start:long, stop:long, exact:bool,"
    " last_segment:bool, data_end:long"
)
CQ_TASK = struct_of(
    "broker:str, broker_id:int, topic:str, queue_id:int, path:str, lo:long, hi:long"
)


class _ByKey(AccumulatorParam[Summaries]):
    def zero(self, value: Summaries) -> Summaries:
        return {}

    def addInPlace(self, value1: Summaries, value2: Summaries) -> Summaries:
        value1.update(value2)
        return value1


def read_log(
    spark: SparkSession, tasks: list[RangeTask]
) -> tuple[DataFrame, Accumulator[Summaries]]:
    """RAW_MESSAGE rows of every range (lazy), and the accumulator their summaries go to."""
    acc = spark.sparkContext.accumulator({}, _ByKey())

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                task = RangeTask(**row)
                result = WalkResult()
                yield from read_range(task, result)
                acc.add({task.range_id: summary(task, result)})

    rows = [t.as_row() for t in tasks]
    rdd = spark.sparkContext.parallelize(rows, max(1, len(rows)))
    return spark.createDataFrame(rdd, RANGE_TASK).mapInArrow(parse, RAW_MESSAGE), acc


def read_consume_queues(spark: SparkSession, files: list[CqFile], run: int) -> DataFrame:
    """CONSUME_QUEUE rows of the files' entries (lazy); files are spread over a few tasks."""

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                out = read_cq_file(CqFile(**row), run)
                if out.num_rows:
                    yield out

    rows = [f.as_row() for f in files]
    slices = max(1, min(len(rows), 4 * spark.sparkContext.defaultParallelism))
    rdd = spark.sparkContext.parallelize(rows, slices)
    return spark.createDataFrame(rdd, CQ_TASK).mapInArrow(parse, CONSUME_QUEUE)
