"""The audit report's filters section: `audit_filters` findings by group and cause (a plot and
the rows), and what needs a person (pure, over pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from broker_runtime.common import findings
from pipeline.reports.plots import Drawn, _bars, _save
from pipeline.reports.summary import TOP, _by, _records
from pipeline.reports.tables import Tables

TABLE = "audit_filters"
PLOT = "filters_by_cause.png"
# Each cause is a broker (or client) that filtered against the group's expression.
_PROBLEMS = {
    findings.DELIVERED_BUT_EXCLUDED: "message(s) delivered though the group's SQL92 expression "
    "excludes them",
    findings.MATCHED_BUT_SKIPPED: "message(s) matching a group's SQL92 expression passed "
    "without delivery",
}
COLUMNS = [
    "cause",
    "msg_id",
    "group",
    "count",
    "expression",
    "topic",
    "broker",
    "queue_id",
    "queue_offset",
    "detail",
]


def filters_by_cause(rows: pd.DataFrame | None, path: Path) -> Drawn:
    if rows is None or rows.empty:
        return "No filter findings: every SQL92 group got exactly what its expression matches."
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    counts = rows.groupby(["group", "cause"]).size().unstack("cause", fill_value=0)
    _bars(ax, counts, "Messages filtered wrongly, by group and cause", "(message, group)", True)
    return _save(fig, path)


def section(tables: Tables, top: int = TOP) -> dict[str, Any]:
    """Counts by cause, the problems they are and the rows (the plot: render_report)."""
    rows = tables.get(TABLE, pd.DataFrame(columns=COLUMNS))
    causes = _by(rows, "cause")
    ordered = rows.sort_values(["cause", "group", "msg_id"]) if not rows.empty else rows
    return {
        "causes": causes,
        "problems": [f"{n} {_PROBLEMS[c]}" for c, n in causes.items() if c in _PROBLEMS],
        "rows": _records(ordered.head(top), COLUMNS) if not rows.empty else [],
    }
