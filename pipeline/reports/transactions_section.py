"""The audit report's transactions section: findings of `audit_transactions` by kind and
cause (a plot and the worst rows), and what needs a person (pure, over pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from broker_runtime.common import findings
from pipeline.reports.plots import Drawn, _bars, _save
from pipeline.reports.summary import TOP, _by, _records
from pipeline.reports.tables import Tables

TABLE = "audit_transactions"
# Kinds a healthy broker never has: each one is a problem for a person.
_PROBLEMS = {
    findings.HALF_STUCK: "half message(s) stuck",
    findings.CHECK_GAVE_UP: "transaction(s) given up by the check-back",
    findings.ROLLED_BACK_BUT_DELIVERED: "rolled-back message(s) delivered",
    findings.COMMITTED_TWICE: "transaction(s) committed twice",
    findings.COMMITTED_NEVER_CONSUMED: "committed message(s) never consumed (per group)",
}
COLUMNS = [
    "kind",
    "cause",
    "msg_id",
    "producer_group",
    "group",
    "count",
    "topic",
    "broker",
    "checks",
    "state",
    "age_ms",
    "detail",
]


def transactions_by_cause(tx: pd.DataFrame | None, path: Path) -> Drawn:
    if tx is None or tx.empty:
        return "No transaction findings: every transaction ended and was consumed as it should."
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    counts = tx.groupby(["cause", "kind"]).size().unstack("kind", fill_value=0)
    _bars(ax, counts, "Transaction findings by cause", "transactions (per group where named)", True)
    return _save(fig, path)


def section(tables: Tables, top: int = TOP) -> dict[str, Any]:
    """Counts by kind, the problems they are and the worst rows (the plot: render_report)."""
    tx = tables.get(TABLE, pd.DataFrame(columns=COLUMNS))
    kinds = _by(tx, "kind")
    problems = [f"{n} {_PROBLEMS[k]}" for k, n in kinds.items() if k in _PROBLEMS]
    rows = tx.sort_values(["kind", "age_ms"], ascending=[True, False]) if not tx.empty else tx
    return {
        "kinds": kinds,
        "causes": _by(tx, "cause"),
        "problems": problems,
        "rows": _records(rows.head(top), COLUMNS) if not tx.empty else [],
    }
