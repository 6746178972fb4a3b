"""One local Spark session for every pipeline test (it takes seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from tests.conftest import local_spark

    session = local_spark()
    yield session
    session.stop()
