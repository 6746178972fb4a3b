"""The demo's summary over the files the DAG runs and the workload leave: the findings of the
mq_audit DAG, over every cluster of its one lake, counted against truth.json."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common.findings import COUNTS
from pipeline.demo_summary import (
    build_summary,
    format_summary,
    other_clusters,
    pick_replay_group,
)


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _finding(kind: str, msg_id: str, group: str | None = "g") -> dict[str, Any]:
    return {"kind": kind, "msg_id": msg_id, "group": group, "count": 2, "cause": "c"}


def _site(tmp_path: Path) -> tuple[Path, Path, Path]:
    """REPORTS with one mq_audit run over the main cluster and one other in one lake (its
    summary's path is the third value), truth.json over both."""
    reports = tmp_path / "reports"
    main_counts = {
        "duplicates": {"delivered_twice": 2, "duplicate_effect": 1, "stored_twice": 1},
        "losses": {},
    }
    report = {
        "duplicates": {"delivered_twice": 2, "duplicate_effect": 1, "stored_twice": 1},
        "duplicate_causes": {"offset_not_committed": 2, "producer_resend": 2},
        "losses": {"lost_after_ack": 2},
        "dead_letters": 1,
        "dead_letters_waiting": 1,
        "clusters": {
            "DefaultCluster": main_counts,
            "crash": {"duplicates": {}, "losses": {"lost_after_ack": 2}},
        },
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
    return reports, _write(tmp_path / "truth.json", truth), run


def edit_report(path: Path, **counts: Any) -> None:
    """Set counts of the mq_audit run's report summary at `path`."""
    doc = json.loads(path.read_text())
    doc["report"]["summary"] |= counts
    path.write_text(json.dumps(doc))


def test_the_truth_check_counts_every_cluster_of_the_lake(tmp_path: Path) -> None:
    reports, truth, _ = _site(tmp_path)
    s = build_summary(reports, truth, None, {"total": 1.0}, tmp_path)
    assert s["truth_check"] == {
        "dead_lettered": {"truth": 1, "found": 1, "match": True},
        "delivered_twice": {"truth": 2, "found": 2, "match": True},
        "lost_after_ack": {"truth": 2, "found": 2, "match": True},
        "stored_twice": {"truth": 1, "found": 1, "match": True},
    }
    assert s["losses"] == {"lost_after_ack": 2}
    assert s["duplicates_by_cause"] == {"offset_not_committed": 2, "producer_resend": 2}
    assert s["audited"]["clusters"] == ["DefaultCluster", "crash"]
    assert s["audited"]["lake"] == str(tmp_path / "lake")
    assert s["clusters"]["crash"]["losses"] == {"lost_after_ack": 2}
    assert s["problems"] == [
        "DefaultCluster: 1 message(s) processed twice",
        "crash: 2 lost message(s)",
    ]
    text = format_summary(s)
    assert "lost_after_ack 2/2" in text and "MISMATCH" not in text
    # Each count says what it counts, and over which clusters.
    assert "findings over 2 cluster(s) in one lake" in text
    assert "clusters DefaultCluster, crash" in text
    lost = next(line for line in text.splitlines() if line.strip().startswith("lost_after_ack"))
    assert lost.split()[1] == "2" and COUNTS["lost_after_ack"] in lost


def test_a_cluster_left_out_of_the_audit_is_a_mismatch(tmp_path: Path) -> None:
    reports, truth, run = _site(tmp_path)
    edit_report(run, losses={}, clusters={})
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
    reports, truth, _ = _site(tmp_path)
    first = json.loads((reports / "mq_audit" / "r1" / "summary.json").read_text())
    # Five due in the two clusters resent on, two more in one the resend did not run for.
    first["report"]["summary"] |= {"resend_candidates": 7, "dead_letters_waiting": 4}
    first["report"]["summary"]["clusters"]["DefaultCluster"]["resend_candidates"] = 3
    first["report"]["summary"]["clusters"]["crash"]["resend_candidates"] = 2
    first["report"]["summary"]["clusters"]["sync"] = {"resend_candidates": 2}
    after = {"report": {"summary": {"dead_letters_waiting": 1}}}
    after["report"]["summary"]["clusters"] = {
        "DefaultCluster": {"resend_candidates": 0, "duplicates": {"stored_twice": 1}},
        # Losses repaired, sends resent: one of them the broker had stored, its answer lost.
        "crash": {"losses": {}, "resend_candidates": 0, "duplicates": {"stored_twice": 1}},
    }
    run = _write(reports / "mq_audit" / "r2" / "summary.json", after)
    _write(reports / "mq_audit" / "latest.json", {"summary": str(run)})
    # One mq_retry_resend run per cluster, the newer one in latest.json: both count.
    manual = [{"msg_id": "m", "topic": "t", "reason": "at the max send count"}]
    runs = {
        "r1": {"cluster": "DefaultCluster", "candidates": 3, "counts": {"sent": 3}},
        "r2": {"cluster": "crash", "candidates": 3, "counts": {"sent": 2, "manual": 1}},
    }
    runs["r2"]["manual"] = manual
    for when, (key, doc) in enumerate(runs.items()):
        resend = _write(reports / "mq_retry_resend" / key / "summary.json", doc)
        os.utime(resend, (1_000_000 + when, 1_000_000 + when))  # r1 older
    _write(reports / "mq_retry_resend" / "latest.json", {"summary": str(resend)})
    replay = {"request": {"group": "g", "dry_run": False}, "by_status": {"sent": 2}}
    _write(reports / "mq_dlq_replay" / "r1" / "summary.json", replay)
    repair = {"cluster": "crash", "send": {"sent": 2, "failed": 0}}
    done = _write(reports / "mq_loss_repair" / "r1" / "summary.json", repair)
    _write(reports / "mq_loss_repair" / "latest.json", {"summary": str(done)})
    s = build_summary(reports, truth, None, {}, tmp_path, first)
    assert s["resends"] == {
        "clusters": ["DefaultCluster", "crash"], "candidates": 6,
        "counts": {"sent": 5, "manual": 1}, "manual_handling": 1,
    }  # fmt: skip
    loops = s["remediation"]["loops"]
    assert loops["resend_due"] == {
        "remedy": "mq_retry_resend of clusters DefaultCluster, crash", "found": 5, "acted": 5,
        "left": 0, "closed": True, "stored_twice_after": 1, "elsewhere": {"sync": 2},
    }  # fmt: skip
    # Four waiting, two replayed, one left: three gone for two replayed is no closed loop.
    assert loops["dead_lettered"]["found"] == 4 and loops["dead_lettered"]["left"] == 1
    assert not loops["dead_lettered"]["closed"]
    assert s["truth_check"]["resend_due"] == {"truth": 0, "found": 7, "match": False}  # first
    text = format_summary(s)
    assert (
        "(mq_retry_resend of clusters DefaultCluster, crash; closed; 1 more stored_twice after"
        " it: sends the broker had stored, their answer lost; not resent: 2 in sync, answered"
        " SLAVE_NOT_AVAILABLE but stored: a resend would store each twice)"
    ) in text
    assert "(producer stubs of DefaultCluster, crash, by what the resend did)" in text
    assert s["reports"]["manual_handling"] == str(reports / "mq_retry_resend")
    assert loops["lost_after_ack"] == {
        "remedy": "mq_loss_repair of cluster crash", "found": 2, "acted": 2, "left": 0,
        "closed": True,
    }  # fmt: skip
    assert "lost_after_ack" not in s["remediation"]["no_remedy"]
    # Without a second audit there is no loop to show.
    assert build_summary(reports, truth, None, {}, tmp_path)["remediation"] is None


# -- RabbitMQ in the demo: its own truth, its rows of the same lake ------------------------------


def test_rocketmq_truth_check_counts_rocketmq_findings_only(tmp_path: Path) -> None:
    """mq_audit's report counts both systems; the RocketMQ truth check takes RocketMQ's."""
    reports, truth, path = _site(tmp_path)
    doc = json.loads(path.read_text())
    rocketmq = dict(doc["report"]["summary"])
    both = doc["report"]["summary"]
    both["duplicates"] = {**both["duplicates"], "delivered_twice": 5}  # 3 of RabbitMQ's
    both |= {"dead_letters": 3, "dead_letters_waiting": 3}
    rabbitmq = {"duplicates": {"delivered_twice": 3}, "dead_letters": 2}
    both["systems"] = {"rocketmq": rocketmq, "rabbitmq": rabbitmq}
    path.write_text(json.dumps(doc))
    s = build_summary(reports, truth, None, {}, tmp_path)
    assert s["truth_check"]["delivered_twice"] == {"truth": 2, "found": 2, "match": True}
    assert s["truth_check"]["dead_lettered"] == {"truth": 1, "found": 1, "match": True}
    assert s["duplicates"]["delivered_twice"] == 2


def _audit_table(lake: Path, name: str, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from pipeline.lake import AUDIT_TABLES
    from pipeline.schemas import arrow_schema

    schema = arrow_schema(AUDIT_TABLES[name])
    write_deltalake(str(lake / name), pa.Table.from_pylist(rows, schema=schema))


def _rabbit(kind: str, cause: str, group: str | None, msg_id: str) -> dict[str, Any]:
    return {"kind": kind, "cause": cause, "group": group, "msg_id": msg_id}


def test_rabbitmq_block_scores_the_lakes_rabbitmq_rows_against_its_truth(tmp_path: Path) -> None:
    from broker_runtime.rabbit.node import RabbitNode
    from pipeline.demo_rabbit import RabbitSide, rabbit_summary

    lake = tmp_path / "lake"
    twice = _rabbit("delivered_twice", "requeued", "billing", "r1")
    lost = _rabbit("unroutable", "no_route", None, "u1")
    rocket = _rabbit("delivered_twice", "requeued", "billing", "r2")  # a RocketMQ row
    _audit_table(
        lake,
        "audit_duplicates",
        [{**twice, "system": "rabbitmq", "count": 2}, {**rocket, "system": "rocketmq"}],
    )
    _audit_table(lake, "audit_losses", [{**lost, "system": "rabbitmq"}])
    wrong = _rabbit("expired", "message_ttl", "short", "e1")  # the audit names it otherwise
    _audit_table(lake, "audit_dead_letters", [{**wrong, "kind": "dead_lettered",
                                               "system": "rabbitmq"}])  # fmt: skip
    truth = {"findings": [twice, lost, wrong]}
    side = RabbitSide(tmp_path / "rabbitmq", lambda url: {})
    side.node = RabbitNode("mqaudit1@localhost", 1, 2, {}, tmp_path)
    block = rabbit_summary(None, side, truth, lake)
    check = block["truth_check"]
    assert check["delivered_twice"] == {
        "truth": 1, "found": 1, "both": 1, "precision": 1.0, "recall": 1.0, "match": True,
    }  # fmt: skip
    assert check["unroutable"]["match"] and check["unroutable"]["found"] == 1
    assert check["expired"] == {
        "truth": 1, "found": 0, "both": 0, "precision": 1.0, "recall": 0.0, "match": False,
    }  # fmt: skip
    assert check["dead_lettered"]["precision"] == 0.0 and not check["dead_lettered"]["match"]
    reports, rocket_truth, _ = _site(tmp_path)
    s = build_summary(reports, rocket_truth, None, {}, tmp_path)
    text = format_summary({**s, "rabbitmq": block})
    assert "vhost demo on node mqaudit1@localhost" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("expired"))
    assert "0/1" in line and "recall 0.000" in line and "MISMATCH" in line
    assert "MISMATCH" not in next(x for x in text.splitlines() if "unroutable" in x)
    # Not run: one line says why; no node, no Variables.
    off = rabbit_summary("skipped (--no-rabbitmq)", None, {}, lake)
    assert off == {"ran": False, "why": "skipped (--no-rabbitmq)"}
    assert "rabbitmq:       not run: skipped (--no-rabbitmq)" in format_summary(
        {**s, "rabbitmq": off}
    )


def test_without_rabbitmq_the_demo_goes_on_but_not_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pipeline.demo_rabbit as R

    monkeypatch.setattr(R, "rabbitmq_available", lambda: False)
    monkeypatch.delenv("CI", raising=False)
    assert R.unavailable_reason(skip=False).startswith("not installed")  # type: ignore[union-attr]
    assert R.unavailable_reason(skip=True) == "skipped (--no-rabbitmq)"
    assert set(R.airflow_vars(None).values()) == {""}  # an outer setting cannot win
    monkeypatch.setenv("CI", "true")
    with pytest.raises(R.RabbitFailed, match="CI=true"):
        R.unavailable_reason(skip=False)
    assert R.unavailable_reason(skip=True) == "skipped (--no-rabbitmq)"


def test_the_replay_group_is_a_rocketmq_one(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    csv_file = tmp_path / "dead_letters.csv"
    rows = ["shipping,rabbitmq"] * 3 + ["g1,rocketmq", "g1,"]
    csv_file.write_text("group,system\n" + "\n".join(rows) + "\n")
    run = _write(
        reports / "mq_dlq_report" / "r" / "summary.json", {"report": {"csv": str(csv_file)}}
    )
    _write(reports / "mq_dlq_report" / "latest.json", {"summary": str(run)})
    assert pick_replay_group(reports, tmp_path / "no-truth.json") == "g1"
