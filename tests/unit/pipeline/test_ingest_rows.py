"""messages rows made in the workers: the derived columns follow Spark's own rules."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline.readers.message_rows import spark_int, store_dates

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
