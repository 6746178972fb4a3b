"""`mqaudit airflow up|down|status`: the DAGs under a real local Airflow, outside Docker.

`up` runs Airflow 3's four services as processes of their own — scheduler (LocalExecutor),
dag-processor, triggerer and api-server (the UI, the REST API and the task-execution API
the tasks talk to) — on PostgreSQL (`--db-url`), bound to 127.0.0.1, with the DAGs of this
package and their Variables (data dir, lake, reports) from the options. It migrates the
database, waits until every service is healthy and writes HOME/deployment.json (pids, port,
settings) and HOME/airflow.env (the same settings as shell variables: `set -a; .
HOME/airflow.env` makes the `airflow` command line use this deployment). `down` stops the
services by pid: SIGTERM, SIGKILL after the grace period. `status` says which are alive.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

SERVICES = ("scheduler", "dag-processor", "triggerer", "api-server")
STATE = "deployment.json"
ENV_FILE = "airflow.env"
HEALTH = "/api/v2/monitor/health"
# The API's health report names these (the api-server answering is the fourth).
HEALTHY = ("metadatabase", "scheduler", "triggerer", "dag_processor")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("airflow", help="a local Airflow running the mqaudit DAGs (no Docker)")
    cmds = p.add_subparsers(dest="airflow_cmd", required=True)
    up = cmds.add_parser("up", help="migrate the database, start the four services, wait")
    up.add_argument("--home", type=Path, required=True, help="AIRFLOW_HOME (logs, state)")
    up.add_argument("--db-url", required=True, help="PostgreSQL URL of Airflow's metadata")
    up.add_argument("--port", type=int, default=0, help="api-server port (0: a free one)")
    up.add_argument("--data-dir", type=Path, default=None, help="Variable mqaudit_data_dir")
    up.add_argument("--lake", type=Path, default=None, help="Variable mqaudit_lake")
    up.add_argument("--reports", type=Path, default=None, help="Variable mqaudit_reports")
    up.add_argument(
        "--var", action="append", default=[], metavar="NAME=VALUE", help="another Variable"
    )
    up.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for health")
    up.set_defaults(func=cmd_up)
    down = cmds.add_parser("down", help="stop the services by pid")
    down.add_argument("--home", type=Path, required=True)
    down.add_argument("--grace", type=float, default=30.0, help="seconds before SIGKILL")
    down.set_defaults(func=cmd_down)
    status = cmds.add_parser("status", help="JSON: each service's pid and whether it runs")
    status.add_argument("--home", type=Path, required=True)
    status.set_defaults(func=cmd_status)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def variables(args: argparse.Namespace) -> dict[str, str]:
    """The DAGs' Variables from the options (dags/settings.py names them)."""
    out = {}
    for name in ("data_dir", "lake", "reports"):
        value = getattr(args, name)
        if value is not None:
            out[f"mqaudit_{name}"] = str(Path(value).resolve())
    for item in args.var:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--var takes NAME=VALUE, got {item!r}")
        out[name.strip()] = value
    return out


def settings(
    home: Path, db_url: str, port: int, secret: str, var_values: dict[str, str]
) -> dict[str, str]:
    """The environment every service runs with (and the tasks they start inherit)."""
    import dags

    if not db_url.startswith("postgresql"):
        raise ValueError(f"--db-url must be a PostgreSQL URL (LocalExecutor), got {db_url!r}")
    sync = "postgresql+psycopg" + db_url[db_url.index(":") :]  # psycopg 3, sync and async
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags.__file__).parent),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sync,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": sync,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secret,  # the scheduler signs, the api-server checks
        "AIRFLOW__API__SECRET_KEY": secret,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # local use only
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "PYSPARK_PYTHON": sys.executable,
    }
    env.update({f"AIRFLOW_VAR_{k.upper()}": v for k, v in var_values.items()})
    return env


def _airflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow", *args]


def _health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{HEALTH}", timeout=5) as r:
            doc: dict[str, Any] = json.loads(r.read())
            return doc
    except (OSError, ValueError):
        return None


def healthy(doc: dict[str, Any] | None) -> bool:
    return doc is not None and all(doc.get(part, {}).get("status") == "healthy" for part in HEALTHY)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmd_up(args: argparse.Namespace) -> int:
    home = args.home.resolve()
    state_path = home / STATE
    if state_path.exists() and any(_alive(p) for p in _state(home)["pids"].values()):
        raise ValueError(f"a deployment already runs in {home} (mqaudit airflow down first)")
    home.mkdir(parents=True, exist_ok=True)
    (home / "logs").mkdir(exist_ok=True)
    port = args.port or free_port()
    env = settings(home, args.db_url, port, secrets.token_urlsafe(32), variables(args))
    (home / ENV_FILE).write_text(
        "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())), encoding="utf-8"
    )
    run_env = {**os.environ, **env}
    say(f"airflow db migrate ({home / 'logs' / 'db-migrate.log'})")
    with open(home / "logs" / "db-migrate.log", "wb") as log:
        if subprocess.run(
            _airflow("db", "migrate"), stdout=log, stderr=log, env=run_env
        ).returncode:
            raise ValueError(f"airflow db migrate failed; see {log.name}")
    pids: dict[str, int] = {}
    for service in SERVICES:
        with open(home / "logs" / f"{service}.log", "ab") as log:
            proc = subprocess.Popen(
                _airflow(service), stdout=log, stderr=log, env=run_env, start_new_session=True
            )
        pids[service] = proc.pid
        say(f"{service}: pid {proc.pid}")
    state = {"home": str(home), "port": port, "pids": pids, "url": f"http://127.0.0.1:{port}"}
    state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    deadline = time.monotonic() + args.timeout
    doc = None
    while time.monotonic() < deadline:
        dead = [s for s, pid in pids.items() if not _alive(pid) or _reaped(pid)]
        if dead:
            _stop(pids, 10.0)
            raise ValueError(f"{', '.join(dead)} exited; see {home / 'logs'}")
        doc = _health(port)
        if healthy(doc):
            say(f"up: {state['url']} (env: {home / ENV_FILE})")
            print(json.dumps(state, indent=2))
            return 0
        time.sleep(1.0)
    _stop(pids, 10.0)
    raise ValueError(f"not healthy after {args.timeout} s: {doc}; see {home / 'logs'}")


def _reaped(pid: int) -> bool:
    """True once a child of this process has exited (collects it)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _state(home: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((home / STATE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no deployment in {home} ({STATE} missing)") from None
    return doc


def _stop(pids: dict[str, int], grace: float) -> dict[str, str]:
    """SIGTERM each service's process group (its task processes too), SIGKILL at the end
    of the grace period; how each one ended."""
    out: dict[str, str] = {}
    for pid in pids.values():
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) and not _reaped(p) for p in pids.values()):
        time.sleep(0.2)
    for service, pid in pids.items():
        if _alive(pid) and not _reaped(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            out[service] = "killed"
        else:
            out[service] = "stopped"
    return out


def cmd_down(args: argparse.Namespace) -> int:
    home = args.home.resolve()
    state = _state(home)
    print(json.dumps(_stop(state["pids"], args.grace)))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = _state(args.home.resolve())
    alive = {s: _alive(p) for s, p in state["pids"].items()}
    print(json.dumps({**state, "alive": alive, "health": _health(state["port"])}, indent=2))
    return 0 if all(alive.values()) else 1


def say(line: str) -> None:
    print(f"airflow: {line}", file=sys.stderr, flush=True)
