"""One local Spark session and one GX context per test session for the expectation tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from expectations.context import GateContext
from tests.conftest import local_spark

# A test session is a short-lived JVM running many small queries once each: the optimising JIT
# costs more CPU than it saves there (measured: half the JVM CPU time of the gate tests).
SHORT_JVM = {"spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN -XX:TieredStopAtLevel=1"}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Otherwise as tests/unit/pipeline's fixture: whichever starts first, the other gets the
    # same session back from getOrCreate.
    session = local_spark(conf=SHORT_JVM)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def docs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data_docs")


@pytest.fixture(scope="session")
def gates(spark: SparkSession, docs_dir: Path) -> GateContext:
    """The run's one context, writing Data Docs (as the DAG's does)."""
    return GateContext(docs_dir)
