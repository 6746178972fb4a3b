"""Shared test set-up: markers are registered in pyproject.toml; helpers live here."""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from broker_runtime.common.config import StoreConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Session-wide PostgreSQL, Redis and RabbitMQ servers (postgres_url, redis_url, rabbit_node); a
# Spark standalone cluster per test module that asks for one (fixture spark_cluster).
pytest_plugins = ["tests.db_servers", "tests.rabbitmq", "tests.spark_cluster"]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# The tests' Delta backend: the embedded one (delta-rs), forced here for every test and every
# process a test starts, except in the test files marked `native_delta`, which run with the
# product's default (the native delta-spark backend where its jars load: tests of both
# backends, on each other's tables, the Spark cluster, spark-submit DAG runs and a native
# pipeline run). `make test-native` runs every test on the native backend (README.md, "Two
# commands").
DELTA_BACKEND = os.environ.setdefault("MQAUDIT_DELTA_BACKEND", "embedded")

# Every JVM the tests start compiles with C1 only: on their small inputs C2's compiling was
# most of their CPU (README.md, "Two commands", has the figures). An empty JAVA_TOOL_OPTIONS
# in the environment keeps the JVM's default tiers.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


@pytest.fixture
def small_config(tmp_path: Path) -> StoreConfig:
    """A store with tiny files so that rolls, blanks and multi-file paths happen in tests."""
    return StoreConfig(
        store_dir=tmp_path / "store",
        segment_size=64 * 1024,
        cq_entries_per_file=64,
        index_hash_slots=128,
        index_max_entries=512,
        flush_interval_ms=50,
        cq_flush_interval_ms=50,
    )


# The longest test files (minutes each) start first, so that under `make test`'s two workers
# they overlap with the rest instead of running alone at the end. The interop files come
# right after the first: they mostly wait (on Apache RocketMQ's JVMs, its clients' and
# brokers' timers), so one worker runs them beside the Spark cluster's file, which keeps both
# cores busy on its own, rather than both workers waiting on them later.
FIRST = (
    "tests/dags/test_spark_cluster.py",
    "tests/interop/",
    "tests/integration/test_demo.py",
    "tests/dags/test_scheduler.py",
    "tests/integration/test_audit_truth.py",
    "tests/dags/test_dag_runs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, p in enumerate(FIRST) if path.startswith(p)), len(FIRST))

    items.sort(key=rank)  # stable: the order within a file, and of the others, is kept


@pytest.fixture(scope="module", autouse=True)
def delta_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The Delta backend of this test file: the product's default in files marked
    `native_delta`, else the suite's (MQAUDIT_DELTA_BACKEND, embedded unless set)."""
    with pytest.MonkeyPatch.context() as mp:
        if request.node.get_closest_marker("native_delta") is not None:
            mp.delenv("MQAUDIT_DELTA_BACKEND", raising=False)
        yield os.environ.get("MQAUDIT_DELTA_BACKEND", "default")


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.fixture(autouse=True)
def collect_a_failed_tests_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails half way leaves what it opened (clients, their sockets) alive in its
    traceback, which pytest keeps in `sys.last_traceback` until the next test's call begins;
    then they are garbage, and the next test to collect garbage (Hypothesis does, as it
    starts) fails for their ResourceWarnings. So as a failed test ends, its traceback is let
    go here and its leftovers collected with those warnings ignored: the failure is reported
    already. Passing tests get no such help: their leaks stay errors."""
    yield
    if request.node.stash.get(_FAILED, False):
        for name in ("last_type", "last_value", "last_traceback"):
            if hasattr(sys, name):
                delattr(sys, name)
        collect_garbage_quietly()


def collect_garbage_quietly() -> None:
    """Collect garbage with ResourceWarnings ignored: leftovers whose test already ended."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def local_spark(app: str = "mqaudit-tests", conf: Mapping[str, str] | None = None) -> SparkSession:
    """The tests' in-process Spark session (getOrCreate: one per process), local[2] with the
    settings for small inputs (pipeline.spark_session.SMALL_DATA_SPARK): the tests' tables
    are as small as the demo's. `conf`: more settings."""
    from pipeline.spark_session import SMALL_DATA_SPARK, build_spark

    return build_spark(app, "local[2]", {**SMALL_DATA_SPARK, **(conf or {})})


def mqaudit_cmd(*args: str) -> list[str]:
    """argv running the CLI with this interpreter (no reliance on PATH)."""
    return [PYTHON, "-m", "broker_runtime.cli.main", *args]


@pytest.fixture
def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env
