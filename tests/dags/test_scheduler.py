"""The DAGs as users meet them: scheduled and triggered runs under a real Airflow.

`mqaudit airflow up` starts Airflow's scheduler (LocalExecutor), dag-processor, triggerer
and api-server on 127.0.0.1 with its metadata on the tests' PostgreSQL. Nothing here calls
`dag.test()`: the DAG processor parses the files, the scheduler makes the runs, the
executor starts the tasks, and they run through the task-execution API. mq_audit (every
minute here) is unpaused and the scheduler runs an interval that ends after the test's
traffic on its own; then mq_dlq_replay is triggered with params, as a person would, and
replays the dead letters that audit found. `mqaudit airflow down` stops it all by pid.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from pipeline.spark_session import SMALL_DATA_SPARK
from tests.conftest import mqaudit_cmd
from tests.dags.conftest import AIRFLOW_WARNINGS
from tests.dags.traffic import make_dead_letters, replays_on_broker, send_messages
from tests.integration.cluster_fixtures import Cluster, running_cluster

# About 4 minutes on an idle 2-core machine (Airflow's four services start, each task starts
# its own Spark); about 3 times that at a load of 20.
pytestmark = [
    pytest.mark.airflow,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    *AIRFLOW_WARNINGS,
]
GROUP, TOPIC = "pay-consumer", "orders"
RUN_TIMEOUT_S = 900.0  # a run at a load of 20: ~8 min


class Airflow:
    """A running `mqaudit airflow up` deployment: its CLI and its metadata database."""

    def __init__(self, home: Path, db_url: str) -> None:
        self.home = home
        url = make_url(db_url)
        self.db = {
            "host": url.host,
            "port": url.port,
            "user": url.username,
            "dbname": url.database,
            "autocommit": True,
        }
        env = {}
        for line in (home / "airflow.env").read_text().splitlines():
            name, _, value = line.partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        self.env = {**os.environ, **env}

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=180,
        )
        assert out.returncode == 0, f"airflow {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def pause(self, dag_id: str) -> None:
        """Pause a DAG through the api-server's REST API, as the UI's toggle does: at once,
        where the command line first spends seconds importing Airflow."""
        request = urllib.request.Request(
            f"{self.env['AIRFLOW__API__BASE_URL']}/api/v2/dags/{dag_id}",
            data=json.dumps({"is_paused": True}).encode(),
            headers={"Content-Type": "application/json"},
            method="PATCH",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["is_paused"] is True

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(**self.db) as conn:
            return conn.execute(sql, params).fetchall()

    def wait_for(self, what: str, check: Any, timeout_s: float = RUN_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.5)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted((self.home / "logs").glob("*.log"))
        )
        raise AssertionError(f"{what}: not within {timeout_s} s\n{logs}")

    def finished_run(self, dag_id: str, run_type: str) -> tuple[str, str] | None:
        """(run_id, state) of the DAG's first run of `run_type` once it finished."""
        rows = self.query(
            "SELECT run_id, state FROM dag_run WHERE dag_id = %s AND run_type = %s"
            " ORDER BY id LIMIT 1",
            dag_id,
            run_type,
        )
        return rows[0] if rows and rows[0][1] in ("success", "failed") else None

    def next_interval_end(self, dag_id: str) -> float | None:
        """The end (epoch seconds) of the data interval of the DAG's next scheduled run as the
        dag-processor last computed it: None before it parsed the DAG, -inf for a DAG
        without a schedule."""
        rows = self.query("SELECT next_dagrun_data_interval_end FROM dag WHERE dag_id = %s", dag_id)
        if not rows:
            return None
        return rows[0][0].timestamp() if rows[0][0] is not None else float("-inf")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        """Each task's state; prints where the run's time went (queued, then running)."""
        rows = self.query(
            "SELECT task_id, state, queued_dttm, start_date, end_date FROM task_instance"
            " WHERE dag_id = %s AND run_id = %s ORDER BY start_date",
            dag_id,
            run_id,
        )
        for task, state, queued, start, end in rows:
            waited = (start - queued).total_seconds() if start and queued else None
            ran = (end - start).total_seconds() if end and start else None
            print(f"{dag_id}.{task}: {state}, queued {waited} s, ran {ran} s")
        return {t: s for t, s, *_ in rows}


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Cluster, list[str], Path, float]]:
    """The cluster with its traffic sent, the dead letters' ids, the test's folder and when
    the traffic ended (epoch seconds)."""
    data = tmp_path / "cluster"
    with running_cluster(data, groups=("broker-a",), slaves=False, name_servers=1) as cluster:
        send_messages(cluster.namesrv_addr, TOPIC, 5)
        dead = make_dead_letters(cluster.namesrv_addr, GROUP, TOPIC, 3)
        yield cluster, dead, tmp_path, time.time()


