"""docker/compose.yaml's commands, parsed by the programs that will run them.

`mqaudit` commands go through the real argparse parser and, for brokers, the real config
builder (what the container would start with); `airflow` commands through Airflow's parser;
health checks through docker/healthcheck.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.cli.main import build_parser
from tests.unit.test_docker_files import cc, example_env, load_module


def commands(doc: dict[str, Any], program: str) -> list[tuple[str, list[str]]]:
    """(service, argv after the program) of every command and healthcheck running `program`."""
    found = []
    for name, svc in doc["services"].items():
        test = (svc.get("healthcheck") or {}).get("test", [])
        for argv in (svc.get("command") or [], test[1:] if test[:1] == ["CMD"] else []):
            if argv[:1] == [program] and "--help" not in argv:
                found.append((name, argv[1:]))
    return found


def mqaudit_subcommands() -> set[str]:
    parser = build_parser()
    return set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


@pytest.mark.parametrize(("replication", "flush"), [("ASYNC", "async"), ("SYNC", "sync")])
def test_node_commands_parse_and_build_their_configs(replication: str, flush: str) -> None:
    doc = cc.load_compose(example_env(MQ_REPLICATION=replication, MQ_FLUSH=flush))
    argvs = commands(doc, "mqaudit")
    assert {argv[0] for _, argv in argvs} == {"namesrv", "broker"}
    missing = {"namesrv", "broker"} - mqaudit_subcommands()
    if missing:
        pytest.skip(
            f"mqaudit {sorted(missing)} not in this checkout (the cluster branch adds them)"
        )
    from broker_runtime.broker.config_file import broker_config
    from broker_runtime.cli.node_cmd import broker_settings

    parser = build_parser()
    roles = {}
    for service, argv in argvs:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{service}: mqaudit {' '.join(argv)} is refused (exit {e.code})")
        if argv[0] == "broker":
            config = broker_config(broker_settings(args))
            roles[service] = (config.broker_name, config.broker_id, str(config.role))
            assert config.store.flush == flush
            assert config.namesrv_addrs == ("namesrv-1:9876", "namesrv-2:9876")
            assert config.store.store_host == (config.host, config.port)
            group, role = service.rsplit("-", 1)  # the shared layout DIR/brokers/<group>/<role>
            assert str(config.store.store_dir) == f"/data/mq/brokers/{group}/{role}"
    master = f"{replication}_MASTER"
    assert roles == {
        "broker-a-master": ("broker-a", 0, master),
        "broker-a-slave": ("broker-a", 1, "SLAVE"),
        "broker-b-master": ("broker-b", 0, master),
        "broker-b-slave": ("broker-b", 1, "SLAVE"),
    }


def test_health_checks_parse() -> None:
    health = load_module("healthcheck").build_parser()
    doc = cc.load_compose(example_env())
    argvs = [argv[1:] for _, argv in commands(doc, "python") if argv[0].endswith("healthcheck.py")]
    assert len(argvs) == 11  # all but PostgreSQL's and the two `airflow jobs check`
    for argv in argvs:
        args = health.parse_args(argv)
        if args.kind != "http":
            host, _, port = args.addr.rpartition(":")
            assert host and port.isdigit(), argv


@pytest.mark.slow
def test_airflow_commands_parse(tmp_path: Path) -> None:
    """Every `airflow ...` of the compose file, through Airflow's own CLI parser."""
    doc = cc.load_compose(example_env())
    argvs = [argv for _, argv in commands(doc, "airflow")]
    assert {a[0] for a in argvs} >= {"api-server", "scheduler", "dag-processor", "triggerer"}
    script = (
        "import json, sys\n"
        "from airflow.cli.cli_parser import get_parser\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    get_parser().parse_args(argv)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIRFLOW_HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
