"""One local Spark session for every pipeline test (it takes seconds to start), and a DeltaIO
of each backend on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession

if TYPE_CHECKING:
    from pipeline.delta_io import DeltaIO


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from tests.conftest import local_spark

    session = local_spark()
    yield session
    session.stop()


@pytest.fixture(params=["native", "embedded"])
def io(request: pytest.FixtureRequest, spark: SparkSession) -> DeltaIO:
    """A DeltaIO of each backend on the session."""
    from pipeline.delta_io import DeltaIO

    return DeltaIO(spark, request.param)