@pytest.fixture
def airflow(site: tuple[Cluster, list[str], Path, float], postgres_url: str) -> Iterator[Airflow]:
    _, _, root, _ = site
    home = root / "airflow"
    argv = mqaudit_cmd(
        "airflow", "up", "--home", str(home), "--db-url", postgres_url,
        "--data-dir", str(root / "cluster"), "--lake", str(root / "lake"),
        "--reports", str(root / "reports"), "--var", "mqaudit_audit_every_minutes=1",
        "--var", f"mqaudit_spark_conf={json.dumps(SMALL_DATA_SPARK)}",
    )  # fmt: skip
    up = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    try:
        assert up.returncode == 0, up.stderr[-5000:]
        state = json.loads(up.stdout)
        assert set(state["pids"]) == {"scheduler", "dag-processor", "triggerer", "api-server"}
        yield Airflow(home, postgres_url)
    finally:
        down = subprocess.run(
            mqaudit_cmd("airflow", "down", "--home", str(home)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert down.returncode == 0 or not (home / "deployment.json").exists(), down.stderr


def test_the_scheduler_runs_an_audit_interval_and_a_triggered_replay(
    site: tuple[Cluster, list[str], Path, float], airflow: Airflow
) -> None:
    cluster, dead, root, traffic_done = site
    reports = root / "reports"
    # The interval the scheduler picks must end after the traffic. It is the one the
    # dag-processor last computed (dag.next_dagrun_data_interval_end, the latest minute's
    # start when it parsed the file): unpaused once that is after the traffic, which it
    # usually is already, since `airflow up` took longer than the rest of that minute.
    airflow.wait_for(
        "both DAGs parsed, mq_audit's next interval ending after the traffic",
        lambda: (
            (airflow.next_interval_end("mq_audit") or 0) > traffic_done
            and airflow.next_interval_end("mq_dlq_replay") is not None
        ),
        timeout_s=120,
    )
    # One command for both (a paused DAG's triggered runs wait; mq_dlq_replay has no schedule).
    airflow.cli("dags", "unpause", "--treat-dag-id-as-regex", "-y", "^mq_(audit|dlq_replay)$")
    run_id, state = airflow.wait_for(
        "a scheduled mq_audit run", lambda: airflow.finished_run("mq_audit", "scheduled")
    )
    # One interval is enough: paused before the scheduler starts the next minute's (it would
    # run beside the replay).
    airflow.pause("mq_audit")
    tasks = airflow.task_states("mq_audit", run_id)
    assert state == "success", tasks
    assert tasks == {t: "success" for t in ("ingest", "validate", "audit", "report")}
    summary = json.loads(
        Path(json.loads((reports / "mq_audit" / "latest.json").read_text())["summary"]).read_text()
    )
    assert summary["audit"]["tables"]["audit_dead_letters"]["rows"] == 3
    assert Path(summary["report"]["html"]).is_file()
    assert (reports / "data-docs" / "index.html").is_file()

    conf = {"group": GROUP, "from_time": 0, "dry_run": False, "messages_per_second": 100}
    airflow.cli("dags", "trigger", "mq_dlq_replay", "--conf", json.dumps(conf))
    run_id, state = airflow.wait_for(
        "the triggered mq_dlq_replay run", lambda: airflow.finished_run("mq_dlq_replay", "manual")
    )
    tasks = airflow.task_states("mq_dlq_replay", run_id)
    assert state == "success", tasks
    replay = json.loads(
        Path(
            json.loads((reports / "mq_dlq_replay" / "latest.json").read_text())["summary"]
        ).read_text()
    )
    assert replay["by_status"] == {"sent": 3}
    assert replay["request"]["dry_run"] is False
    assert all(len(replays_on_broker(cluster.namesrv_addr, TOPIC, m)) == 1 for m in dead)
    runs = airflow.query("SELECT run_id, state FROM dag_run WHERE dag_id = 'mq_audit'")
    print(f"mq_audit runs: {runs}")  # a second one: the scheduler made it before the pause
