"""One local Spark session and one GX context per test session for the expectation tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from broker_runtime.common.constants import DEFAULT_CLUSTER
from expectations.context import GateContext
from pipeline.spark_session import build_spark

# A test session is a short-lived JVM running many small queries once each: the optimising JIT
# costs more CPU than it saves there (measured: half the JVM CPU time of the gate tests).
SHORT_JVM = {"spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN -XX:TieredStopAtLevel=1"}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Otherwise as tests/unit/pipeline's fixture: whichever starts first, the other gets the
    # same session back from getOrCreate.
    session = build_spark("mqaudit-tests", "local[2]", conf=SHORT_JVM)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def docs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data_docs")


@pytest.fixture(scope="session")
def gates(spark: SparkSession, docs_dir: Path) -> GateContext:
    """The run's one context, writing Data Docs (as the DAG's does)."""
    return GateContext(docs_dir)


def frame(spark: SparkSession, schema: StructType, rows: list[dict[str, Any]]) -> DataFrame:
    """Rows given as dicts over `schema`; unnamed columns are null, but `cluster`: the
    default cluster's rows unless they name one."""
    names = set(schema.fieldNames())
    for row in rows:
        stray = set(row) - names
        assert not stray, f"columns not in the schema: {stray}"
    return spark.createDataFrame(
        [
            tuple({"cluster": DEFAULT_CLUSTER, **row}.get(f) for f in schema.fieldNames())
            for row in rows
        ],
        schema,
    )
