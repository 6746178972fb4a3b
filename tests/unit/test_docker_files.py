"""docker/: the compose file and the Dockerfile, checked without a Docker engine.

The compose file is interpolated with docker/.env.example (plus test secrets), validated
against the vendored Compose Specification schema, and run through docker/check_compose.py's
structural checks; each check is also shown to catch the fault it is for.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
SECRETS = (
    "POSTGRES_PASSWORD",
    "AIRFLOW_DB_PASSWORD",
    "LEDGER_DB_PASSWORD",
    "AIRFLOW_ADMIN_PASSWORD",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW_FERNET_KEY",
)


def load_module(name: str) -> ModuleType:
    """A script of docker/ as a module (docker/ is not a package: it is not installed)."""
    spec = importlib.util.spec_from_file_location(f"docker_{name}", DOCKER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


cc = load_module("check_compose")
cdf = load_module("check_dockerfile")


def example_env(**overrides: str) -> dict[str, str]:
    env = cc.read_env_file(DOCKER / ".env.example")
    env.update({name: f"test-{name.lower()}" for name in SECRETS}, **overrides)
    return env


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = cc.load_compose(example_env())
    return doc


def test_compose_is_valid_against_the_compose_specification(compose: dict[str, Any]) -> None:
    assert cc.schema_errors(compose) == []


def test_schema_check_catches_a_malformed_service(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["namesrv-1"]["healthcheck"]["every"] = "10s"
    broken["services"]["namesrv-2"]["restart"] = ["always"]
    errors = cc.schema_errors(broken)
    assert any("namesrv-1/healthcheck: 'every'" in e for e in errors), errors
    assert any("namesrv-2/restart" in e for e in errors)


def test_compose_structure_has_no_problems(compose: dict[str, Any]) -> None:
    assert cc.structure_problems(compose) == []


def test_the_deployment_has_every_role(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in (
        "postgres", "namesrv-1", "namesrv-2", "broker-a-master", "broker-a-slave",
        "broker-b-master", "broker-b-slave", "spark-master", "spark-worker-1", "spark-worker-2",
        "airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
        "airflow-triggerer",
    ):  # fmt: skip
        assert name in services, name
    images = {services[n]["image"] for n in services if n != "postgres"}
    tag = version("mqaudit")  # images are tagged with the project's version
    assert images == {f"mqaudit:{tag}", f"mqaudit-spark:{tag}"}  # one Python, one Spark image
    env = services["airflow-scheduler"]["environment"]
    assert env["SPARK_MASTER"] == "spark://spark-master:7077"
    assert env["AIRFLOW_VAR_MQAUDIT_NAMESRV"] == "namesrv-1:9876;namesrv-2:9876"
    assert env["MQAUDIT_DELTA_BACKEND"] == "native"
    assert env["AIRFLOW_VAR_MQAUDIT_LEDGER_URL"].endswith("@postgres:5432/mqaudit_ledger")
    # Executors read the broker files and write the lake at the driver's paths.
    driver = set(services["airflow-scheduler"]["volumes"])
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert set(services[worker]["volumes"]) <= driver


def test_replication_and_flush_come_from_the_environment() -> None:
    doc = cc.load_compose(example_env(MQ_REPLICATION="SYNC", MQ_FLUSH="sync"))
    for name in ("broker-a-master", "broker-b-master"):
        cmd = doc["services"][name]["command"]
        assert cmd[cmd.index("--role") + 1] == "SYNC_MASTER"
        assert cmd[cmd.index("--flush") + 1] == "sync"


def test_a_missing_secret_stops_compose_with_its_name() -> None:
    env = example_env()
    del env["LEDGER_DB_PASSWORD"]
    with pytest.raises(cc.InterpolationError, match="LEDGER_DB_PASSWORD"):
        cc.load_compose(env)
    with pytest.raises(cc.InterpolationError, match="AIRFLOW_FERNET_KEY"):
        cc.load_compose(example_env(AIRFLOW_FERNET_KEY=""))  # empty counts as missing


def test_check_compose_command(tmp_path: Path) -> None:
    """What an operator runs before `docker compose up`: 0 with a complete .env, 1 without."""
    env_file = tmp_path / ".env"
    env_file.write_text("\n".join(f"{k}={v}" for k, v in example_env().items()))
    clean_env = {k: v for k, v in os.environ.items() if k not in example_env()}

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(DOCKER / "check_compose.py"), "--env", str(path)]
        return subprocess.run(argv, capture_output=True, text=True, env=clean_env, timeout=60)

    good = run(env_file)
    assert good.returncode == 0, good.stderr
    assert "16 services checked, 0 problems" in good.stderr
    bad = run(DOCKER / ".env.example")  # secrets left empty
    assert bad.returncode == 1
    assert "required variable AIRFLOW_FERNET_KEY is missing a value" in bad.stderr


def test_env_example_names_exactly_the_variables_compose_uses() -> None:
    assert set(cc.read_env_file(DOCKER / ".env.example")) == cc.variables_used()


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "v", "EMPTY": ""}
    cases = {
        "${SET}": "v", "$SET-x": "v-x", "$$SET": "$SET", "${UNSET:-d}": "d",
        "${EMPTY:-d}": "d", "${EMPTY-d}": "", "${SET:+alt}": "alt", "${UNSET+alt}": "",
        "${SET:?e}": "v", "${SET}_MASTER": "v_MASTER",
    }  # fmt: skip
    for text, expected in cases.items():
        assert cc.interpolate_str(text, env) == expected, text
    for text in ("${EMPTY:?needed}", "${UNSET?needed}", "${UNSET}", "${1BAD}"):
        with pytest.raises(cc.InterpolationError):
            cc.interpolate_str(text, env)


FAULTS = [
    ("undeclared volume", lambda d: d["services"]["namesrv-1"].update(volumes=["nope:/x"]),
     "volume nope is not declared"),
    ("missing bind source", lambda d: d["services"]["postgres"]["volumes"].append("./no.sh:/x"),
     "bind-mount source ./no.sh"),
    ("unknown depends_on", lambda d: d["services"]["broker-a-slave"]["depends_on"].update(
        ghost={"condition": "service_started"}), "depends_on ghost"),
    ("healthy without healthcheck", lambda d: d["services"]["spark-master"].pop("healthcheck"),
     "waits for spark-master to be healthy; it has no healthcheck"),
    ("string healthcheck", lambda d: d["services"]["namesrv-2"]["healthcheck"].update(
        test="python x.py"), "healthcheck test must be a list"),
    ("port collision", lambda d: d["services"]["spark-master"].update(
        ports=["127.0.0.1:8080:8080"]), "host port 8080/tcp"),
    ("address outside subnet", lambda d: d["services"]["broker-b-slave"]["networks"][
        "mqnet"].update(ipv4_address="10.1.2.3"), "10.1.2.3 is outside"),
    ("duplicate address", lambda d: d["services"]["broker-b-slave"]["networks"][
        "mqnet"].update(ipv4_address="172.28.0.21"), "is also broker-a-master's"),
    ("no limits", lambda d: d["services"]["airflow-triggerer"].pop("deploy"),
     "airflow-triggerer: no cpus and memory limits"),
    ("unknown build target", lambda d: d["services"]["cli"]["build"].update(target="nah"),
     "build target nah"),
    ("unknown build arg", lambda d: d["services"]["cli"]["build"]["args"].update(X="1"),
     "build arg X"),
    ("shell-form command", lambda d: d["services"]["namesrv-1"].update(command="mqaudit x"),
     "command is a string"),
    ("undeclared network", lambda d: d["services"]["postgres"].update(networks=["other"]),
     "network other is not declared"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "expected"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS]
)
def test_structure_check_catches(compose: dict[str, Any], mutate: Any, expected: str) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    problems = cc.structure_problems(broken)
    assert any(expected in p for p in problems), problems


# ---- the Dockerfile -----------------------------------------------------------------------
def dockerfile() -> list[Any]:
    instructions: list[Any] = cdf.parse_dockerfile((DOCKER / "Dockerfile").read_text())
    return instructions


def test_dockerfile_has_no_problems() -> None:
    assert cdf.dockerfile_problems(DOCKER / "Dockerfile", REPO, {"mqaudit", "spark"}) == []


def test_dockerfile_check_catches_faults(tmp_path: Path) -> None:
    (tmp_path / "there.txt").write_text("x")
    (tmp_path / "Dockerfile").write_text(
        "FROM python:3.11-slim AS base\nCOPY there.txt missing.txt /app/\n"
        "COPY --from=nowhere /x /y\nCMD mqaudit --help\n"
        "FROM base AS app\nUSER app\nFROM app AS rooted\nUSER root\n"
    )
    problems = cdf.dockerfile_problems(tmp_path / "Dockerfile", tmp_path, {"app", "rooted", "gone"})
    assert any("missing.txt is not in the context" in p for p in problems), problems
    assert not any("there.txt" in p for p in problems)
    assert any("--from=nowhere" in p for p in problems)
    assert any("CMD in shell form" in p for p in problems)
    assert any("target rooted runs as root" in p for p in problems)
    assert not any("target app" in p for p in problems)
    assert any("no stage gone" in p for p in problems)


def test_images_match_the_locked_python_and_spark() -> None:
    args = cdf.global_args(dockerfile())
    assert args["PYTHON_IMAGE"].startswith("python:3.11-")
    import pyspark

    tag = args["SPARK_IMAGE"].split(":", 1)[1]
    assert tag.startswith(f"{pyspark.__version__}-scala2.13-"), tag
    env = cc.read_env_file(DOCKER / ".env.example")
    assert env["SPARK_IMAGE"] == args["SPARK_IMAGE"]
    assert env["PYTHON_IMAGE"] == args["PYTHON_IMAGE"]


def test_delta_jars_are_the_installed_delta_spark_ones() -> None:
    """The coordinates delta-spark's pip_utils.configure_spark_with_delta_pip would ask for,
    as the Spark session builder asks for them, and the lock's versions."""
    from pipeline.spark_session import delta_packages

    fetch = load_module("fetch_maven_jars")
    coords = {c.name for c in fetch.parse_list((DOCKER / "spark" / "delta-jars.txt").read_text())}
    delta, spark = version("delta_spark"), version("pyspark")
    spark_line = ".".join(spark.split(".")[:2])
    wanted = {f"io.delta:delta-spark_{spark_line}_2.13:{delta}", f"io.delta:delta-storage:{delta}"}
    assert wanted <= coords
    assert set(delta_packages().split(",")) <= coords
    assert cc.version_problems() == []


