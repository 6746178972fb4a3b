"""One local Spark session for every pipeline test (it takes seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipeline.spark_session import SMALL_DATA_SPARK, build_spark

    # The tests' tables are as small as the demo's.
    session = build_spark("mqaudit-tests", "local[2]", SMALL_DATA_SPARK)
    yield session
    session.stop()
