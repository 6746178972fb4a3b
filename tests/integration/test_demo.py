"""`mqaudit demo` end to end: the cluster, traffic, every DAG through `airflow dags test`, the
summary and the reports; the cluster is stopped afterwards, also when a step fails.

Until `mqaudit workload` exists the demo must stop at that step with a clear message; the
full run here makes its traffic with the product's produce/consume CLIs instead.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from broker_runtime.cli.client_args import namesrv_of_data_dir
from broker_runtime.cluster.layout import ClusterLayout
from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.ledger.producer import ProducerLedger, ResendBackoff, StubRecord
from pipeline.demo import Demo, has_command
from tests.conftest import mqaudit_cmd
from tests.dags.traffic import make_dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.airflow]


def _running_in(data_dir: Path) -> list[int]:
    """Processes whose command line names the data dir (its nodes while they run)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(data_dir) in arg for arg in proc.info["cmdline"] or ()):
            found.append(proc.info["pid"])
    return found


@pytest.mark.skipif(has_command("workload"), reason="the workload exists: the demo runs it")
def test_without_the_workload_the_demo_stops_there_and_stops_the_cluster(tmp_path: Path) -> None:
    out = subprocess.run(
        mqaudit_cmd("demo", "--out", str(tmp_path / "demo"), "--messages", "10"),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 1
    assert "FAILED: workload: this build has no `mqaudit workload` command" in out.stderr
    data_dir = tmp_path / "demo" / "cluster"
    assert len(ClusterLayout.load(data_dir).nodes) >= 3  # it was up
    assert "cluster down:" in out.stderr and _running_in(data_dir) == []


def cli_traffic(demo: Demo) -> dict[str, Any]:
    """Messages through the produce and consume CLIs, dead letters, and a stub whose message
    never reached a broker (with its body kept for the resend)."""
    data = str(demo.data_dir)
    for argv in (
        ["produce", "--data-dir", data, "--topic", "orders", "--count", "40", "--keys"],
        ["consume", "--data-dir", data, "--topic", "orders", "--group", "billing",
         "--count", "40", "--timeout", "15"],
    ):  # fmt: skip
        done = subprocess.run(mqaudit_cmd(*argv), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    make_dead_letters(namesrv_of_data_dir(demo.data_dir), "billing", "orders", 4)
    ledger = ProducerLedger.open(demo.data_dir, backoff=ResendBackoff(first_ms=1))
    never = Message("orders", b"never reached a broker", {UNIQ_KEY: "DEMO-NEVER-SENT"})
    ledger.record_before_send([StubRecord.of(never)])
    ledger.keep_bodies([never])
    ledger.close()
    return {"produced": 40, "consumed": 40, "dead_letters": 4}


@pytest.mark.timeout(1500)
def test_the_demo_runs_every_dag_through_airflow(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "demo", messages=40)
    summary = demo.run(traffic=cli_traffic)
    assert json.loads((tmp_path / "demo" / "summary.json").read_text()) == json.loads(
        json.dumps(summary, default=str)
    )
    assert summary["messages"]["stored_rows_ingested"] >= 45
    assert summary["dead_letters"]["total"] == 4
    assert summary["resends"]["counts"]["sent"] == 1
    assert summary["replays"] == {
        "group": "billing",
        "dry_run": {"planned": 4},
        "real": {"sent": 4},
    }
    for key in ("audit_report", "dlq_report", "dlq_csv", "manual_handling"):
        assert Path(summary["reports"][key]).is_file(), key
    steps = {"cluster up", "workload", "airflow db", "mq_audit", "mq_retry_resend"}
    steps |= {"mq_dlq_report", "mq_dlq_replay (dry run)", "mq_dlq_replay", "cluster down"}
    assert steps <= set(summary["seconds"])
    assert _running_in(demo.data_dir) == []
