"""Real PostgreSQL and Redis servers for tests, on 127.0.0.1 ephemeral ports, stopped by PID.

Each server is started once per test session from the Debian binaries; each test gets a
fresh database (PostgreSQL) or an emptied keyspace (Redis). Without the binaries the tests
that need them skip, except under CI=true, where they fail: CI installs both.
PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user, with
its data and socket directories in a fresh temporary directory that user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def _unavailable(what: str) -> None:
    message = f"{what} is not installed (make system-deps installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (a clean shutdown for the servers the tests start), then SIGKILL after
    `timeout_s`; by the child's own PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(
    ready: Any,
    proc: subprocess.Popen[bytes],
    log: Path,
    what: str,
    timeout_s: float = START_TIMEOUT_S,
) -> None:
    """Poll `ready()` until true; fail with the log's tail if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if ready():
            return
        time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError(f"{what} not ready in {timeout_s} s:\n{log.read_text()[-3000:]}")


# -- PostgreSQL -----------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL bin dir with initdb and postgres, if any."""

    def version(initdb: str) -> int:
        name = Path(initdb).parent.parent.name
        return int(name) if name.isdigit() else 0

    for initdb in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True):
        bindir = Path(initdb).parent
        if (bindir / "postgres").exists():
            return bindir
    return None


def _run_as() -> dict[str, Any]:
    """subprocess arguments that drop root to `postgres`; nothing for other users."""
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        _unavailable("the postgres OS user")
        raise  # unreachable: _unavailable skips or fails
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


@contextmanager
def postgres_server() -> Iterator[str]:
    """A running PostgreSQL; yields the URL of its `postgres` database."""
    bindir = postgres_bin()
    if bindir is None:
        _unavailable("PostgreSQL (initdb, postgres)")
        return
    as_user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="mqaudit-pg-"))
    data, sockets, log = root / "data", root / "sock", root / "server.log"
    sockets.mkdir()
    log.touch()
    if as_user:
        for path in (root, sockets, log):
            os.chown(path, as_user["user"], as_user["group"])
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--locale=C", "--no-sync"],
            check=True, capture_output=True, env=env, cwd=root, **as_user,
        )  # fmt: skip
        port = free_port()
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(data), "-p", str(port),
                 "-k", str(sockets), "-c", "listen_addresses=127.0.0.1",
                 "-c", "fsync=off", "-c", "max_connections=100"],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, **as_user,
            )  # fmt: skip
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        wait_until(lambda: _pg_ready(port), proc, log, "postgres")
        yield url
    finally:
        if proc is not None:
            stop_process(proc)
        shutil.rmtree(root, ignore_errors=True)


def _pg_ready(port: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres"):
            return True
    except psycopg.OperationalError:
        return False


@pytest.fixture(scope="session")
def postgres_base_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_base_url: str) -> Iterator[str]:
    """A fresh, empty database on the session's server, dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(postgres_base_url)
    name = f"t_{uuid.uuid4().hex[:12]}"
    params = {"host": base.host, "port": base.port, "user": base.username, "dbname": "postgres"}
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield base.set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- Redis ----------------------------------------------------------------------------------


@contextmanager
def redis_server() -> Iterator[str]:
    """A running redis-server without persistence; yields its URL."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        _unavailable("redis-server")
        return
    root = Path(tempfile.mkdtemp(prefix="mqaudit-redis-"))
    log = root / "server.log"
    log.touch()
    port = free_port()
    proc: subprocess.Popen[bytes] | None = None
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no", "--dir", str(root)],
                stdout=out, stderr=subprocess.STDOUT, cwd=root,
            )  # fmt: skip
        url = f"redis://127.0.0.1:{port}/0"
        wait_until(lambda: _redis_ready(url), proc, log, "redis-server")
        yield url
    finally:
        if proc is not None:
            stop_process(proc)
        shutil.rmtree(root, ignore_errors=True)


def _redis_ready(url: str) -> bool:
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=1) as r:
            return bool(r.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture(scope="session")
def redis_base_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture
def redis_url(redis_base_url: str) -> Iterator[str]:
    """The session's Redis with an empty keyspace."""
    import redis

    with redis.Redis.from_url(redis_base_url) as r:
        r.flushall()
    yield redis_base_url


# -- ledger databases -----------------------------------------------------------------------


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
)
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger database URL: a SQLite file in WAL mode, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger' / 'test.db'}"
    return str(request.getfixturevalue("postgres_url"))
