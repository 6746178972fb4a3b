"""`mqaudit demo` end to end, as a person runs it: a cluster, the fault workload (every
scenario), RabbitMQ's node and workload, every DAG run as `airflow dags test` makes it, the
workload's own clusters audited in the same lake, the summary and the lake's findings
(message by message)
held against the workload's ground truth (RabbitMQ's against its own), and every cluster and
node stopped afterwards."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from broker_runtime.rabbit.node import RABBIT_BIN, rabbitmq_available
from tests.conftest import mqaudit_cmd
from tests.db_servers import _unavailable
from tests.integration import truth_compare as C

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.airflow]

MESSAGES = 240  # the workload's least: 24 per scenario, 10 scenarios


def _running_in(data_dir: Path) -> list[int]:
    """Processes whose command line names the data dir (its nodes while they run)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(data_dir) in arg for arg in proc.info["cmdline"] or ()):
            found.append(proc.info["pid"])
    return found


@pytest.mark.timeout(1500)
def test_the_demo_runs_the_workload_and_every_dag_and_matches_the_ground_truth(
    tmp_path: Path,
) -> None:
    if not rabbitmq_available():  # the demo runs without it, but this test checks it too
        _unavailable(f"RabbitMQ ({RABBIT_BIN}/rabbitmq-server)")
    out = tmp_path / "demo"
    done = subprocess.run(
        mqaudit_cmd("demo", "--out", str(out), "--messages", str(MESSAGES)),
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert "workload: [" in done.stderr and "== mq_audit" in done.stderr  # progress as it runs
    assert "== mqaudit demo summary" in done.stdout
    summary = json.loads((out / "summary.json").read_text())

    check = summary["truth_check"]
    assert isinstance(check, dict), check
    kinds = {"stored_twice", "delivered_twice", "retried_then_ok", "dead_lettered"}
    kinds |= {"lost_after_ack", "resend_due"}
    assert kinds <= set(check) and all(check[k]["truth"] > 0 for k in kinds), check
    assert all(row["match"] for row in check.values()), check
    assert "MISMATCH" not in done.stdout

    # Message by message: the lake's findings (of every cluster: mq_audit ingests the
    # workload's own clusters too) are the truth's, but for the sends the resend repaired on
    # the demo's cluster (the loop below).
    truth = json.loads((out / "truth.json").read_text())
    rows = C.lake_fault_rows(out / "lake")
    owners = C.scenario_of(truth)
    went_back = [r for r in rows if C.is_went_back(r)]
    found = C.audit_keys(
        (r for r in rows if r["kind"] != C.DUPLICATE_EFFECT and not C.is_went_back(r)), owners
    )
    main = {n for n, s in truth["scenarios"].items() if Path(s["data_dir"]) == out / "cluster"}
    keys = C.truth_keys(truth)
    due = {k: n for k, n in keys.items() if k[1] == "resend_due"}
    resent = {k: n for k, n in due.items() if k[0] in main}
    assert resent  # the workload cut some sends off the demo's cluster
    # and the synchronous master crash's were answered SLAVE_NOT_AVAILABLE: not resent
    assert {k[0] for k in due.keys() - resent.keys()} == {"master_crash_sync"}
    lossy = "master_crash_async"  # the demo repairs its losses
    repaired = {k: n for k, n in keys.items() if k[:2] == (lossy, "lost_after_ack")}
    assert repaired
    expected = {k: n for k, n in keys.items() if k not in resent | repaired}
    C.assert_same_findings(expected, found)
    # Committed offsets that went back (timing, see C.WENT_BACK): only where two consumers
    # commit one queue, and each is in its cluster's offset files.
    assert {owners[r["group"]] for r in went_back} <= C.WENT_BACK_IN, went_back

    def data_dir_of(row: dict[str, Any]) -> Path:
        return Path(truth["scenarios"][owners[row["group"]]]["data_dir"])

    for data_dir in {Path(truth["scenarios"][n]["data_dir"]) for n in C.WENT_BACK_IN}:
        mine = C.went_back_counts(r for r in went_back if data_dir_of(r) == data_dir)
        assert mine == C.raw_counts(data_dir).offsets_went_back, data_dir

    # The repair loop closed: what mq_audit found, the remedy acted on, and the next mq_audit
    # no longer finds (every resend; the replayed group's dead letters).
    loops = summary["remediation"]["loops"]
    assert loops["resend_due"] == {
        "remedy": "mq_retry_resend of cluster DefaultCluster", "found": len(resent),
        "acted": len(resent), "left": 0, "closed": True, "stored_twice_after": 0,
        "elsewhere": {"master_crash_sync": len(due) - len(resent)},
    }  # fmt: skip
    assert loops["dead_lettered"]["closed"] and loops["dead_lettered"]["acted"] > 0, loops
    assert loops["lost_after_ack"] == {
        "remedy": f"mq_loss_repair of cluster {lossy}", "found": len(repaired),
        "acted": len(repaired), "left": 0, "closed": True,
    }  # fmt: skip
    assert "repair loop" in done.stdout
    elsewhere = {n for n, s in truth["scenarios"].items() if Path(s["data_dir"]) != out / "cluster"}
    assert elsewhere == {
        "rebalance_lock_off",
        "rebalance_lock_on",
        "master_crash_async",
        "master_crash_sync",
        "transactions",
    }
    # One lake: the demo's cluster and each of the workload's, by its own name.
    assert summary["audited"]["clusters"] == sorted({"DefaultCluster", *elsewhere})
    group = summary["replays"]["group"]
    dead = sum(
        1
        for s in truth["scenarios"].values()
        for f in s["findings"]
        if f["kind"] == "dead_lettered" and f["group"] == group
    )
    assert dead > 0
    assert summary["replays"] == {
        "group": group,
        "dry_run": {"planned": dead},
        "real": {"sent": dead},
    }
    for key in ("audit_report", "dlq_report", "dlq_csv"):
        assert Path(summary["reports"][key]).is_file(), key
    steps = {"cluster up", "workload", "airflow db", "mq_audit", "mq_retry_resend"}
    steps |= {"mq_dlq_report", "mq_dlq_replay (dry run)", "mq_dlq_replay", "cluster down"}
    steps |= {"loss repair", "mq_audit (after the remedies)", "total"}
    steps |= {"rabbitmq workload (waited for)", "rabbitmq down"}
    assert steps <= set(summary["seconds"])
    assert _running_in(out / "cluster") == []  # its own cluster and the workload's others
    assert _running_in(out / "logs") == []  # the DAG worker (its ready file is in logs)

    # RabbitMQ: its node's workload, audited by the same mq_audit into the same lake, every
    # finding of its truth found (kind, cause, queue, message) and nothing else; node stopped.
    rabbit = summary["rabbitmq"]
    assert rabbit["ran"] and rabbit["vhost"] == "demo", rabbit
    rabbit_truth = json.loads((out / "rabbit-truth.json").read_text())["findings"]
    rabbit_check = rabbit["truth_check"]
    assert set(rabbit_check) == {
        "delivered_twice", "duplicate_effect", "dead_lettered", "expired", "dropped_maxlen",
        "never_delivered", "unroutable",
    }  # fmt: skip
    for kind, row in rabbit_check.items():
        n = sum(1 for f in rabbit_truth if f["kind"] == kind)
        assert (row["truth"], row["found"], row["both"]) == (n, n, n), (kind, row)
        assert row["precision"] == row["recall"] == 1.0 and row["match"], (kind, row)
    assert rabbit["workload"]["findings"] == {k: r["truth"] for k, r in rabbit_check.items()}
    assert "rabbitmq:       vhost demo" in done.stdout
    assert _running_in(out / "rabbitmq") == []
