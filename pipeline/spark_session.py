"""One way to get a Spark session for the pipeline: UTC, this interpreter for the workers,
quiet logs, and the SQL settings the transforms rely on."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"

# Settings the pipeline's transforms rely on, applied to any session it is handed.
SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # str_to_map on properties: a repeated key keeps the last value instead of failing.
    "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Partitioned writes keep a writer per partition open instead of sorting each task's
    # rows by partition first (a sort of every 1 KiB body).
    "spark.sql.maxConcurrentOutputFileWriters": "64",
}


def build_spark(
    app: str = "mqaudit", master: str | None = None, conf: dict[str, str] | None = None
) -> SparkSession:
    """Get or create the session; `master` defaults to $SPARK_MASTER or local[2]."""
    # Workers must run this interpreter (the one with the package and pyarrow installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .master(master or os.environ.get("SPARK_MASTER", DEFAULT_MASTER))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
    )
    for key, value in {**SQL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    with _child_stdout_to_stderr():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    apply_sql_conf(spark)
    return spark


@contextmanager
def _child_stdout_to_stderr() -> Iterator[None]:
    """The JVM (and the Python workers it starts) inherit stderr as their stdout, so that
    log lines never mix with what a command prints on stdout (JSON)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def apply_sql_conf(spark: SparkSession) -> None:
    """Make a session handed in from outside (Airflow, a notebook) behave as ours."""
    for key, value in SQL_CONF.items():
        spark.conf.set(key, value)
