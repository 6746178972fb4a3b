"""One local Spark session for every pipeline test in a pytest session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pipeline.spark_session import build_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Tiny frames: two shuffle partitions instead of eight near-empty tasks per stage.
    session = build_spark(
        "mqaudit-pipeline-tests",
        conf={
            "spark.sql.shuffle.partitions": "1",
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.codegen.wholeStage": "false",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
