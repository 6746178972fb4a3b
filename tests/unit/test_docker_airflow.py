"""The compose file's Airflow, run here: its env (PostgreSQL through psycopg 3 for both the
sync and async engines, LocalExecutor, the simple auth manager's passwords file, the
execution API URL and JWT secret) and its commands, with the compose file's own health
checks; then a DAG run end to end through the scheduler, the dag-processor and the
api-server's execution API.

As in test_docker_services.py, only container-world names are rewritten for one host; the
DAG folder is a temporary one with a probe DAG (the product's DAGs are not there yet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.db_servers import free_port
from tests.unit.test_docker_files import DOCKER, REPO
from tests.unit.test_docker_services import (
    compose_doc,
    healthcheck_argv,
    processes_fixture,  # noqa: F401  (the `processes` fixture)
    psql_fixture,  # noqa: F401  (the `psql` fixture)
    rewrite,
    wait_healthy,
)

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.slow]

PROBE_DAG = """
from datetime import datetime

from airflow.sdk import dag, task


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def compose_probe():
    @task
    def settings():
        from airflow.sdk import Variable

        return {"lake": Variable.get("mqaudit_lake"), "spark": Variable.get("mqaudit_spark_master")}

    settings()


compose_probe()
"""
# The api-server's workers load every app before answering: a minute or more on 2 busy cores.
HEALTHY_WITHIN_S = 240.0


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("psql")
def test_airflow_init_and_components_come_up_healthy(
    tmp_path: Path, postgres_base_url: str, processes: Callable[..., Any]
) -> None:
    doc = compose_doc()
    services = doc["services"]
    base = make_url(postgres_base_url)
    pg_env = services["postgres"]["environment"]
    admin = {"host": base.host, "port": base.port, "user": "postgres", "dbname": "postgres"}
    api_port, health_port = free_port(), free_port()
    mapping = {
        "@postgres:5432/": f"@127.0.0.1:{base.port}/",
        "http://airflow-api-server:8080/": f"http://127.0.0.1:{api_port}/",
        "127.0.0.1:8080/": f"127.0.0.1:{api_port}/",
        "127.0.0.1:8974/": f"127.0.0.1:{health_port}/",
        "/opt/airflow": str(tmp_path / "airflow"),
        "/data/": f"{tmp_path}/data/",
        "/opt/mqaudit/": f"{REPO}/",
    }

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "compose_probe.py").write_text(PROBE_DAG)

    def env_of(name: str) -> dict[str, str]:
        env = {k: rewrite(str(v), mapping) for k, v in services[name]["environment"].items()}
        return {
            **os.environ,
            **env,
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(health_port),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "false",
        }

    try:
        done = subprocess.run(
            ["bash", str(DOCKER / "postgres" / "init-databases.sh")],
            env={**os.environ, **pg_env, "PGHOST": str(base.host), "PGPORT": str(base.port)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        init = services["airflow-init"]
        argv = [sys.executable, *(rewrite(w, mapping) for w in init["command"][1:])]
        done = subprocess.run(
            argv, env=env_of("airflow-init"), capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        passwords = tmp_path / "airflow" / "auth" / "passwords.json"
        assert json.loads(passwords.read_text()) == {"admin": "test-airflow_admin_password"}

        started = []
        for name in ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor"):
            cmd = [rewrite(w, mapping) for w in services[name]["command"]]
            if name == "airflow-api-server":
                cmd[cmd.index("--port") + 1] = str(api_port)
            argv = [sys.executable, "-m", "airflow", *cmd[1:]]
            started.append(processes(argv, tmp_path / f"{name}.log", env_of(name)))
        for name in ("airflow-api-server", "airflow-scheduler"):
            check = healthcheck_argv(services[name], mapping)
            wait_healthy(check, started, name, HEALTHY_WITHIN_S)
        airflow = make_url(
            rewrite(
                services["airflow-scheduler"]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
                mapping,
            )
        )
        db = {"host": airflow.host, "port": airflow.port, "user": airflow.username,
              "dbname": airflow.database, "autocommit": True}  # fmt: skip
        run_probe_dag(db, env_of("airflow-scheduler"), tmp_path)
        jobs_check = services["airflow-dag-processor"]["healthcheck"]["test"][1:]
        assert jobs_check[0] == "airflow"
        done = subprocess.run(
            [sys.executable, "-m", "airflow", *jobs_check[1:]],
            env=env_of("airflow-dag-processor"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]  # the dag-processor's health check
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            for db, role in (("airflow", "airflow"), ("mqaudit_ledger", "ledger")):
                conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
                conn.execute(f"DROP ROLE IF EXISTS {role}")


def sql_value(db: dict[str, Any], query: str, *args: object) -> Any:
    with psycopg.connect(**db) as conn:
        row = conn.execute(query, args).fetchone()
    return None if row is None else row[0]


def run_probe_dag(db: dict[str, Any], env: dict[str, str], tmp_path: Path) -> None:
    """Wait for the probe DAG to be parsed, trigger it, wait for its run to succeed."""
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while sql_value(db, "SELECT count(*) FROM dag WHERE dag_id = %s", "compose_probe") == 0:
        assert time.monotonic() < deadline, "the dag-processor never parsed the probe DAG"
        time.sleep(1)
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "trigger", "compose_probe"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    state = None
    while state not in ("success", "failed"):
        assert time.monotonic() < deadline, f"the probe run is still {state}"
        time.sleep(1)
        state = sql_value(db, "SELECT state FROM dag_run WHERE dag_id = %s", "compose_probe")
    logs = "\n".join(p.read_text() for p in (tmp_path / "airflow" / "logs").rglob("*.log"))
    assert state == "success", logs[-3000:]
    value = sql_value(
        db, "SELECT value FROM xcom WHERE dag_id = %s AND key = 'return_value'", "compose_probe"
    )
    parsed = json.loads(value) if isinstance(value, str) else value
    assert parsed == {"lake": f"{tmp_path}/data/lake", "spark": "spark://spark-master:7077"}
