"""The pipeline on a real Spark standalone cluster (a master and two workers started by the
tests, shared by this file's tests): `mqaudit pipeline run --spark-master spark://...` gives
the same lake, rows and findings, as `local[2]`, with its executors on the workers and the C
reader loaded in them; and mq_audit with mqaudit_spark_submit=true runs end to end through
`dag.test()`, each Spark step a SparkSubmitOperator application on that master."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker_runtime.cli.main import main
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.lake import AUDIT_TABLES, INGESTED_TABLES, table_path
from tests.conftest import local_spark, mqaudit_cmd
from tests.dags.conftest import AIRFLOW_WARNINGS, DAGS
from tests.integration.audit_data import build_data_dir
from tests.integration.test_audit_pipeline import T0
from tests.spark_cluster import SparkCluster

# A cluster to start and two pipeline runs, one in a driver process of its own.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_delta,
    pytest.mark.integration,
    pytest.mark.airflow,
    pytest.mark.timeout(1800),
    *AIRFLOW_WARNINGS,
]
AS_OF = T0 + 3_600_000  # one audit time for both runs
VOLATILE = {"created_at"}  # the ingest checkpoint's wall clock


def _run_args(data_dir: Path, root: Path) -> list[str]:
    return [
        *("pipeline", "run", "--data-dir", str(data_dir), "--lake", str(root / "lake")),
        *("--out", str(root / "out"), "--as-of", str(AS_OF), "--quiet"),
    ]


def _rows(spark: SparkSession, lake: Path, name: str, schema: Any) -> list[tuple[Any, ...]]:
    names = [f.name for f in schema.fields if f.name not in VOLATILE]
    df = DeltaIO(spark).read(table_path(lake, name), schema).select(*names)
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return local_spark()  # the others' session


@pytest.fixture(scope="module")
def runs(
    spark: SparkSession, spark_cluster: SparkCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("cluster-run")
    data_dir = build_data_dir(root)
    local, cluster = root / "local", root / "cluster"
    # On the cluster: a driver process of its own (this one has its local session). The
    # local run goes on meanwhile: the cluster run spends much of its time waiting (on its
    # executors' start, on each small job's round trips), time the local run uses.
    with (root / "driver.out").open("w+") as out, (root / "driver.err").open("w+") as err:
        driver = subprocess.Popen(
            mqaudit_cmd(*_run_args(data_dir, cluster), "--spark-master", spark_cluster.url),
            stdout=out,
            stderr=err,
            text=True,
            env=spark_cluster.env(),
        )
        try:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                assert main([*_run_args(data_dir, local), "--spark-master", "local[2]"]) == 0
            driver.wait(timeout=1200)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
        err.seek(0)
        assert driver.returncode == 0, err.read()[-5000:]
        out.seek(0)
        on_cluster = json.loads(out.read().strip().splitlines()[-1])
    in_process = json.loads(printed.getvalue().strip().splitlines()[-1])
    return {"local": (local / "lake", in_process), "cluster": (cluster / "lake", on_cluster)}


def test_the_cluster_run_had_executors_on_both_workers_with_the_c_reader(
    spark_cluster: SparkCluster, runs: dict[str, tuple[Path, dict[str, Any]]]
) -> None:
    summary = runs["cluster"][1]
    assert summary["ok"] and summary["backend"] == "native"
    assert summary["readers"] == ["c"]  # every range was decoded by the C kernel
    apps = spark_cluster.completed_apps(["mqaudit-run"])
    assert len(apps) == 1, apps
    executors = spark_cluster.executors(apps[0]["id"])
    workers = {w["id"] for w in spark_cluster.state()["workers"]}
    assert set(executors) == workers, executors  # each worker ran executors of the run
    print(f"app {apps[0]['id']}: executors by worker {executors}")


def test_the_cluster_gives_the_same_lake_as_local(
    spark: SparkSession, runs: dict[str, tuple[Path, dict[str, Any]]]
) -> None:
    (local, here), (cluster, there) = runs["local"], runs["cluster"]
    for key in ("ingested_messages", "appended", "audit_rows", "audit_gates", "problems"):
        assert here[key] == there[key], key
    assert here["ingested_messages"] > 0
    for name, schema in {**INGESTED_TABLES, **AUDIT_TABLES}.items():
        assert _rows(spark, local, name, schema) == _rows(spark, cluster, name, schema), name


def test_mq_audit_through_spark_submit_on_the_cluster(
    spark_cluster: SparkCluster,
    airflow_db: Path,
    variables: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from airflow.api.common.delete_dag import delete_dag
    from airflow.dag_processing.dagbag import DagBag

    data_dir = build_data_dir(tmp_path)
    lake, reports = tmp_path / "lake", tmp_path / "reports"
    variables(
        mqaudit_spark_submit="true",
        mqaudit_data_dir=data_dir,
        mqaudit_lake=lake,
        mqaudit_reports=reports,
    )
    host, port = spark_cluster.url.rsplit(":", 1)
    conn = {"conn_type": "spark", "host": host, "port": int(port)}
    monkeypatch.setenv(
        "AIRFLOW_CONN_MQAUDIT_SPARK", json.dumps(conn | {"extra": {"deploy-mode": "client"}})
    )
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    # What the submitted drivers need; one executor each (their inputs are a few dozen rows,
    # and the first test shows a run's executors on both workers): two took this test about
    # 80 CPU s more (517 against 435 s, the test alone on an idle 2-core machine).
    for name, value in spark_cluster.client_env({"spark.cores.max": "1"}).items():
        monkeypatch.setenv(name, value)
    before = {a["id"] for a in spark_cluster.state()["completedapps"]}
    dag = DagBag(dag_folder=str(DAGS)).dags["mq_audit"]
    assert {type(t).__name__ for t in dag.tasks} == {"SparkSubmitOperator"}
    when = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)  # after the DAG's start date
    try:
        run = dag.test(logical_date=when)
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    finally:
        # The worker's other DAG tests share its Airflow db and parse mq_audit with other
        # Variables: a second serialized version of it there fails their runs.
        delete_dag(dag.dag_id)
    assert run.state == "success", states
    steps = ["mqaudit-audit", "mqaudit-ingest", "mqaudit-report", "mqaudit-validate"]
    apps = spark_cluster.completed_apps(steps, before)
    assert sorted(a["name"] for a in apps) == steps, apps
    for app in apps:  # each step's executors ran on the workers
        assert spark_cluster.executors(app["id"]), app
    (report,) = (reports / "mq_audit").glob("*/audit_report.html")
    assert "lost" in report.read_text()
    assert all(table_exists(table_path(lake, t)) for t in AUDIT_TABLES)
