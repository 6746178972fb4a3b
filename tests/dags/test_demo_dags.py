"""The demo's DAG worker (pipeline/demo_dags.py), a real process on a temporary Airflow home:
it migrates the database and warms up (the Spark session of the Variables, Great Expectations'
context), then runs one DAG run per request in that one process, each with
the request's Variables and conf and its output in the request's log; a failed task is a
failed answer, an unknown DAG an error, and the worker ends at the end of its input."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.demo_dags import DagWorker

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.timeout(600)]

PROBE_DAG = '''"""An airflow dag for the demo worker's test."""
import datetime as dt
import json
import os
from pathlib import Path

from airflow.sdk import DAG, Variable, get_current_context, task

with DAG("probe", start_date=dt.datetime(2024, 1, 1), schedule=None):

    @task
    def write() -> None:
        conf = get_current_context()["dag_run"].conf or {}
        print("probe says", conf.get("word"))
        if conf.get("fail"):
            raise RuntimeError("asked to fail")
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        running = SparkContext._active_spark_context  # the worker's warm-up started it
        partitions = SparkSession.builder.getOrCreate().conf.get("spark.sql.shuffle.partitions")
        out = Path(Variable.get("probe_out"))
        spark = {"running": running is not None, "partitions": partitions}
        out.write_text(json.dumps({"pid": os.getpid(), "conf": conf, "spark": spark}))

    write()
'''


def _wait(get: Callable[[], dict[str, Any] | None], timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (answer := get()) is None:
        assert time.monotonic() < deadline, "no answer"
        time.sleep(0.2)
    return answer


def test_the_worker_runs_each_request_in_one_process(tmp_path: Path) -> None:
    home, dags, logs = tmp_path / "airflow", tmp_path / "dags", tmp_path / "logs"
    for d in (home, dags, logs):
        d.mkdir()
    (dags / "probe.py").write_text(PROBE_DAG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_")}
    env |= {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }
    env["AIRFLOW_VAR_MQAUDIT_SPARK_CONF"] = '{"spark.sql.shuffle.partitions": "3"}'
    env["AIRFLOW_VAR_MQAUDIT_REPORTS"] = str(tmp_path / "reports")
    worker = DagWorker({**env, "AIRFLOW_VAR_PROBE_OUT": "/nonexistent/at-start"}, logs / "w.log")
    try:
        assert _wait(lambda: worker.answer(worker.ready)) == {"state": "ready", "dags": ["probe"]}
        when = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
        outs = [tmp_path / "first.json", tmp_path / "second.json"]
        pids = []
        for i, out in enumerate(outs):  # each request's Variables replace the worker's
            log = logs / f"run-{i}.log"
            done = worker.submit(
                "probe", when + dt.timedelta(hours=i), {"word": f"w{i}"},
                {"AIRFLOW_VAR_PROBE_OUT": str(out), "UNRELATED": "x"}, log,
            )  # fmt: skip
            answer = _wait(lambda done=done: worker.answer(done))
            assert answer == {"state": "success", "failed_tasks": []}, log.read_text()[-3000:]
            written = json.loads(out.read_text())
            assert written["conf"] == {"word": f"w{i}"}
            # The Spark session of the Variables was there before the first run.
            assert written["spark"] == {"running": True, "partitions": "3"}
            assert f"probe says w{i}" in log.read_text()
            pids.append(written["pid"])
        assert pids[0] == pids[1] == worker.proc.pid  # every run in the worker itself
        # When each part of the start ended, each within the whole.
        warmed = re.search(
            r"warmed up, ([\d.]+) s after the start \((.*)\)", (logs / "w.log").read_text()
        )
        assert warmed is not None
        parts = dict(re.findall(r"([A-Za-z ]+?) ([\d.]+) s(?:, |$)", warmed.group(2)))
        assert set(parts) == {
            "database migrated", "DAGs parsed", "task API", "Spark session", "ingest",
            "Great Expectations",
        }, parts  # fmt: skip
        assert all(0 < float(t) <= float(warmed.group(1)) for t in parts.values()), parts
        assert (tmp_path / "reports" / "data-docs" / "gx").is_dir()  # GX's context, made once

        failing = worker.submit(
            "probe", when + dt.timedelta(hours=5), {"fail": True},
            {"AIRFLOW_VAR_PROBE_OUT": str(outs[0])}, logs / "failing.log",
        )  # fmt: skip
        answer = _wait(lambda: worker.answer(failing))
        assert answer == {"state": "failed", "failed_tasks": ["write"]}
        assert "asked to fail" in (logs / "failing.log").read_text()

        missing = worker.submit("nope", when, None, {}, logs / "nope.log")
        answer = _wait(lambda: worker.answer(missing))
        assert answer["state"] == "error" and "'nope'" in answer["error"]
    finally:
        worker.stop()
    assert worker.proc.returncode == 0