def test_version_check_names_a_delta_jar_or_spark_image_off_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("# pins\ndelta_spark==9.9.9\npyspark==4.2.0\n")
    problems = cc.version_problems(lock=lock)
    assert problems == [
        "delta-jars.txt: io.delta:delta-spark_4.2_2.13 is "
        f"{version('delta_spark')}, the lock's delta-spark is 9.9.9",
        f"delta-jars.txt: io.delta:delta-storage is {version('delta_spark')}, "
        "the lock's delta-spark is 9.9.9",
    ]
    lock.write_text(f"delta-spark=={version('delta_spark')}\npyspark==4.1.1\n")
    assert cc.version_problems(lock=lock) == [
        "delta-jars.txt: io.delta:delta-spark_4.1_2.13 is missing, "
        f"the lock's delta-spark is {version('delta_spark')}",
        "delta-jars.txt: delta-spark_4.2_2.13 is not for Spark 4.1 / Scala 2.13",
        "Dockerfile: SPARK_IMAGE apache/spark:4.2.0-scala2.13-java17-ubuntu is not "
        "Spark 4.1.1 / Scala 2.13",
    ]


def test_paths_the_compose_file_runs_are_in_the_image(compose: dict[str, Any]) -> None:
    copied = [
        src
        for ins in dockerfile()
        if ins.keyword == "COPY" and "--from" not in ins.args
        for src in ins.args.split()[:-1]
    ]
    used = set()
    for svc in compose["services"].values():
        words = [*svc.get("command", []), *(svc.get("healthcheck") or {}).get("test", [])]
        used.update(w for w in words if w.startswith("/opt/mqaudit/"))
    assert used, "the compose file runs no script of the repository"
    for path in sorted(used):
        rel = path.removeprefix("/opt/mqaudit/")
        assert (REPO / rel).is_file(), rel
        assert any(rel == src or rel.startswith(src.rstrip("/") + "/") for src in copied), rel


def test_postgres_init_script_is_executable_and_strict() -> None:
    script = DOCKER / "postgres" / "init-databases.sh"
    assert script.stat().st_mode & 0o111
    text = script.read_text()
    assert "set -euo pipefail" in text and "ON_ERROR_STOP=1" in text
    # Passwords reach SQL as psql variables only, never pasted into the statement text.
    assert not re.search(r"PASSWORD '\$", text)
