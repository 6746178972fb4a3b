"""The compose file's services, run here as processes with their compose commands and env.

No Docker engine runs on the test machines, so each role is started as the container would
start it, with only the container-world names rewritten for one host: service names and
fixed IPs become 127.0.0.1, fixed ports become free ones, /data and /opt/airflow move under
a temporary directory. The health checks are then the compose file's own commands.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.db_servers import _unavailable, free_port
from tests.unit.test_docker_files import DOCKER, REPO, cc, example_env

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 90.0


def compose_doc(**env: str) -> dict[str, Any]:
    doc: dict[str, Any] = cc.load_compose(example_env(**env))
    return doc


def rewrite(value: str, mapping: dict[str, str]) -> str:
    mapping = {"/opt/mqaudit/": f"{REPO}/", **mapping}
    for old, new in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
        value = value.replace(old, new)
    return value


def healthcheck_argv(svc: dict[str, Any], mapping: dict[str, str]) -> list[str]:
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python", test
    return [sys.executable, *(rewrite(w, mapping) for w in test[2:])]


def healthy(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0


def wait_healthy(
    argv: list[str],
    procs: list[subprocess.Popen[bytes]],
    what: str,
    timeout: float = START_TIMEOUT_S,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"{what}: a process exited with {proc.returncode}"
        if healthy(argv):
            return
        time.sleep(0.5)
    pytest.fail(f"{what} not healthy in {timeout} s: {argv}")


@pytest.fixture(name="processes")
def processes_fixture() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start processes (logs to files); all are stopped by PID at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Any:
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(name="psql")
def psql_fixture() -> str:
    """The psql client that init-databases.sh runs (Debian's postgresql package has it)."""
    path = shutil.which("psql")
    if path is None:
        _unavailable("psql")
    return str(path)


def mqaudit_argv(svc: dict[str, Any], mapping: dict[str, str]) -> list[str]:
    cmd = svc["command"]
    assert cmd[0] == "mqaudit"
    return [
        sys.executable,
        "-m",
        "broker_runtime.cli.main",
        *(rewrite(w, mapping) for w in cmd[1:]),
    ]


def test_name_servers_and_a_broker_group_start_and_answer_their_health_checks(
    tmp_path: Path, processes: Callable[..., subprocess.Popen[bytes]]
) -> None:
    from broker_runtime.cli.main import build_parser

    if "broker" not in build_parser()._subparsers._group_actions[0].choices:  # type: ignore[union-attr]
        pytest.skip("mqaudit broker is not in this checkout")
    doc = compose_doc(MQ_REPLICATION="SYNC", MQ_FLUSH="sync", MQ_SEGMENT_SIZE="1048576")
    services = doc["services"]
    ns_ports = {name: free_port() for name in ("namesrv-1", "namesrv-2")}
    base = {"/data/": f"{tmp_path}/data/", "0.0.0.0": "127.0.0.1"}
    base.update({f"{name}:9876": f"127.0.0.1:{port}" for name, port in ns_ports.items()})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for name, port in ns_ports.items():
        mapping = {**base, "9876": str(port)}
        procs.append(
            processes(mqaudit_argv(services[name], mapping), tmp_path / f"{name}.log", env)
        )
        wait_healthy(healthcheck_argv(services[name], mapping), procs, name)
    for name in ("broker-a-master", "broker-a-slave"):
        cmd = services[name]["command"]
        ip = cmd[cmd.index("--host") + 1]
        port, ha_port = free_port(), free_port()
        mapping = {**base, f"{ip}:10911": f"127.0.0.1:{port}", ip: "127.0.0.1"}
        mapping.update({"10911": str(port), "10912": str(ha_port)})
        procs.append(
            processes(mqaudit_argv(services[name], mapping), tmp_path / f"{name}.log", env)
        )
        check = healthcheck_argv(services[name], mapping)
        wait_healthy(check, procs, name)
        assert (
            tmp_path / "data/mq/brokers/broker-a" / name.rsplit("-", 1)[1] / "commitlog"
        ).is_dir()
    master = procs[2]
    master.send_signal(signal.SIGTERM)
    assert master.wait(30) == 0, (tmp_path / "broker-a-master.log").read_text()[-2000:]
    master_check = healthcheck_argv(
        services["broker-a-master"],
        {"172.28.0.21:10911": f"127.0.0.1:{free_port()}"},
    )
    assert not healthy(master_check)  # a stopped broker is reported unhealthy


@pytest.mark.usefixtures("psql")
def test_postgres_init_script_creates_both_databases(postgres_base_url: str) -> None:
    import psycopg
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url

    from broker_runtime.ledger.engine import create_ledger_engine, ensure_schema

    doc = compose_doc()
    pg_env = doc["services"]["postgres"]["environment"]
    base = make_url(postgres_base_url)
    env = {**os.environ, **pg_env, "PGHOST": str(base.host), "PGPORT": str(base.port)}
    params = {"host": base.host, "port": base.port, "user": "postgres", "dbname": "postgres"}
    try:
        done = subprocess.run(
            ["bash", str(DOCKER / "postgres" / "init-databases.sh")],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        airflow_env = doc["services"]["airflow-scheduler"]["environment"]
        local = {"@postgres:5432/": f"@127.0.0.1:{base.port}/"}
        airflow = make_url(rewrite(airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], local))
        with psycopg.connect(
            host=airflow.host, port=airflow.port, user=airflow.username, dbname=airflow.database
        ) as conn:
            conn.execute("CREATE TABLE probe (id int)")  # the role owns its database
        ledger = create_ledger_engine(rewrite(airflow_env["AIRFLOW_VAR_MQAUDIT_LEDGER_URL"], local))
        try:
            ensure_schema(ledger)
            tables = set(inspect(ledger).get_table_names())
        finally:
            ledger.dispose()
        assert {"message_stub", "message_log", "consume_dedup"} <= tables
    finally:
        with psycopg.connect(**params, autocommit=True) as conn:
            for db, role in (("airflow", "airflow"), ("mqaudit_ledger", "ledger")):
                conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
                conn.execute(f"DROP ROLE IF EXISTS {role}")


SPARK_JOB = """
import sys
import pyarrow as pa
from pyspark.sql import SparkSession

spark = SparkSession.builder.master(sys.argv[1]).appName("compose-check").getOrCreate()

def double(batches):
    for batch in batches:
        yield pa.RecordBatch.from_arrays([pa.compute.multiply(batch.column(0), 2)], ["id"])

rows = spark.range(0, 1000, numPartitions=2).mapInArrow(double, "id long").collect()
assert sum(r.id for r in rows) == 999 * 1000, "wrong sum"
print(spark.conf.get("spark.sql.extensions"))
print(spark.conf.get("spark.executor.memory"))
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.timeout(600)  # JVM start-ups: minutes on 2 busy cores
def test_spark_master_and_worker_run_a_python_job(
    tmp_path: Path, processes: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """The compose commands of the standalone master and a worker, and the driver side's
    spark-defaults.conf; Spark here is the pinned pyspark's own (the image copies the same
    version's distribution to /opt/spark)."""
    import pyspark

    doc = compose_doc(SPARK_WORKER_CORES="1", SPARK_WORKER_MEMORY="2g")
    services = doc["services"]
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    rpc, ui, worker_ui = free_port(), free_port(), free_port()
    mapping = {
        "/opt/spark/bin/spark-class": spark_class, "spark-master": "127.0.0.1",
        "7077": str(rpc), "8080": str(ui), "8081": str(worker_ui),
        "/tmp/spark-work": str(tmp_path / "work"),
    }  # fmt: skip
    env = {
        **os.environ,
        "SPARK_CONF_DIR": str(DOCKER / "spark"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    procs = []
    for name in ("spark-master", "spark-worker-1"):
        svc = services[name]
        argv = [rewrite(w, mapping) for w in svc["command"]]
        procs.append(processes(argv, tmp_path / f"{name}.log", {**env, **svc["environment"]}))
        wait_healthy(healthcheck_argv(svc, mapping), procs, name)
    done = subprocess.run(
        [sys.executable, "-c", SPARK_JOB, services["airflow-scheduler"]["environment"]
         ["SPARK_MASTER"].replace("spark-master:7077", f"127.0.0.1:{rpc}")],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["io.delta.sql.DeltaSparkSessionExtension", "2g"]
