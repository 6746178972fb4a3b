"""The audit report: `DIR/audit_report.html` with its plots as PNG files next to it.

What needs attention first, per group; then the summary's numbers, each saying what it
counts; then per finding type a plot (or the sentence why there is none) and its rows, paged
and filterable, each message with the command that looks it up on the brokers; and a link to
the Great Expectations Data Docs when a docs folder is given.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from broker_runtime.common import findings
from pipeline.reports import filters_section, plots, transactions_section
from pipeline.reports.render import write_html
from pipeline.reports.summary import attention, summarize, worst
from pipeline.reports.tables import Tables, load_tables

HTML = "audit_report.html"
PLOTS = {
    "lag": "lag_over_time.png",
    "duplicates": "duplicates_by_cause.png",
    "dead_letters": "dead_letters_by_group_age.png",
    "losses": "losses_by_cause.png",
    "transactions": "transactions_by_cause.png",
    "filters": filters_section.PLOT,
}


def _docs_link(out: Path, docs_dir: Path | None) -> tuple[str | None, str | None]:
    """(relative link to the Data Docs index, or a note why there is none)."""
    if docs_dir is None:
        return None, None
    index = Path(docs_dir).resolve() / "index.html"
    if not index.is_file():
        return None, f"No Data Docs at {index} yet (the validation step writes them)."
    return os.path.relpath(index, out.resolve()), None


def render_report(
    tables: Tables, out: Path, lake: str = "", docs_dir: Path | None = None
) -> dict[str, Any]:
    """Write the report for already loaded audit tables; returns its paths and summary."""
    out.mkdir(parents=True, exist_ok=True)
    written = {
        "lag": plots.lag_over_time(tables["audit_lag"], out / PLOTS["lag"]),
        "duplicates": plots.duplicates_by_cause(
            tables["audit_duplicates"], out / PLOTS["duplicates"]
        ),
        "dead_letters": plots.dead_letters_by_group_and_age(
            tables["audit_dead_letters"], out / PLOTS["dead_letters"]
        ),
        "losses": plots.losses_by_cause(tables["audit_losses"], out / PLOTS["losses"]),
        "transactions": transactions_section.transactions_by_cause(
            tables.get(transactions_section.TABLE), out / PLOTS["transactions"]
        ),
        "filters": filters_section.filters_by_cause(
            tables.get(filters_section.TABLE), out / PLOTS["filters"]
        ),
    }
    drawn = {k: p for k, p in written.items() if isinstance(p, Path)}
    summary = summarize(tables)
    tx = transactions_section.section(tables)
    summary["transactions"] = tx["kinds"]
    fw = filters_section.section(tables)
    summary["filters"] = fw["causes"]
    summary["problems"] = [*summary["problems"], *tx["problems"], *fw["problems"]]
    docs, docs_note = _docs_link(out, docs_dir)
    html = write_html(
        "audit.html.j2",
        out / HTML,
        lake=lake,
        s=summary,
        attention=attention(tables),
        counts=findings.COUNTS,
        worst=worst(tables),
        plots={k: p.name for k, p in drawn.items()},
        notes={k: p for k, p in written.items() if isinstance(p, str)},
        docs=docs,
        docs_note=docs_note,
        tx=tx,
        fw=fw,
        generated=int(time.time() * 1000),
    )
    return {
        "html": str(html),
        "plots": [str(p) for p in drawn.values()],
        "data_docs": docs,
        "summary": summary,
    }


def build_report(
    lake: str | Path,
    out: str | Path,
    docs_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Read the lake's audit tables and write the audit report to `out`."""
    tables = load_tables(lake)
    docs = Path(docs_dir) if docs_dir is not None else None
    return render_report(tables, Path(out), str(Path(lake).resolve()), docs)
