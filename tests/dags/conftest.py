"""Airflow for the DAG tests: one AIRFLOW_HOME with a migrated SQLite db per test session.

Airflow reads its settings when first imported, so they are set here, at collection, for a
temporary folder made (and removed) by the session's first DAG test; nothing but Airflow
reads these variables.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, collect_garbage_quietly

DAGS = REPO / "dags"
HOME = Path(tempfile.gettempdir()) / f"mqaudit-airflow-tests-{os.getpid()}"
os.environ["AIRFLOW_HOME"] = str(HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{HOME / 'airflow.db'}"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

# Airflow's own imports warn about things that are Airflow's to change.
AIRFLOW_WARNINGS = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(autouse=True)
def collect_airflow_leftovers() -> Iterator[None]:
    """After each DAG test, collect the garbage Airflow's in-process runs leave in reference
    cycles (unclosed files among it) while its ResourceWarnings are still ignored; otherwise
    a later test's garbage collection would be blamed for them."""
    yield
    collect_garbage_quietly()


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[Path]:
    """`airflow db migrate` once for the session (the DAG runs record into it)."""
    HOME.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        capture_output=True,
        text=True,
        timeout=280,
        env=dict(os.environ),
    )
    if out.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    yield HOME
    shutil.rmtree(HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def dagbag(airflow_db: Path) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@pytest.fixture
def variables(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set Airflow Variables for one test as env AIRFLOW_VAR_* (the tasks read them)."""

    def set_vars(**values: object) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"AIRFLOW_VAR_{name.upper()}", str(value))

    yield set_vars
