"""messages rows made in the workers: the derived columns follow Spark's own rules."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline import schemas
from pipeline.readers.commitlog import Broker, plan_log, read_range
from pipeline.readers.message_rows import spark_int, store_dates, to_messages
from pipeline.readers.segments import WalkResult
from pipeline.transforms.messages import to_messages as spark_messages
from tests.unit.pipeline.stores import varied, write_store

ODD_INTS = [" 5 ", "+5", "-3", "5.7", "05", "2147483647", "2147483648", "-2147483648", "abc",
            "", "1e3", "\t7\n", "٣", "- 5", "0x10", "+", "5 5", None]  # fmt: skip


@pytest.mark.slow
def test_delay_levels_read_as_sparks_try_cast_reads_them(spark: SparkSession) -> None:
    df = spark.createDataFrame([(v,) for v in ODD_INTS], "s string")
    want = [r[0] for r in df.select(F.col("s").try_cast("int")).collect()]
    assert [spark_int(v) for v in ODD_INTS] == want


def test_store_date_is_the_utc_day_or_null_when_no_calendar_has_it() -> None:
    ts = pa.array([0, 86_399_999, 86_400_000, -1, 253_402_300_799_999, 253_402_300_800_000])
    got = [d.isoformat() if d else None for d in store_dates(ts).to_pylist()]
    assert got == ["1970-01-01", "1970-01-01", "1970-01-02", None, "9999-12-31", None]


@pytest.mark.slow
def test_rows_are_the_ones_the_spark_transform_derives(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The audit benchmark builds `messages` from RAW_MESSAGE rows with the Spark transform:
    both derivations must agree, field by field."""
    store = tmp_path_factory.mktemp("rows") / "store"
    write_store(store, varied(120))
    batches = [
        b
        for t in plan_log(Broker("b", 0, str(store)), 0).tasks
        for b in read_range(t, WalkResult())
    ]
    ours = pa.Table.from_batches([to_messages(b, 7, "c1") for b in batches]).to_pylist()
    raw = pa.Table.from_batches(batches).select(schemas.RAW_MESSAGE.fieldNames())
    theirs = spark_messages(spark.createDataFrame(raw, schemas.RAW_MESSAGE), 7, "c1").collect()
    assert len(ours) == len(theirs) == 120

    def plain(row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "properties": dict(row["properties"] or {})}

    by_offset = {r["phys_offset"]: plain(r.asDict()) for r in theirs}
    assert [plain(r) for r in ours] == [by_offset[r["phys_offset"]] for r in ours]
