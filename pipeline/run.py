"""`mqaudit pipeline run`: every step of `pipeline.steps` in order, over one Spark session.

The mq_audit DAG's steps (ingest, validate, audit, report), then the DLQ report into OUT/dlq.
A failed gate on the ingested tables stops the run: the audit and the reports are not
written from data that failed them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker_runtime.common.progress import reporter
from pipeline.steps import (
    AUDIT,
    AUDIT_STEPS,
    DLQ_REPORT,
    DOCS_DIR,
    INGEST,
    REPORT,
    RunInputs,
    StepResult,
    dlq_inputs,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class RunFailed(Exception):
    """A step stopped the run; `summary` holds what the steps before it did and wrote."""

    def __init__(self, step: str, cause: Exception, summary: dict[str, Any]) -> None:
        self.step = step
        self.summary = summary
        super().__init__(f"step {step} failed: {cause}")


def run_pipeline(inputs: RunInputs, spark: SparkSession | None = None) -> dict[str, Any]:
    """Every step in order; returns the paths written and what each step found.

    Raises RunFailed (its `summary` says how far the run got) when a gate fails.
    """
    from expectations.results import GateFailed
    from pipeline.spark_session import build_spark

    started = time.monotonic()
    if inputs.out is None:
        raise ValueError("pipeline run needs an output folder")
    out = inputs.out.resolve()
    docs = inputs.docs.resolve() if inputs.docs is not None else out / DOCS_DIR
    run_name = f"pipeline-run-{int(time.time() * 1000)}"
    inputs = replace(inputs, lake=inputs.lake.resolve(), out=out, docs=docs, run_name=run_name)
    summary: dict[str, Any] = {"ok": False, "lake": str(inputs.lake), "out": str(out)}
    summary["data_docs"] = str(docs / "index.html")
    spark = spark or build_spark("mqaudit-run", inputs.spark_master)
    seconds: dict[str, float] = {}
    results: dict[str, StepResult] = {}
    plan = [(step, inputs) for step in AUDIT_STEPS] + [(DLQ_REPORT, dlq_inputs(inputs))]
    say = reporter("run", inputs.progress)
    for step, step_inputs in plan:
        say(step.name)
        t = time.monotonic()
        try:
            results[step.name] = step.run(step_inputs, spark)
        except GateFailed as e:
            summary |= {"failed_step": step.name, "seconds": seconds}
            raise RunFailed(step.name, e, summary) from e
        seconds[step.name] = round(time.monotonic() - t, 3)
        if step is INGEST:
            ingested = results[INGEST.name]
            summary |= {"ingested_messages": ingested["messages"], "appended": ingested["appended"]}
            summary |= {"backend": ingested["backend"], "readers": ingested["readers"]}
    seconds["total"] = round(time.monotonic() - started, 3)
    return summary | _outcome(results) | {"ok": True, "seconds": seconds}


def _outcome(results: dict[str, StepResult]) -> dict[str, Any]:
    audited, reported = results[AUDIT.name], results[REPORT.name]
    report, dlq = reported["report"], results[DLQ_REPORT.name]
    return {
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
    }
