"""The demo's summary over the files the DAG runs and the workload leave: findings of the
mq_audit DAG and of the workload's other clusters counted together against truth.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from broker_runtime.common.findings import COUNTS
from pipeline.demo_summary import build_summary, format_summary, other_clusters


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _finding(kind: str, msg_id: str, group: str | None = "g") -> dict[str, Any]:
    return {"kind": kind, "msg_id": msg_id, "group": group, "count": 2, "cause": "c"}


def _site(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    """REPORTS with one mq_audit run, truth.json over the main cluster and one other."""
    reports = tmp_path / "reports"
    report = {
        "duplicates": {"delivered_twice": 2, "duplicate_effect": 1, "stored_twice": 1},
        "duplicate_causes": {"offset_not_committed": 2, "producer_resend": 2},
        "losses": {},
        "dead_letters": 1,
        "dead_letters_waiting": 1,
    }
    run = _write(
        reports / "mq_audit" / "r1" / "summary.json",
        {"ingest": {"messages": 50}, "report": {"summary": report}},
    )
    _write(reports / "mq_audit" / "latest.json", {"summary": str(run)})
    main, other = tmp_path / "cluster", tmp_path / "cluster" / "scenarios" / "crash"
    truth = {
        "scenarios": {
            "dups": {
                "data_dir": str(main),
                "findings": [
                    _finding("delivered_twice", "a"),
                    _finding("delivered_twice", "b"),
                    _finding("stored_twice", "b", None),
                    _finding("dead_lettered", "d"),
                ],
            },
            "crash": {
                "data_dir": str(other),
                "findings": [_finding("lost_after_ack", "l", None)] * 2,
            },
        }
    }
    clusters = {
        "crash": {
            "lake": str(tmp_path / "cluster-lakes" / "crash"),
            "messages": 30,
            "kinds": {
                "audit_duplicates": {},
                "audit_losses": {"lost_after_ack": {"absent_from_commitlog": 2}},
                "audit_dead_letters": {},
            },
        }
    }
    return reports, _write(tmp_path / "truth.json", truth), clusters


def test_the_truth_check_counts_the_dag_and_the_other_clusters(tmp_path: Path) -> None:
    reports, truth, clusters = _site(tmp_path)
    s = build_summary(reports, truth, None, {"total": 1.0}, tmp_path, clusters)
    assert s["truth_check"] == {
        "dead_lettered": {"truth": 1, "found": 1, "match": True},
        "delivered_twice": {"truth": 2, "found": 2, "match": True},
        "lost_after_ack": {"truth": 2, "found": 2, "match": True},
        "stored_twice": {"truth": 1, "found": 1, "match": True},
    }
    assert s["losses"] == {"lost_after_ack": 2}
    assert s["duplicates_by_cause"] == {"offset_not_committed": 2, "producer_resend": 2}
    assert s["messages"]["stored_rows_ingested_other_clusters"] == 30
    assert s["audited"]["other_clusters"] == {"crash": clusters["crash"]["lake"]}
    assert s["problems"] == ["crash: 2 lost message(s)"]
    text = format_summary(s)
    assert "lost_after_ack 2/2" in text and "MISMATCH" not in text
    # Each count says what it counts, and over which clusters.
    assert "findings over the demo's cluster and the workload's 1 other(s)" in text
    lost = next(line for line in text.splitlines() if line.strip().startswith("lost_after_ack"))
    assert lost.split()[1] == "2" and COUNTS["lost_after_ack"] in lost


def test_without_the_other_clusters_their_findings_are_a_mismatch(tmp_path: Path) -> None:
    reports, truth, _ = _site(tmp_path)
    s = build_summary(reports, truth, None, {}, tmp_path)
    assert s["truth_check"]["lost_after_ack"] == {"truth": 2, "found": 0, "match": False}
    assert "lost_after_ack 0/2 MISMATCH" in format_summary(s)


def test_other_clusters_are_the_scenarios_data_dirs_but_the_main_one(tmp_path: Path) -> None:
    _, truth, _ = _site(tmp_path)
    doc = json.loads(truth.read_text())
    assert other_clusters(doc, tmp_path / "cluster") == [
        (tmp_path / "cluster" / "scenarios" / "crash").resolve()
    ]
    assert other_clusters({}, tmp_path) == []


def test_the_repair_loop_counts_the_audit_before_and_after_the_remedies(tmp_path: Path) -> None:
    reports, truth, clusters = _site(tmp_path)
    first = json.loads((reports / "mq_audit" / "r1" / "summary.json").read_text())
    first["report"]["summary"] |= {"resend_candidates": 3, "dead_letters_waiting": 4}
    after = {"report": {"summary": {"resend_candidates": 0, "dead_letters_waiting": 1}}}
    run = _write(reports / "mq_audit" / "r2" / "summary.json", after)
    _write(reports / "mq_audit" / "latest.json", {"summary": str(run)})
    resend = _write(reports / "mq_retry_resend" / "r1" / "summary.json", {"counts": {"sent": 3}})
    _write(reports / "mq_retry_resend" / "latest.json", {"summary": str(resend)})
    replay = {"request": {"group": "g", "dry_run": False}, "by_status": {"sent": 2}}
    _write(reports / "mq_dlq_replay" / "r1" / "summary.json", replay)
    s = build_summary(reports, truth, None, {}, tmp_path, clusters, first)
    loops = s["remediation"]["loops"]
    assert loops["resend_due"] == {
        "remedy": "mq_retry_resend", "found": 3, "acted": 3, "left": 0, "closed": True,
    }  # fmt: skip
    # Four waiting, two replayed, one left: three gone for two replayed is no closed loop.
    assert loops["dead_lettered"]["found"] == 4 and loops["dead_lettered"]["left"] == 1
    assert not loops["dead_lettered"]["closed"]
    assert s["truth_check"]["resend_due"] == {"truth": 0, "found": 3, "match": False}  # first
    text = format_summary(s)
    assert "resend_due" in text and "(mq_retry_resend; closed)" in text
    assert "lost_after_ack" in s["remediation"]["no_remedy"]
    # Without a second audit there is no loop to show.
    assert build_summary(reports, truth, None, {}, tmp_path, clusters)["remediation"] is None
