"""The demo's summary, from what the DAG runs wrote under REPORTS (pure over those files).

Each DAG task writes REPORTS/<dag_id>/<run>/summary.json and REPORTS/<dag_id>/latest.json;
the workload writes truth.json. The clusters the workload started for itself are audited by
the same mq_audit runs, in the same lake (each row names its cluster); the findings are
counted by kind, per cluster too, and held against the truth's counts (a count check;
tests/integration/test_audit_truth.py checks every message id and cause).
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

from broker_runtime.common.findings import (
    COUNTS,
    DEAD_LETTERED,
    DELIVERED_TWICE,
    DUPLICATE_EFFECT,
    FILTERED_WRONGLY,
    KINDS,
    LAG,
    LOST_AFTER_ACK,
    RABBITMQ,
    RESEND_DUE,
    ROCKETMQ,
    STORED_TWICE,
)
from pipeline.demo_rabbit import rabbit_lines
from pipeline.demo_remedies import remediation, remediation_lines
from pipeline.reports.summary import system_summary

# The truth kinds the demo holds against the audit (retried_then_ok is no problem to count).
TRANSACTION_KINDS = KINDS["audit_transactions"]
COMPARED_KINDS = (
    STORED_TWICE,
    DELIVERED_TWICE,
    LOST_AFTER_ACK,
    DEAD_LETTERED,
    RESEND_DUE,
    *TRANSACTION_KINDS,
    FILTERED_WRONGLY,
)


def load_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def latest(reports: Path, dag_id: str) -> dict[str, Any]:
    """The summary.json of the DAG's last run ({} if it never ran)."""
    pointer = load_json(reports / dag_id / "latest.json")
    return load_json(Path(pointer["summary"])) if "summary" in pointer else {}


