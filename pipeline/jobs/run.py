"""`mqaudit pipeline run`: ingest -> validate -> audit -> report over one Spark session.

The steps are the functions the mq_audit DAG's tasks call: `run_ingest`, `validate_ingested`
(the gate: a failure stops the run), `run_audit`, and `report_step` (the audit tables'
gates, reported but not failing, then the reports). `mqaudit pipeline validate` and
`spark_app.py validate` run `validate_ingested` alone.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from expectations.checkpoints import GateFailed, run_all_gates
from expectations.suites import INGESTED_TABLES
from pipeline import schemas as S
from pipeline.audit_schemas import AUDIT_TABLES
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.jobs.audit import AuditThresholds, run_audit
from pipeline.jobs.ingest import run_ingest, table_path
from pipeline.reports.audit_report import build_report
from pipeline.reports.dlq_report import build_dlq_report
from pipeline.spark_session import build_spark

DLQ_DIR = "dlq"  # the DLQ report's folder under OUT (its plot has the audit report's name)
DOCS_DIR = "data-docs"  # Data Docs under OUT unless a folder is given


class RunFailed(Exception):
    """A step stopped the run; `summary` holds what the steps before it did and wrote."""

    def __init__(self, step: str, cause: Exception, summary: dict[str, Any]) -> None:
        self.step = step
        self.summary = summary
        super().__init__(f"step {step} failed: {cause}")


def gate_params(max_send_count: int | None) -> dict[str, dict[str, Any]]:
    """The ingested tables' gate parameters that follow the run's own settings."""
    if max_send_count is None:
        return {}
    return {"message_stub": {"max_send_count": max_send_count}}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def validate_ingested(
    spark: SparkSession,
    lake: str | Path,
    docs_dir: str | Path,
    run_name: str,
    params: dict[str, dict[str, Any]] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Gate every ingested table of `lake`; raises GateFailed (naming the expectations and
    sample rows) if any fails. Data Docs go to `docs_dir`."""
    io = DeltaIO(spark)
    tables = {t: io.read(table_path(lake, t), S.TABLES[t]) for t in INGESTED_TABLES}
    summary: dict[str, Any] = run_all_gates(
        tables,
        docs_dir=docs_dir,
        params=params,
        run_name=run_name,
        progress=_stderr if progress else None,
    )
    return summary


def gate_audits(
    spark: SparkSession, lake: str | Path, docs_dir: str | Path, run_name: str
) -> dict[str, Any]:
    """The audit tables' gates (their thresholds) without failing: the outcome for a report.

    Findings are what the audit is for; a run that found losses has done its job."""
    io = DeltaIO(spark)
    tables = {
        t: io.read(table_path(lake, t), schema)
        for t, schema in AUDIT_TABLES.items()
        if table_exists(table_path(lake, t))
    }
    summary: dict[str, Any] = run_all_gates(
        tables, docs_dir=docs_dir, run_name=run_name, raise_on_failure=False, progress=None
    )
    return summary


def report_step(
    spark: SparkSession, lake: str | Path, out: Path, docs_dir: Path, run_name: str
) -> dict[str, Any]:
    """The audit tables' gates into Data Docs, then the audit report and the DLQ report."""
    gates = gate_audits(spark, lake, docs_dir, run_name)
    audit = build_report(lake, out, spark, docs_dir=docs_dir)
    dlq = build_dlq_report(lake, out / DLQ_DIR, spark)
    return {"audit_gates": gates, "report": audit, "dlq_report": dlq}


def run_pipeline(
    data_dir: str | Path,
    lake: str | Path,
    out: str | Path,
    *,
    docs_dir: str | Path | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    as_of_ms: int | None = None,
    thresholds: AuditThresholds | None = None,
    ledger_url: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Every step in order; returns the paths written and what each step found.

    Raises RunFailed (its `summary` says how far the run got) when a gate on the ingested
    tables fails: the audit and the reports are not written from data that failed them.
    """
    started = time.monotonic()
    thresholds = thresholds or AuditThresholds()
    out = Path(out).resolve()
    docs = Path(docs_dir).resolve() if docs_dir is not None else out / DOCS_DIR
    lake = Path(lake).resolve()
    run_name = f"pipeline-run-{int(time.time() * 1000)}"
    summary: dict[str, Any] = {"ok": False, "lake": str(lake), "out": str(out)}
    summary["data_docs"] = str(docs / "index.html")
    spark = spark or build_spark("mqaudit-run", master)
    seconds: dict[str, float] = {}

    def step(name: str) -> float:
        if progress:
            _stderr(f"run: {name}")
        return time.monotonic()

    t = step("ingest")
    ingested = run_ingest(data_dir, lake, spark, ledger_url=ledger_url, progress=progress)
    seconds["ingest"] = round(time.monotonic() - t, 3)
    summary |= {"ingested_messages": ingested["messages"], "appended": ingested["appended"]}
    summary |= {"backend": ingested["backend"], "readers": ingested["readers"]}
    t = step("validate")
    try:
        validate_ingested(
            spark, lake, docs, run_name, gate_params(thresholds.max_send_count), progress
        )
    except GateFailed as e:
        summary |= {"failed_step": "validate", "seconds": seconds}
        raise RunFailed("validate", e, summary) from e
    seconds["validate"] = round(time.monotonic() - t, 3)
    t = step("audit")
    audited = run_audit(lake, spark, as_of_ms, thresholds, progress=progress)
    seconds["audit"] = round(time.monotonic() - t, 3)
    t = step("report")
    reported = report_step(spark, lake, out, docs, f"{run_name}-audits")
    seconds["report"] = round(time.monotonic() - t, 3)
    seconds["total"] = round(time.monotonic() - started, 3)
    report, dlq = reported["report"], reported["dlq_report"]
    return summary | {
        "ok": True,
        "as_of_ms": audited["as_of_ms"],
        "audit_rows": {name: table["rows"] for name, table in audited["tables"].items()},
        "audit_gates": {
            name: g["success"] for name, g in reported["audit_gates"]["tables"].items()
        },
        "problems": report["summary"].get("problems", []),
        "report": report["html"],
        "plots": report["plots"],
        "dlq_report": dlq["html"],
        "dead_letters_csv": dlq["csv"],
        "seconds": seconds,
    }
