"""The demo's DAG runs, all in one process: `python -m pipeline.demo_dags READY`, started once
per demo with the demo's Airflow environment.

`airflow dags test DAG DATE` starts Python, imports Airflow, starts the in-process task API,
sets up Great Expectations and a Spark JVM for each run, and each run's queries start cold.
This worker runs the demo's DAGs with `dag.test()` (what `airflow dags test` calls), one after
another in one process, so that those are paid once.

It starts with `airflow db migrate`, parsing the DAGs and starting the task API, and, beside
them, warms up (`warm_up`), while the demo's cluster and workload run; then it writes {"state":
"ready"} (or "error") to READY. A request is then one JSON object per line on stdin: {"dag_id",
"logical_date" (ISO 8601), "conf" (an object or null), "variables" (the run's AIRFLOW_VAR_*
settings: they replace the worker's), "log" (the file the run's output goes to), "done" (the
file its answer goes to)}. The answer, {"state": the DAG run's state, "failed_tasks": [...]} or
{"state": "error", "error": ...}, is written to "done" when the run ends. Answers are renamed
into place: a reader never sees half of one. The worker ends at the end of stdin. The Spark JVM
(and the Python workers it starts) write to the worker's own log: the warm-up started them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

VARIABLE_PREFIX = "AIRFLOW_VAR_"
STARTED = time.monotonic()
# When each part of the start ended, in seconds after it (the "warmed up" line shows them).
_marks: dict[str, float] = {}


def _mark(name: str) -> None:
    _marks[name] = round(time.monotonic() - STARTED, 1)


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2) into `log` for a block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _write(path: Path, answer: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(answer))
    partial.replace(path)


def _variable(name: str, default: str) -> str:
    """A Variable the worker was started with (env AIRFLOW_VAR_*), else `default`."""
    return os.environ.get(VARIABLE_PREFIX + name.upper(), "").strip() or default


def warm_up() -> None:
    """What the first run's tasks would each pay, paid once before the first request (while
    the demo's workload runs): the Spark JVM with Delta Lake, as the tasks' Variables
    mqaudit_spark_master and mqaudit_spark_conf set it (their sessions are then this one);
    the ingest step on a data dir of a few messages and their ledger (the classes of its
    reads, appends and merges loaded and their hot methods compiled); Great Expectations'
    import and Data Docs context (mqaudit_reports' data-docs)."""
    from pipeline.class_archive import write_small_store
    from pipeline.spark_session import build_spark
    from pipeline.steps import INGEST, RunInputs

    # The JVM first: it starts (and the ingest runs) in its own process while the main
    # thread imports Airflow and parses the DAGs; Great Expectations is imported after.
    conf = json.loads(_variable("mqaudit_spark_conf", "{}"))
    spark = build_spark("mqaudit-airflow", _variable("mqaudit_spark_master", "local[2]"), conf)
    _mark("Spark session")
    with tempfile.TemporaryDirectory(prefix="mqaudit-warm-") as d:
        data = Path(d) / "data"
        write_small_store(data)
        INGEST.run(RunInputs(lake=Path(d) / "lake", data_dirs=(data,), progress=False), spark)
    _mark("ingest")
    from expectations.context import shared_context

    reports = Path(_variable("mqaudit_reports", "~/mqaudit/reports")).expanduser().resolve()
    shared_context(reports / "data-docs")
    _mark("Great Expectations")


def warm_up_task_api() -> None:
    """Airflow's in-process task API, which `dag.test()` starts for the first task it runs:
    its app and its first request (6.3 s on a busy 2-core machine). Started once the
    database is migrated, while the Spark warm-up runs; every run then uses this one."""
    import httpx
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    client = httpx.Client(transport=in_process_api_server().transport)
    client.get("http://in-process.invalid./health").raise_for_status()


def run_one(bag: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One DAG run as `airflow dags test` makes it, with the request's Variables; the answer."""
    for key in [k for k in os.environ if k.startswith(VARIABLE_PREFIX)]:
        del os.environ[key]
    os.environ.update(request.get("variables") or {})
    dag = bag.dags.get(request["dag_id"])
    if dag is None:
        return {"state": "error", "error": f"no DAG {request['dag_id']!r}: {bag.import_errors}"}
    try:
        run = dag.test(
            logical_date=dt.datetime.fromisoformat(request["logical_date"]),
            run_conf=request.get("conf"),
        )
    except Exception as e:  # the run's own failure is in its log; the demo names it
        traceback.print_exc()
        return {"state": "error", "error": f"{type(e).__name__}: {e}"}
    failed = sorted(ti.task_id for ti in run.get_task_instances() if ti.state != "success")
    return {"state": str(run.state), "failed_tasks": failed}


class DagWorker:
    """The demo's side: the worker process (its own output in `log`), one request per run."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.ready = log.with_suffix(".ready.json")
        self.ready.unlink(missing_ok=True)
        with open(log, "ab") as out:  # the child keeps its copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.demo_dags", str(self.ready)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
            )

    def submit(
        self,
        dag_id: str,
        when: dt.datetime,
        conf: dict[str, Any] | None,
        env: dict[str, str],
        log: Path,
    ) -> Path:
        """Ask for a run with the Variables of `env`; the file its answer will be in."""
        done = log.with_suffix(".done.json")
        done.unlink(missing_ok=True)
        request = {
            "dag_id": dag_id,
            "logical_date": when.isoformat(),
            "conf": conf,
            "variables": {k: v for k, v in env.items() if k.startswith(VARIABLE_PREFIX)},
            "log": str(log),
            "done": str(done),
        }
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return done

    def answer(self, done: Path) -> dict[str, Any] | None:
        """The run's answer once there is one (an error when the worker died first)."""
        exited = self.proc.poll() is not None  # before looking: an answer written, then exit
        if done.exists():
            answer: dict[str, Any] = json.loads(done.read_text())
            return answer
        if exited:
            code = self.proc.returncode
            return {"state": "error", "error": f"the DAG worker exited {code}; see {self.log}"}
        return None

    def stop(self, timeout_s: float = 60.0) -> None:
        """End of requests: the worker ends (killed after `timeout_s`)."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(ready: Path) -> int:
    with ThreadPoolExecutor(1, thread_name_prefix="warm-up") as pool:
        warming = pool.submit(warm_up)  # the JVM starts beside the migration and the parse
        migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=False)
        if migrate.returncode != 0:
            error = f"airflow db migrate exited {migrate.returncode}"
            _write(ready, {"state": "error", "error": error})
            return 1
        _mark("database migrated")
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
        _mark("DAGs parsed")
        try:
            warm_up_task_api()
            _mark("task API")
            warming.result()
            parts = ", ".join(f"{k} {v} s" for k, v in sorted(_marks.items(), key=lambda i: i[1]))
            elapsed = time.monotonic() - STARTED
            print(f"warmed up, {elapsed:.1f} s after the start ({parts})", flush=True)
        except Exception:  # a warm-up only saves time: the runs say what fails
            traceback.print_exc()
    _write(ready, {"state": "ready", "dags": sorted(bag.dags)})
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            with _output_to(Path(request["log"])):
                answer = run_one(bag, request)
            _write(Path(request["done"]), answer)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m pipeline.demo_dags READY_FILE (requests on stdin)")
    sys.exit(main(Path(sys.argv[1])))