def every_run(reports: Path, dag_id: str) -> list[dict[str, Any]]:
    """The summary.json of each of the DAG's runs, oldest first."""
    paths = sorted((reports / dag_id).glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    return [doc for doc in map(load_json, paths) if doc]


def replays(reports: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The newest dry-run and real replay summaries."""
    dry: dict[str, Any] = {}
    real: dict[str, Any] = {}
    for doc in every_run(reports, "mq_dlq_replay"):
        if doc.get("request", {}).get("dry_run"):
            dry = doc
        else:
            real = doc
    return dry, real


def resends(reports: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every mq_retry_resend run of `reports` (the demo runs one, on its own cluster; a person
    may run more), and their sums: the clusters, candidates, counts by action and stubs
    handed to a person."""
    runs = every_run(reports, "mq_retry_resend")
    counts: Counter[str] = Counter()
    for run in runs:
        counts.update(run.get("counts", {}))
    return runs, {
        "clusters": [run.get("cluster") for run in runs],
        "candidates": sum(int(run.get("candidates") or 0) for run in runs),
        "counts": dict(counts),
        "manual_handling": sum(len(run.get("manual", [])) for run in runs),
    }


def truth_counts(truth: dict[str, Any]) -> dict[str, int]:
    """Findings per kind over every scenario of truth.json."""
    counts: Counter[str] = Counter()
    for scenario in truth.get("scenarios", {}).values():
        for finding in scenario.get("findings", []):
            counts[finding["kind"]] += 1
    return dict(counts)


def pick_replay_group(reports: Path, truth_path: Path) -> str | None:
    """The group with the most dead letters: from the DLQ report's CSV, else the truth."""
    built = latest(reports, "mq_dlq_report").get("report", {})
    groups: Counter[str] = Counter()
    if built.get("csv"):
        try:
            with open(built["csv"], newline="") as f:  # RocketMQ's: the demo replays those
                rows = [r for r in csv.DictReader(f) if r.get("system") != RABBITMQ]
                groups.update(row["group"] for row in rows if row.get("group"))
        except FileNotFoundError:
            pass
    if not groups:
        for scenario in load_json(truth_path).get("scenarios", {}).values():
            for finding in scenario.get("findings", []):
                if finding.get("kind") == DEAD_LETTERED and finding.get("group"):
                    groups[finding["group"]] += 1
    return groups.most_common(1)[0][0] if groups else None


def other_clusters(truth: dict[str, Any], data_dir: Path) -> list[Path]:
    """Data dirs of the clusters the workload ran scenarios on besides `data_dir`."""
    dirs = {Path(s["data_dir"]).resolve() for s in truth.get("scenarios", {}).values()}
    return sorted(dirs - {data_dir.resolve()})


def _add(total: Counter[str], counts: dict[str, Any]) -> None:
    total.update({k: int(v) for k, v in counts.items()})


def _audited(report: dict[str, Any]) -> dict[str, Counter[str]]:
    """Findings by kind (duplicates and filtered_wrongly by cause too) of the DAG's report."""
    keys = ("duplicates", "duplicate_causes", "losses", "transactions", "filters")
    out = {key: Counter[str]() for key in keys}
    for key, counter in out.items():
        _add(counter, report.get(key, {}))
    dead = Counter({"total": int(report.get("dead_letters") or 0)})
    dead["waiting"] = int(report.get("dead_letters_waiting") or 0)
    resends = Counter({RESEND_DUE: int(report.get("resend_candidates") or 0)})
    out["dead_letters"] = dead
    out["resends"] = resends
    return out


def cluster_problems(clusters: dict[str, Any]) -> list[str]:
    """What needs a person, per cluster (the report summary's `clusters` counts)."""
    out = []
    for name, counts in sorted(clusters.items()):
        lost = sum(counts.get("losses", {}).values())
        twice = counts.get("duplicates", {}).get(DUPLICATE_EFFECT, 0)
        if lost:
            out.append(f"{name}: {lost} lost message(s)")
        if twice:
            out.append(f"{name}: {twice} message(s) processed twice")
    return out


def _found(audited: dict[str, Counter[str]]) -> dict[str, int]:
    found = {**audited["duplicates"], **audited["losses"], **audited["transactions"]}
    found.update(+audited["resends"])  # only kinds found
    found[DEAD_LETTERED] = audited["dead_letters"]["total"]
    if audited["filters"]:  # as the other kinds: counted where the audit found some
        found[FILTERED_WRONGLY] = sum(audited["filters"].values())
    return found


def _docs_index(reports: Path) -> str | None:
    index = reports / "data-docs" / "index.html"
    return str(index) if index.is_file() else None


def build_summary(
    reports: Path,
    truth_path: Path,
    workload: dict[str, Any] | None,
    timings: dict[str, float],
    out: Path,
    first_audit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`first_audit`: the summary of the mq_audit run the remedies acted on, when a later one
    verified them (the findings are counted from the first, the loop from both)."""
    after = latest(reports, "mq_audit")
    audit = first_audit or after
    built = audit.get("report", {})
    found = built.get("summary", {})
    audited = _audited(system_summary(found, ROCKETMQ))  # RabbitMQ: its own block
    clusters = found.get("clusters", {})
    resend_runs, resent = resends(reports)
    repair = latest(reports, "mq_loss_repair")
    dlq = latest(reports, "mq_dlq_report").get("report", {})
    dry, real = replays(reports)
    truth = load_json(truth_path)
    expected = truth_counts(truth)
    got = _found(audited)
    kinds = sorted(set(expected) | {k for k in COMPARED_KINDS if k in got or k in expected})
    check = {k: {"truth": expected.get(k, 0), "found": got.get(k, 0)} for k in kinds}
    for row in check.values():
        row["match"] = row["truth"] == row["found"]
    gates = audit.get("audit_gates", {}).get("tables", {})
    loop = remediation(audit, after, resend_runs, real, repair) if first_audit else None
    return {
        "out": str(out),
        "messages": {
            "workload": workload or {},
            "stored_rows_ingested": audit.get("ingest", {}).get("messages"),
        },
        "audited": {
            "mq_audit": str(out / "cluster"),
            "lake": str(out / "lake"),
            "clusters": sorted(clusters),
        },
        "clusters": clusters,  # finding counts per cluster
        "duplicates": dict(sorted(audited["duplicates"].items())),
        "duplicates_by_cause": dict(sorted(audited["duplicate_causes"].items())),
        "losses": dict(sorted(audited["losses"].items())),
        "transactions": dict(sorted(audited["transactions"].items())),
        "filters": dict(sorted(audited["filters"].items())),  # filtered_wrongly by cause
        "lag": {
            "status": found.get("lag_status", {}),
            "max_messages": found.get("lag_max_messages"),
            "max_ms": found.get("lag_max_ms"),
        },
        "dead_letters": dict(audited["dead_letters"]),
        "resends": resent,
        "replays": {
            "group": (real or dry).get("request", {}).get("group"),
            "dry_run": dry.get("by_status", {}),
            "real": real.get("by_status", {}),
        },
        "remediation": loop,
        "problems": [*found.get("problems", []), *cluster_problems(clusters)],
        "audit_gates": {t: g.get("success") for t, g in gates.items()},
        "truth_check": check if truth else "no truth.json (no workload ran)",
        "reports": {
            "audit_report": built.get("html"),
            "data_docs": _docs_index(reports),
            "dlq_report": dlq.get("html"),
            "dlq_csv": dlq.get("csv"),
            "manual_handling": str(reports / "mq_retry_resend") if resend_runs else None,
            "replays": str(reports / "mq_dlq_replay"),
            "summary": str(out / "summary.json"),
        },
        "seconds": timings,
    }


def _workload_line(w: dict[str, Any]) -> str:
    if "scenarios" not in w:
        return ", ".join(f"{k} {v}" for k, v in w.items()) or "none"
    failed = w.get("failed") or []
    text = f"{w.get('messages')} sent by the workload over {len(w['scenarios'])} scenarios"
    return text + (f" ({len(failed)} failed: {failed})" if failed else "")


def _kinds_lines(title: str, counts: dict[str, Any]) -> list[str]:
    """One line per finding kind: its count and what one counted item is."""
    if not counts:
        return [f"{title:16}none"]
    lines = [f"{title}:"]
    lines += [f"  {k:22}{v:>6}  {COUNTS.get(k, '')}" for k, v in counts.items()]
    return lines


def format_summary(s: dict[str, Any]) -> str:
    """The summary as a person reads it at the end of the demo: each number says what it
    counts and over which clusters."""

    def kv(d: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"

    names = s["audited"]["clusters"]
    scope = f"{len(names)} cluster(s) in one lake"
    dead = s["dead_letters"]
    lines = [
        "",
        "== mqaudit demo summary",
        f"messages:       {_workload_line(s['messages']['workload'])}; "
        f"{s['messages']['stored_rows_ingested']} stored copies ingested by mq_audit",
        f"audited:        by mq_audit into {s['audited']['lake']}: clusters "
        f"{', '.join(names) or 'none'}",
        f"duplicates:     {kv(s['duplicates'])}",
        f"  by cause:     {kv(s['duplicates_by_cause'])}",
        f"losses:         {kv(s['losses'])}",
        f"transactions:   {kv(s['transactions'])}",
        f"filtered wrongly: {kv(s['filters'])} (by cause)",
        f"lag:            {kv(s['lag']['status'])} (max {s['lag']['max_messages']} messages)",
        f"dead letters:   {s['dead_letters']['total']} ({s['dead_letters']['waiting']} waiting)",
        f"resends:        {kv(s['resends']['counts'])}; "
        f"{s['resends']['manual_handling']} to manual handling",
        f"findings over {scope}, by kind:",
        *_kinds_lines("duplicates", s["duplicates"]),
        f"  by cause:     {kv(s['duplicates_by_cause'])} (of delivered_twice, duplicate_effect "
        "and retried_then_ok, the cause of the first extra delivery; of stored_twice, why "
        "the copy was stored)",
        *_kinds_lines("losses", s["losses"]),
        f"dead letters:   {dead['total']} {COUNTS[DEAD_LETTERED]}; {dead['waiting']} of them "
        "not replayed",
        f"lag:            {kv(s['lag']['status'])}: {COUNTS[LAG]} by status; "
        f"the furthest behind {s['lag']['max_messages']} messages",
        f"resends:        {kv(s['resends']['counts'])} (producer stubs of "
        f"{', '.join(map(str, s['resends']['clusters'])) or 'no cluster'}, by what the resend "
        f"did); {s['resends']['manual_handling']} to manual handling",
        f"replays ({s['replays']['group']}): dry run {kv(s['replays']['dry_run'])}; "
        f"real {kv(s['replays']['real'])} (dead letters, by replay outcome)",
    ]
    if s.get("remediation"):
        lines += remediation_lines(s["remediation"])
    if s["problems"]:
        lines.append(
            "needs attention (all clusters and RabbitMQ, then each cluster by name): "
            + "; ".join(s["problems"])
        )
    check = s["truth_check"]
    if isinstance(check, dict):
        shown = [
            f"{k} {v['found']}/{v['truth']}" + ("" if v["match"] else " MISMATCH")
            for k, v in check.items()
        ]
        lines.append(
            "ground truth:   " + ", ".join(shown) + " (found by the audit / injected by the "
            f"workload, over {scope})"
        )
    else:
        lines.append(f"ground truth:   {check}")
    if "rabbitmq" in s:
        lines += rabbit_lines(s["rabbitmq"])
    lines.append("reports:")
    lines += [f"  {k:16} {v}" for k, v in s["reports"].items() if v]
    lines.append("seconds:        " + kv(s["seconds"]))
    return "\n".join(lines)
