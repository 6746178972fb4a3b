"""Check docker/compose.yaml and the Dockerfile without a Docker engine; exit 1 on problems.

    .venv/bin/python docker/check_compose.py [--env docker/.env]

The compose file is interpolated as compose does (the env file, overridden by the shell's
environment), validated against the Compose Specification's JSON schema (vendored in
docker/schema/), then checked for what the schema cannot see: every named volume, network
and depends_on target declared; bind-mount sources, build contexts, Dockerfiles and build
targets present; healthchecks in exec form on every long-running service; no two services
publishing one host port; fixed addresses inside their subnet and unique; CPU and memory
limits everywhere. The Dockerfile (docker/check_dockerfile.py): COPY sources present, --from
stages known, every target ending as a non-root user. Versions: the images' Delta jars
(docker/spark/delta-jars.txt) and Spark distribution are those of requirements.lock's
delta-spark and pyspark.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

HERE = Path(__file__).resolve().parent
COMPOSE = HERE / "compose.yaml"
SCHEMA = HERE / "schema" / "compose-spec.json"
_VAR = re.compile(r"\$(?:\$|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_DEPENDS_CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


def _sibling(name: str) -> Any:
    """docker/NAME.py as a module (docker/ is scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


# The Dockerfile's checks (docker/check_dockerfile.py).
df_checks = _sibling("check_dockerfile")


class InterpolationError(ValueError):
    """A required variable is missing, or an expression compose would not accept."""


# ---- environment and interpolation --------------------------------------------------------
def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (quotes removed); blank lines and `#` lines skipped."""
    env = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise ValueError(f"{path}:{number}: not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def interpolate_str(text: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
    `${VAR?error}`, `${VAR:+alt}`, `${VAR+alt}`, `$VAR` and `$$`."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        expr = match.group(1) if match.group(1) is not None else match.group(2)
        found = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?", expr, re.S)
        if not found:
            raise InterpolationError(f"invalid interpolation ${{{expr}}}")
        name, op, arg = found.groups()
        value = env.get(name)
        present = value is not None and (value != "" or not (op or "").startswith(":"))
        if op is None:
            if value is None:
                raise InterpolationError(f"variable {name} is not set")
            return value
        if op in (":-", "-"):
            return value if present and value is not None else arg
        if op in (":?", "?"):
            if not present or value is None:
                raise InterpolationError(f"required variable {name} is missing a value: {arg}")
            return value
        return arg if present else ""  # ":+" and "+"

    return _VAR.sub(one, text)


def interpolate(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate_str(node, env)
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    return node


def load_compose(env: dict[str, str], path: Path = COMPOSE) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())  # anchors and `<<` merges resolve here
    loaded: dict[str, Any] = interpolate(doc, env)
    return loaded


def variables_used(path: Path = COMPOSE) -> set[str]:
    names = set()
    for match in _VAR.finditer(path.read_text()):
        expr = match.group(1) or match.group(2) or ""
        name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", expr)
        if name:
            names.add(name.group(0))
    return names


def schema_errors(doc: dict[str, Any], schema_path: Path = SCHEMA) -> list[str]:
    validator = Draft202012Validator(json.loads(schema_path.read_text()))
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]


# ---- the compose file's structure ---------------------------------------------------------
def _volume_source(entry: Any) -> tuple[str, str]:
    """("bind" | "volume", source) of a short- or long-syntax service volume."""
    if isinstance(entry, dict):
        kind = str(entry.get("type", "volume"))
        return kind, str(entry.get("source", ""))
    source = str(entry).split(":", 1)[0]
    return ("bind" if source.startswith((".", "/", "~")) else "volume"), source


def _service_networks(service: dict[str, Any]) -> dict[str, Any]:
    nets = service.get("networks", [])
    return (
        {n: {} for n in nets} if isinstance(nets, list) else {k: v or {} for k, v in nets.items()}
    )


def _host_ports(service: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            found.append((str(port.get("published", "")), str(port.get("protocol", "tcp"))))
            continue
        spec, _, proto = str(port).partition("/")
        fields = spec.split(":")
        if len(fields) >= 2:
            found.append((fields[-2], proto or "tcp"))
    return found


def _build_problems(name: str, build: Any, base: Path) -> list[str]:
    build = {"context": build} if isinstance(build, str) else build
    context = (base / build.get("context", ".")).resolve()
    dockerfile = context / build.get("dockerfile", "Dockerfile")
    if not dockerfile.is_file():
        return [f"{name}: build file {dockerfile} does not exist"]
    instructions = df_checks.parse_dockerfile(dockerfile.read_text())
    stages = df_checks.dockerfile_stages(instructions)
    declared = set(df_checks.global_args(instructions)).union(*(s["args"] for s in stages.values()))
    problems = []
    if build.get("target") and build["target"] not in stages:
        problems.append(f"{name}: build target {build['target']} is no stage of {dockerfile.name}")
    for arg in build.get("args", {}) or {}:
        if arg not in declared:
            problems.append(f"{name}: build arg {arg} is not an ARG of {dockerfile.name}")
    return problems


def structure_problems(doc: dict[str, Any], base: Path = HERE) -> list[str]:
    services: dict[str, dict[str, Any]] = doc.get("services", {})
    volumes, networks = set(doc.get("volumes") or {}), doc.get("networks") or {}
    problems: list[str] = []
    used_volumes: set[str] = set()
    addresses: dict[str, str] = {}
    ports: dict[tuple[str, str], str] = {}
    for name, svc in services.items():
        if "image" not in svc and "build" not in svc:
            problems.append(f"{name}: neither image nor build")
        if "build" in svc:
            problems.extend(_build_problems(name, svc["build"], base))
        for key in ("command", "entrypoint"):
            if key in svc and not isinstance(svc[key], list):
                problems.append(f"{name}: {key} is a string (a shell parses it); use a list")
        for entry in svc.get("volumes", []):
            kind, source = _volume_source(entry)
            if kind == "bind" and not (base / source).exists():
                problems.append(f"{name}: bind-mount source {source} does not exist")
            elif kind == "volume":
                used_volumes.add(source)
                if source not in volumes:
                    problems.append(f"{name}: volume {source} is not declared")
        for env_file in svc.get("env_file", []) or []:
            path = env_file if isinstance(env_file, str) else env_file.get("path", "")
            if not (base / path).exists():
                problems.append(f"{name}: env_file {path} does not exist")
        for secret in svc.get("secrets", []) or []:
            secret_name = secret if isinstance(secret, str) else secret.get("source")
            if secret_name not in (doc.get("secrets") or {}):
                problems.append(f"{name}: secret {secret_name} is not declared")
        for net, opts in _service_networks(svc).items():
            if net not in networks:
                problems.append(f"{name}: network {net} is not declared")
                continue
            address = (opts or {}).get("ipv4_address")
            if address is None:
                continue
            subnets = [
                ipaddress.ip_network(c["subnet"])
                for c in ((networks[net] or {}).get("ipam") or {}).get("config", [])
            ]
            if not any(ipaddress.ip_address(address) in s for s in subnets):
                problems.append(f"{name}: {address} is outside the subnets of {net}")
            if address in addresses:
                problems.append(f"{name}: {address} is also {addresses[address]}'s")
            addresses[address] = name
        for port in _host_ports(svc):
            if port in ports:
                problems.append(f"{name}: host port {port[0]}/{port[1]} also {ports[port]}'s")
            ports[port] = name
        depends = svc.get("depends_on", {})
        for target, cond in depends.items() if isinstance(depends, dict) else []:
            condition = (cond or {}).get("condition", "service_started")
            if target not in services or target == name:
                problems.append(f"{name}: depends_on {target}, which is no other service")
            elif condition not in _DEPENDS_CONDITIONS:
                problems.append(f"{name}: depends_on {target} with unknown condition {condition}")
            elif condition == "service_healthy" and "healthcheck" not in services[target]:
                problems.append(f"{name}: waits for {target} to be healthy; it has no healthcheck")
            elif condition == "service_completed_successfully" and services[target].get(
                "restart", "no"
            ) not in ("no", "on-failure"):
                problems.append(f"{name}: waits for {target} to complete; it restarts always")
        for dep in depends if isinstance(depends, list) else []:
            if dep not in services:
                problems.append(f"{name}: depends_on {dep}, which is no other service")
        test = (svc.get("healthcheck") or {}).get("test")
        if test is not None and (not isinstance(test, list) or test[0] not in ("CMD", "CMD-SHELL")):
            problems.append(f"{name}: healthcheck test must be a list starting with CMD")
        long_running = svc.get("restart", "no") != "no" and not svc.get("profiles")
        if long_running and test is None:
            problems.append(f"{name}: long-running service without a healthcheck")
        limits = ((svc.get("deploy") or {}).get("resources") or {}).get("limits") or {}
        if not svc.get("profiles") and not ("cpus" in limits and "memory" in limits):
            problems.append(f"{name}: no cpus and memory limits")
    for unused in sorted(volumes - used_volumes):
        problems.append(f"volume {unused} is declared but no service mounts it")
    return problems


def locked_versions(lock: Path) -> dict[str, str]:
    """Package name (lower case, `-` for `_`) -> version, from `name==version` lines."""
    pins = {}
    for line in lock.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[name.split("[", 1)[0].strip().lower().replace("_", "-")] = version.strip()
    return pins


def version_problems(
    lock: Path = HERE.parent / "requirements.lock",
    jars: Path = HERE / "spark" / "delta-jars.txt",
    dockerfile: Path = HERE / "Dockerfile",
) -> list[str]:
    """The images' Delta jars and Spark distribution against the lock: delta-spark's jar and
    delta-storage at the locked delta-spark version, built for the locked pyspark's Spark
    line and Scala 2.13, and the Spark image of the locked pyspark version."""
    pins = locked_versions(lock)
    delta, spark = pins.get("delta-spark"), pins.get("pyspark")
    if delta is None or spark is None:
        return [f"{lock.name}: no delta-spark or pyspark pin"]
    line = ".".join(spark.split(".")[:2])
    problems = []
    coords = {
        (c.group, c.artifact): c.version
        for c in _sibling("fetch_maven_jars").parse_list(jars.read_text(), str(jars))
    }
    for artifact in (f"delta-spark_{line}_2.13", "delta-storage"):
        have = coords.get(("io.delta", artifact))
        if have != delta:
            problems.append(
                f"{jars.name}: io.delta:{artifact} is {have or 'missing'}, "
                f"the lock's delta-spark is {delta}"
            )
    for group, artifact in coords:
        if (
            group == "io.delta"
            and artifact.startswith("delta-spark_")
            and artifact != f"delta-spark_{line}_2.13"
        ):
            problems.append(f"{jars.name}: {artifact} is not for Spark {line} / Scala 2.13")
    image = df_checks.global_args(df_checks.parse_dockerfile(dockerfile.read_text())).get(
        "SPARK_IMAGE", ""
    )
    if not image.partition(":")[2].startswith(f"{spark}-scala2.13-"):
        problems.append(f"{dockerfile.name}: SPARK_IMAGE {image} is not Spark {spark} / Scala 2.13")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--env", type=Path, default=HERE / ".env", help="the env file")
    args = parser.parse_args(argv)
    env = {**(read_env_file(args.env) if args.env.exists() else {}), **os.environ}
    try:
        doc = load_compose(env)
    except InterpolationError as e:
        print(f"compose.yaml: {e}", file=sys.stderr)
        return 1
    problems = schema_errors(doc) + structure_problems(doc)
    builds = [s["build"] for s in doc["services"].values() if isinstance(s.get("build"), dict)]
    targets = {b.get("target", "") for b in builds}
    problems += df_checks.dockerfile_problems(HERE / "Dockerfile", HERE.parent, targets - {""})
    problems += version_problems()
    image = (
        doc["services"].get("spark-master", {}).get("build", {}).get("args", {}).get("SPARK_IMAGE")
    )
    if (
        image is not None
        and image
        != df_checks.global_args(df_checks.parse_dockerfile((HERE / "Dockerfile").read_text()))[
            "SPARK_IMAGE"
        ]
    ):
        problems.append(f"compose.yaml: SPARK_IMAGE {image} is not the Dockerfile's")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(doc['services'])} services checked, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
