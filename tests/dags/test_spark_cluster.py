"""mq_audit on a real Spark standalone cluster (a master and two workers started by the
test), both ways a deployment uses one: with mqaudit_spark_submit=true, `dag.test()` runs
each Spark step as a SparkSubmitOperator application on that master; `mqaudit pipeline run
--spark-master spark://...` (what in-process tasks do with mqaudit_spark_master) drives the
cluster from a session of its own. Their executors ran on both workers with the C reader
loaded, and both write the lake `pipeline run` writes on `local[2]` from the same data at
the same audit time. The three run side by side (the local one in this process): each
spends much of its time waiting on its JVMs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline.delta_io import DeltaIO, table_exists
from pipeline.lake import AUDIT_TABLES, INGESTED_TABLES, table_path
from pipeline.run import run_pipeline
from pipeline.steps import RunInputs
from tests.conftest import local_spark, mqaudit_cmd
from tests.dags.conftest import AIRFLOW_WARNINGS, DAGS
from tests.integration.audit_data import build_data_dir
from tests.spark_cluster import SparkCluster

# A cluster to start, four applications submitted to it and two runs beside them.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_delta,
    pytest.mark.integration,
    pytest.mark.airflow,
    pytest.mark.timeout(1800),
    *AIRFLOW_WARNINGS,
]
WHEN = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)  # after the DAG's start date
AS_OF = int(WHEN.timestamp() * 1000)  # the DAG run's audit time (its interval's end)
STEPS = ["mqaudit-audit", "mqaudit-ingest", "mqaudit-report", "mqaudit-validate"]
VOLATILE = {"created_at"}  # the ingest checkpoint's wall clock


@dataclass
class Runs:
    state: str  # the DAG run's
    tasks: dict[str, Any]  # task id -> state
    interval_end: dt.datetime
    apps: list[dict[str, Any]]  # the master's completed applications of the DAG run
    reports: Path  # the DAG run's
    summaries: dict[str, dict[str, Any]]  # `pipeline run`'s, "cluster" and "local"
    lakes: dict[str, Path]  # "dag", "cluster" and "local"


def _run_args(data_dir: Path, root: Path) -> list[str]:
    return [
        *("pipeline", "run", "--data-dir", str(data_dir), "--lake", str(root / "lake")),
        *("--out", str(root / "out"), "--as-of", str(AS_OF), "--quiet"),
    ]


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
        as_of_ms=AS_OF,
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
        **spark_cluster.client_env(),  # what the drivers on the cluster need
    }
    before = {a["id"] for a in spark_cluster.state()["completedapps"]}
    with (
        pytest.MonkeyPatch.context() as env,
        (root / "driver.out").open("w+") as out,
        (root / "driver.err").open("w+") as err,
    ):
        for name, value in values.items():
            env.setenv(name, value)
        argv = _run_args(data_dir, root / "cluster")
        cluster_run = subprocess.Popen(
            mqaudit_cmd(*argv, "--spark-master", spark_cluster.url),
            stdout=out,
            stderr=err,
            text=True,
        )
        try:
            with ThreadPoolExecutor(1) as beside:
                local_run = beside.submit(run_pipeline, local, spark)
                dag = DagBag(dag_folder=str(DAGS)).dags["mq_audit"]
                assert {type(t).__name__ for t in dag.tasks} == {"SparkSubmitOperator"}
                try:
                    run = dag.test(logical_date=WHEN)
                    tasks = {ti.task_id: ti.state for ti in run.get_task_instances()}
                finally:
                    # The worker's other DAG tests share its Airflow db and parse mq_audit
                    # with other Variables: a second serialized version of it fails them.
                    delete_dag(dag.dag_id)
            cluster_run.wait(timeout=1200)
        finally:
            if cluster_run.poll() is None:
                cluster_run.kill()
                cluster_run.wait()
        err.seek(0)
        assert cluster_run.returncode == 0, err.read()[-5000:]
        out.seek(0)
        on_cluster = json.loads(out.read().strip().splitlines()[-1])
    return Runs(
        state=run.state,
        tasks=tasks,
        interval_end=run.data_interval_end,
        apps=spark_cluster.completed_apps(STEPS, before),
        reports=reports,
        summaries={"cluster": on_cluster, "local": local_run.result()},
        lakes={"dag": lake, "cluster": root / "cluster" / "lake", "local": local.lake},
    )


def test_mq_audit_runs_each_step_as_an_application_on_the_cluster(
    spark_cluster: SparkCluster, runs: Runs
) -> None:
    assert runs.state == "success", runs.tasks
    assert sorted(a["name"] for a in runs.apps) == STEPS, runs.apps
    (report,) = (runs.reports / "mq_audit").glob("*/audit_report.html")
    assert "lost" in report.read_text()
    assert all(table_exists(table_path(runs.lakes["dag"], t)) for t in AUDIT_TABLES)


def test_the_runs_had_executors_on_both_workers_with_the_c_reader(
    spark_cluster: SparkCluster, runs: Runs
) -> None:
    summary = runs.summaries["cluster"]
    assert summary["ok"] and summary["backend"] == "native"
    assert summary["readers"] == ["c"]  # every range was decoded by the C kernel
    (app,) = spark_cluster.completed_apps(["mqaudit-run"])
    by_app = {a["name"]: spark_cluster.executors(a["id"]) for a in [app, *runs.apps]}
    workers = {w["id"] for w in spark_cluster.state()["workers"]}
    assert set(by_app["mqaudit-run"]) == workers, by_app  # each worker read ranges
    assert set(by_app["mqaudit-ingest"]) == workers, by_app
    assert all(by_app.values()), by_app  # each step's executors ran on the workers
    print(f"executors by application and worker: {by_app}")


def _rows(spark: SparkSession, lake: Path, name: str, schema: Any) -> list[tuple[Any, ...]]:
    names = [f.name for f in schema.fields if f.name not in VOLATILE]
    df = DeltaIO(spark).read(table_path(lake, name), schema).select(*names)
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_the_cluster_gives_the_same_lake_as_local(spark: SparkSession, runs: Runs) -> None:
    assert runs.interval_end == WHEN  # the DAG's audit time is the other runs'
    here, there = runs.summaries["local"], runs.summaries["cluster"]
    for key in ("ingested_messages", "appended", "audit_rows", "audit_gates", "problems"):
        assert here[key] == there[key], key
    assert here["ingested_messages"] > 0
    for name, schema in {**INGESTED_TABLES, **AUDIT_TABLES}.items():
        expected = _rows(spark, runs.lakes["local"], name, schema)
        for run in ("cluster", "dag"):
            assert _rows(spark, runs.lakes[run], name, schema) == expected, (run, name)
