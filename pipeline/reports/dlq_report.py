"""The dead-letter report: `DIR/dlq_report.html` (per group, by age, oldest messages) and
`DIR/dead_letters.csv` with every dead letter and its retry chain."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.reports import plots
from pipeline.reports.render import timestamp, write_html
from pipeline.reports.tables import load_tables

HTML = "dlq_report.html"
CSV = "dead_letters.csv"
PLOT = "dead_letters_by_group_age.png"
HTML_ROWS = 500
CSV_COLUMNS = [
    "group",
    "msg_id",
    "original_topic",
    "origin_msg_id",
    "topic",
    "broker",
    "queue_id",
    "queue_offset",
    "first_ts",
    "last_ts",
    "age_ms",
    "count",
    "retries",
    "chain",
    "deliveries",
    "last_outcome",
    "replayed",
    "replay_status",
    "replayed_at",
    "cause",
    "as_of_ms",
    "system",  # rocketmq or rabbitmq (a RabbitMQ group is its queue)
    "cluster",
]


def chain_text(chain: Any) -> str:
    """A retry chain as `#reconsume at time; ...`."""
    if chain is None:
        return ""
    steps = [dict(s) for s in chain]
    return "; ".join(f"#{s['reconsume_times']} {timestamp(s['store_ts'])}" for s in steps)


def _groups(dlq: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for (cluster, group), rows in dlq.groupby(["cluster", "group"]):
        waiting = rows[~rows["replayed"].astype(bool)]
        out.append(
            {
                "cluster": cluster,
                "group": group,
                "total": len(rows),
                "waiting": len(waiting),
                "oldest_ms": int(waiting["age_ms"].max()) if not waiting.empty else None,
                "topics": ", ".join(sorted(rows["original_topic"].dropna().unique())),
            }
        )
    return out


def render_dlq_report(dlq: pd.DataFrame, out: Path, lake: str = "") -> dict[str, Any]:
    """Write the report for the loaded `audit_dead_letters` rows; returns paths and counts."""
    out.mkdir(parents=True, exist_ok=True)
    dlq = dlq.assign(chain=[chain_text(c) for c in dlq["retry_chain"]])
    dlq = dlq.sort_values(["age_ms", "group", "msg_id"], ascending=[False, True, True])
    dlq[CSV_COLUMNS].to_csv(out / CSV, index=False)
    plot = plots.dead_letters_by_group_and_age(dlq, out / PLOT)
    waiting = dlq[~dlq["replayed"].astype(bool)]
    shown = dlq.head(HTML_ROWS)[CSV_COLUMNS].astype(object)
    html = write_html(
        "dlq.html.j2",
        out / HTML,
        lake=lake,
        as_of=int(dlq["as_of_ms"].max()) if not dlq.empty else None,
        generated=int(time.time() * 1000),
        csv=CSV,
        plot=plot.name if isinstance(plot, Path) else None,
        plot_note=plot if isinstance(plot, str) else None,
        total=len(dlq),
        waiting=len(waiting),
        oldest=int(waiting["age_ms"].max()) if not waiting.empty else None,
        groups=_groups(dlq),
        rows=shown.where(shown.notna(), None).to_dict("records"),
    )
    return {
        "html": str(html),
        "csv": str(out / CSV),
        "plots": [str(plot)] if isinstance(plot, Path) else [],
        "dead_letters": len(dlq),
        "not_replayed": len(waiting),
    }


def build_dlq_report(
    lake: str | Path,
    out: str | Path,
) -> dict[str, Any]:
    """Read `audit_dead_letters` from the lake and write the DLQ report to `out`."""
    tables = load_tables(lake, ("audit_dead_letters",))
    return render_dlq_report(tables["audit_dead_letters"], Path(out), str(Path(lake).resolve()))
