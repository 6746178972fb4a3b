"""The scripts the images run: jar fetching, health checks, Airflow's first-run set-up.

fetch_maven_jars.py and healthcheck.py run as processes against real HTTP servers on
127.0.0.1 (a repository laid out as Maven Central, a status page), never the network.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.unit.test_docker_files import DOCKER, load_module

FETCH = DOCKER / "fetch_maven_jars.py"
HEALTH = DOCKER / "healthcheck.py"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served over HTTP on 127.0.0.1; yields (dir, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


POM = """<?xml version="1.0"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <groupId>io.delta</groupId><artifactId>{artifact}</artifactId><version>4.4.1</version>
  <properties><storage.version>4.4.1</storage.version></properties>
  <dependencies>{deps}</dependencies>
</project>"""
DEP = (
    "<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
    "<version>{v}</version>{x}</dependency>"
)


def publish(root: Path, artifact: str, jar: bytes, deps: str = "", sha512: bool = True) -> None:
    """Lay out io.delta:`artifact`:4.4.1 (POM, jar, checksum files) as Maven Central does."""
    folder = root / "io" / "delta" / artifact / "4.4.1"
    folder.mkdir(parents=True)
    files = {"jar": jar, "pom": POM.format(artifact=artifact, deps=deps).encode()}
    for ext, data in files.items():
        path = folder / f"{artifact}-4.4.1.{ext}"
        path.write_bytes(data)
        (folder / f"{path.name}.sha1").write_text(hashlib.sha1(data).hexdigest())
        if sha512:
            (folder / f"{path.name}.sha512").write_text(
                f"{hashlib.sha512(data).hexdigest()}  {path.name}\n"
            )


def delta_like_repo(root: Path) -> None:
    deps = "".join(
        [
            DEP.format(g="io.delta", a="delta-storage", v="${storage.version}", x=""),
            DEP.format(g="org.scala-lang", a="scala-library", v="2.13.16", x=""),
            DEP.format(g="org.apache.spark", a="spark-sql_2.13", v="4.2.0",
                       x="<scope>provided</scope>"),
            DEP.format(g="org.scalatest", a="scalatest_2.13", v="3.2.19", x="<scope>test</scope>"),
            DEP.format(g="com.example", a="extra", v="1.0", x="<optional>true</optional>"),
        ]
    )  # fmt: skip
    publish(root, "delta-spark_4.2_2.13", b"delta-spark jar bytes", deps)
    publish(root, "delta-storage", b"delta-storage jar bytes", sha512=False)


def run_fetch(repo: str, listing: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "jars.txt").write_text(listing)
    provided = tmp_path / "spark-jars"
    provided.mkdir(exist_ok=True)
    (provided / "scala-library-2.13.18.jar").write_bytes(b"")
    cmd = [sys.executable, str(FETCH), "--repo", repo, "--list", str(tmp_path / "jars.txt")]
    cmd += ["--dest", str(tmp_path / "out"), "--provided-dir", str(provided)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


LISTING = "# delta\nio.delta:delta-spark_4.2_2.13:4.4.1\nio.delta:delta-storage:4.4.1\n"


def test_fetch_checks_and_writes_the_jars(served: tuple[Path, str], tmp_path: Path) -> None:
    root, url = served
    delta_like_repo(root)
    done = run_fetch(url, LISTING, tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "delta-spark_4.2_2.13-4.4.1.jar",
        "delta-storage-4.4.1.jar",
    ]
    assert (out / "delta-storage-4.4.1.jar").read_bytes() == b"delta-storage jar bytes"
    sha = hashlib.sha256(b"delta-spark jar bytes").hexdigest()
    assert f"io.delta:delta-spark_4.2_2.13:4.4.1 {sha}" in done.stdout.splitlines()
    assert "Spark's own 2.13.18 is used" in done.stderr  # POM's scala-library: provided


def test_pinned_sha256_is_enforced(served: tuple[Path, str], tmp_path: Path) -> None:
    root, url = served
    delta_like_repo(root)
    good = hashlib.sha256(b"delta-storage jar bytes").hexdigest()
    pinned = LISTING.replace("delta-storage:4.4.1", f"delta-storage:4.4.1 {good}")
    assert run_fetch(url, pinned, tmp_path).returncode == 0
    bad = LISTING.replace("delta-storage:4.4.1", f"delta-storage:4.4.1 {'0' * 64}")
    done = run_fetch(url, bad, tmp_path)
    assert done.returncode == 1
    assert "sha256 does not match the pinned" in done.stderr


@pytest.mark.parametrize("fault", ["tampered jar", "bad sha512", "no sha1", "missing dependency"])
def test_fetch_refuses(served: tuple[Path, str], tmp_path: Path, fault: str) -> None:
    root, url = served
    delta_like_repo(root)
    folder = root / "io" / "delta" / "delta-spark_4.2_2.13" / "4.4.1"
    jar = folder / "delta-spark_4.2_2.13-4.4.1.jar"
    listing = LISTING
    if fault == "tampered jar":
        jar.write_bytes(b"something else")
    elif fault == "bad sha512":
        (folder / f"{jar.name}.sha512").write_text("ab" * 64)
    elif fault == "no sha1":
        (folder / f"{jar.name}.sha1").unlink()
    else:
        listing = (
            "io.delta:delta-spark_4.2_2.13:4.4.1\n"  # delta-storage neither listed nor provided
        )
    done = run_fetch(url, listing, tmp_path)
    assert done.returncode == 1, done.stderr
    expected = {
        "tampered jar": "sha1 does not match",
        "bad sha512": "sha512 does not match",
        "no sha1": ".jar.sha1: not found",
        "missing dependency": "needs io.delta:delta-storage:4.4.1, which is neither listed",
    }[fault]
    assert expected in done.stderr
    assert not (tmp_path / "out").exists()  # nothing written unless everything checks out


@pytest.mark.parametrize("excluded", [True, False])
def test_a_dependency_excluded_by_its_dependent_is_not_needed(
    served: tuple[Path, str], tmp_path: Path, excluded: bool
) -> None:
    """As Maven and Ivy resolve: delta-spark brings delta-storage without its com.example
    dependencies, so those need not be listed."""
    root, url = served
    x = "<exclusions><exclusion><groupId>com.example</groupId><artifactId>*</artifactId>"
    x += "</exclusion></exclusions>"
    storage = DEP.format(g="io.delta", a="delta-storage", v="4.4.1", x=x if excluded else "")
    publish(root, "delta-spark_4.2_2.13", b"delta-spark jar bytes", storage)
    publish(root, "delta-storage", b"storage", DEP.format(g="com.example", a="uc", v="1", x=""))
    done = run_fetch(url, LISTING, tmp_path)
    if excluded:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert "needs com.example:uc:1, which is neither listed" in done.stderr


def test_fetch_refuses_a_malformed_list(tmp_path: Path) -> None:
    done = run_fetch("http://127.0.0.1:9", "io.delta:delta-spark\n", tmp_path)
    assert done.returncode == 2
    assert "jars.txt:1: expected 'group:artifact:version [sha256]'" in done.stderr


def run_health(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTH), *args], capture_output=True, text=True, timeout=30
    )


def test_http_health_check(served: tuple[Path, str]) -> None:
    root, url = served
    (root / "json").mkdir()
    (root / "json" / "index.html").write_text('{"status" : "ALIVE"}')
    assert run_health("http", f"{url}/json/", "--expect", "ALIVE").returncode == 0
    stale = run_health("http", f"{url}/json/", "--expect", "healthy")
    assert stale.returncode == 1 and "does not contain 'healthy'" in stale.stderr
    missing = run_health("http", f"{url}/nothing")
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr


def test_http_health_check_of_a_closed_port() -> None:
    from tests.db_servers import free_port

    done = run_health("http", f"http://127.0.0.1:{free_port()}/health")
    assert done.returncode == 1 and "unhealthy" in done.stderr


def test_airflow_init_seeds_the_admin_password(tmp_path: Path) -> None:
    init = load_module("airflow_init")
    assert init.admin_user("viewer:viewer, ops:admin") == "ops"
    with pytest.raises(ValueError, match="no user with the admin role"):
        init.admin_user("bob:viewer")
    path = tmp_path / "auth" / "passwords.json"
    init.seed_password(path, "admin", "first")
    path.write_text(json.dumps({**json.loads(path.read_text()), "bob": "generated"}))
    init.seed_password(path, "admin", "second")
    assert json.loads(path.read_text()) == {"admin": "second", "bob": "generated"}
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="empty"):
        init.seed_password(path, "admin", "")
