"""mq_audit on a real Spark standalone cluster (a master and two workers started by the
test): with mqaudit_spark_submit=true, `dag.test()` runs each Spark step as a
SparkSubmitOperator application on that master, with executors on both workers and the C
reader loaded in them; the lake it writes is the lake `mqaudit pipeline run` writes on
`local[2]` from the same data at the same audit time (run meanwhile, in this process: the
DAG's run spends much of its time waiting on its applications' JVMs)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from structlog.testing import capture_logs

from pipeline.delta_io import DeltaIO, table_exists
from pipeline.lake import AUDIT_TABLES, INGESTED_TABLES, table_path
from pipeline.run import run_pipeline
from pipeline.steps import RunInputs
from tests.conftest import local_spark
from tests.dags.conftest import AIRFLOW_WARNINGS, DAGS
from tests.integration.audit_data import build_data_dir
from tests.spark_cluster import SparkCluster

# A cluster to start, four applications submitted to it and a run beside them.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_delta,
    pytest.mark.integration,
    pytest.mark.airflow,
    pytest.mark.timeout(1800),
    *AIRFLOW_WARNINGS,
]
WHEN = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)  # after the DAG's start date; the audit time
STEPS = ["mqaudit-audit", "mqaudit-ingest", "mqaudit-report", "mqaudit-validate"]
VOLATILE = {"created_at"}  # the ingest checkpoint's wall clock


@dataclass
class Runs:
    state: str  # the DAG run's
    tasks: dict[str, Any]  # task id -> state
    interval_end: dt.datetime
    apps: list[dict[str, Any]]  # the master's completed applications of the DAG run
    ingested: dict[str, Any]  # what the submitted ingest step printed
    lake: Path  # the DAG run's
    reports: Path
    local: dict[str, Any]  # `pipeline run`'s summary on local[2]
    local_lake: Path


def _printed(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON objects the submitted steps printed, from the log events SparkSubmitHook
    made of their output (one per line; the steps print indented JSON)."""
    objects, lines = [], list[str]()
    for event in (str(e.get("event")) for e in logs):
        if event == "{" or lines:
            lines.append(event)
        if lines and event.startswith("}"):
            with contextlib.suppress(json.JSONDecodeError):  # a nested object's end
                objects.append(json.loads("\n".join(lines)))
                lines = []
    return objects


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return local_spark()  # the others' session


@pytest.fixture(scope="module")
def runs(
    spark: SparkSession,
    spark_cluster: SparkCluster,
    airflow_db: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Runs:
    from airflow.api.common.delete_dag import delete_dag
    from airflow.dag_processing.dagbag import DagBag

    root = tmp_path_factory.mktemp("cluster-run")
    data_dir = build_data_dir(root)
    lake, reports = root / "lake", root / "reports"
    local = RunInputs(
        lake=root / "local" / "lake",
        data_dirs=(data_dir,),
        out=root / "local" / "out",
        as_of_ms=int(WHEN.timestamp() * 1000),
        progress=False,
    )
    host, port = spark_cluster.url.rsplit(":", 1)
    conn = {"conn_type": "spark", "host": host, "port": int(port)}
    values = {
        "AIRFLOW_VAR_MQAUDIT_SPARK_SUBMIT": "true",
        "AIRFLOW_VAR_MQAUDIT_DATA_DIR": str(data_dir),
        "AIRFLOW_VAR_MQAUDIT_LAKE": str(lake),
        "AIRFLOW_VAR_MQAUDIT_REPORTS": str(reports),
        "AIRFLOW_CONN_MQAUDIT_SPARK": json.dumps(conn | {"extra": {"deploy-mode": "client"}}),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **spark_cluster.client_env(),  # what the submitted drivers need
    }
    before = {a["id"] for a in spark_cluster.state()["completedapps"]}
    with pytest.MonkeyPatch.context() as env, ThreadPoolExecutor(1) as beside:
        for name, value in values.items():
            env.setenv(name, value)
        local_run = beside.submit(run_pipeline, local, spark)
        dag = DagBag(dag_folder=str(DAGS)).dags["mq_audit"]
        assert {type(t).__name__ for t in dag.tasks} == {"SparkSubmitOperator"}
        try:
            with capture_logs() as logs:
                run = dag.test(logical_date=WHEN)
            tasks = {ti.task_id: ti.state for ti in run.get_task_instances()}
        finally:
            # The worker's other DAG tests share its Airflow db and parse mq_audit with
            # other Variables: a second serialized version of it there fails their runs.
            delete_dag(dag.dag_id)
    return Runs(
        state=run.state,
        tasks=tasks,
        interval_end=run.data_interval_end,
        apps=spark_cluster.completed_apps(STEPS, before),
        ingested=next((o for o in _printed(logs) if "readers" in o), {}),
        lake=lake,
        reports=reports,
        local=local_run.result(),
        local_lake=local.lake,
    )


def test_mq_audit_runs_each_step_as_an_application_on_the_cluster(
    spark_cluster: SparkCluster, runs: Runs
) -> None:
    assert runs.state == "success", runs.tasks
    assert sorted(a["name"] for a in runs.apps) == STEPS, runs.apps
    (report,) = (runs.reports / "mq_audit").glob("*/audit_report.html")
    assert "lost" in report.read_text()
    assert all(table_exists(table_path(runs.lake, t)) for t in AUDIT_TABLES)


def test_the_ingest_had_executors_on_both_workers_with_the_c_reader(
    spark_cluster: SparkCluster, runs: Runs
) -> None:
    assert runs.ingested["backend"] == "native", runs.ingested
    assert runs.ingested["readers"] == ["c"]  # every range was decoded by the C kernel
    workers = {w["id"] for w in spark_cluster.state()["workers"]}
    by_step = {a["name"]: spark_cluster.executors(a["id"]) for a in runs.apps}
    assert set(by_step["mqaudit-ingest"]) == workers, by_step  # each worker read ranges
    assert all(by_step.values()), by_step  # each step's executors ran on the workers
    print(f"executors by step and worker: {by_step}")


def _rows(spark: SparkSession, lake: Path, name: str, schema: Any) -> list[tuple[Any, ...]]:
    names = [f.name for f in schema.fields if f.name not in VOLATILE]
    df = DeltaIO(spark).read(table_path(lake, name), schema).select(*names)
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_the_cluster_gives_the_same_lake_as_local(spark: SparkSession, runs: Runs) -> None:
    assert runs.interval_end == WHEN  # the DAG's audit time is the local run's
    assert runs.local["ok"] and runs.local["ingested_messages"] == runs.ingested["messages"]
    assert runs.local["appended"] == runs.ingested["appended"]
    assert runs.ingested["messages"] > 0
    for name, schema in {**INGESTED_TABLES, **AUDIT_TABLES}.items():
        assert _rows(spark, runs.local_lake, name, schema) == _rows(
            spark, runs.lake, name, schema
        ), name
