"""Shared test set-up: markers are registered in pyproject.toml; helpers live here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from broker_runtime.common.config import StoreConfig

# Session-wide PostgreSQL and Redis servers (fixtures postgres_url, redis_url).
pytest_plugins = ["tests.db_servers"]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


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
# they overlap with the rest instead of running alone at the end.
LONGEST_FIRST = (
    "tests/integration/test_demo.py",
    "tests/integration/test_audit_truth.py",
    "tests/dags/test_dag_runs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file, and of the others, is kept


def mqaudit_cmd(*args: str) -> list[str]:
    """argv running the CLI with this interpreter (no reliance on PATH)."""
    return [PYTHON, "-m", "broker_runtime.cli.main", *args]


@pytest.fixture
def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env
