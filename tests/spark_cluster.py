"""A real Spark standalone cluster for tests: a master and two workers started from the
installed pyspark (`spark-class`), on 127.0.0.1 with ephemeral ports, 2 cores and 2 GiB per
worker, stopped by PID. Ports are read from the daemons' own log lines; readiness and the
applications' executors from the master's and workers' JSON endpoints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark
import pytest

from pipeline.spark_session import SMALL_DATA_SPARK
from tests.db_servers import stop_process, wait_until

START_TIMEOUT_S = 600.0  # JVMs on a busy two-core machine (ready is polled, not waited out)
FINISH_TIMEOUT_S = 120.0  # an application's end reaching the master after its driver exited
SPARK_HOME = Path(pyspark.__file__).parent
WORKERS = 2
# The drivers' settings on this cluster (spark-defaults.conf; a session's own settings win):
# its inputs are as small as the demo's, and two applications run at once, each with an
# executor of one core on each worker.
CLIENT_CONF = {**SMALL_DATA_SPARK, "spark.cores.max": "2"}


@dataclass
class SparkCluster:
    url: str  # spark://127.0.0.1:PORT
    web: str  # the master's web UI, http://127.0.0.1:PORT
    conf_dir: Path  # SPARK_CONF_DIR of the drivers: spark-defaults.conf with CLIENT_CONF
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's JSON view: workers, active and completed applications."""
        return _get_json(f"{self.web}/json/")

    def completed_apps(
        self, names: list[str], before: AbstractSet[str] = frozenset()
    ) -> list[dict[str, Any]]:
        """The completed applications named in `names` and not in `before`, once there are
        as many as `names` (or FINISH_TIMEOUT_S passed: the caller asserts what it got). A
        driver's goodbye, or its disconnection, reaches the master after the driver exited."""
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        while True:
            apps = [
                a
                for a in self.state()["completedapps"]
                if a["name"] in names and a["id"] not in before
            ]
            if len(apps) >= len(names) or time.monotonic() > deadline:
                return apps
            time.sleep(0.2)

    def executors(self, app_id: str) -> dict[str, list[int]]:
        """Worker id -> ids of the executors of `app_id` it ran (running or finished), read
        from each worker's JSON endpoint."""
        out: dict[str, list[int]] = {}
        for worker in self.state()["workers"]:
            view = _get_json(f"{worker['webuiaddress']}/json/")
            ran = [*view.get("executors", []), *view.get("finishedexecutors", [])]
            ids = sorted(int(e["id"]) for e in ran if e.get("appid") == app_id)
            if ids:
                out[worker["id"]] = ids
        return out

    def client_env(self) -> dict[str, str]:
        """What a driver process using this cluster needs in its environment: addresses on
        loopback, and the client settings (CLIENT_CONF) in a spark-defaults.conf."""
        return {
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONF_DIR": str(self.conf_dir),
        }


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def _spark_class(cls: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_NO_DAEMONIZE": "1",
        # No REST submission server: it would take the fixed port 6066.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }
    # spark-class execs java: the PID is the JVM's.
    cmd = [str(SPARK_HOME / "bin" / "spark-class"), cls, *args]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def _logged(log: Path, pattern: str) -> str | None:
    found = re.search(pattern, log.read_text(errors="replace"))
    return found.group(1) if found else None


def start_cluster(root: Path, workers: int = WORKERS) -> SparkCluster:
    """Start the master, then the workers; return once every worker is ALIVE at the master.
    On failure, what was started is stopped."""
    root.mkdir(parents=True, exist_ok=True)
    conf_dir = root / "conf"
    conf_dir.mkdir()
    lines = "".join(f"{key} {value}\n" for key, value in CLIENT_CONF.items())
    (conf_dir / "spark-defaults.conf").write_text(lines)
    log = root / "master.log"
    master = _spark_class(
        "org.apache.spark.deploy.master.Master",
        ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
        log,
    )
    cluster = SparkCluster("", "", conf_dir, [master])
    try:
        wait_until(
            lambda: (
                _logged(log, r"Starting Spark master at (spark://\S+)")
                and _logged(log, r"MasterWebUI to \S+, and started at (http://\S+)")
            ),
            master,
            log,
            "spark master",
            START_TIMEOUT_S,
        )
        cluster.url = str(_logged(log, r"Starting Spark master at (spark://\S+)"))
        cluster.web = str(_logged(log, r"MasterWebUI to \S+, and started at (http://\S+)"))
        for i in range(workers):
            work = root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            args = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
            args += ["--cores", "2", "--memory", "2g"]
            args += ["--work-dir", str(work), cluster.url]
            cluster.procs.append(
                _spark_class(
                    "org.apache.spark.deploy.worker.Worker", args, root / f"worker-{i}.log"
                )
            )

        def all_alive() -> bool:
            try:
                state = cluster.state()
            except OSError:  # the web UI not answering yet (or slowly, on a busy machine)
                return False
            return len([w for w in state["workers"] if w["state"] == "ALIVE"]) == workers

        wait_until(all_alive, master, log, f"{workers} spark workers", START_TIMEOUT_S)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: SparkCluster) -> None:
    """Workers first (they would reconnect to a restarted master), then the master."""
    for proc in reversed(cluster.procs):
        stop_process(proc)


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
