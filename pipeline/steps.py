"""The audit's steps, declared once: ingest -> validate -> audit -> report (and the DLQ report).

`mqaudit pipeline <command>`, `mqaudit pipeline run`, the mq_audit DAG's in-process tasks
and its spark-submit tasks all run these `Step`s with one `RunInputs`, so a setting reaches a
step the same way whoever runs it: the validate gate's stub bound is the run's
`max_send_count` in every mode because the step reads it, not its caller.

A step in-process is `step.run(inputs, spark)`; submitted, it is `step.argv(values)`, the
command line of the `mqaudit pipeline` command that calls the same `run`. This module loads
nothing heavy (DAG files import it while they are parsed): Spark, Delta and Great
Expectations load when a step runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_runtime.common.constants import DEFAULT_MAX_SEND_COUNT, HALF_STUCK_AFTER_MS
from broker_runtime.common.progress import reporter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.results import AuditResult, IngestResult, ReportResult
    from pipeline.transforms.lag import LagThresholds

StepResult = Mapping[str, Any]  # JSON-able: pipeline.results has the records of each step
DLQ_DIR = "dlq"  # `pipeline run`: the DLQ report's folder under OUT
DOCS_DIR = "data-docs"  # `pipeline run`: Data Docs under OUT unless a folder is given


@dataclass(frozen=True)
class RunInputs:
    """Everything a step reads: one value per command-line option (see OPTIONS)."""

    lake: Path
    data_dirs: tuple[Path, ...] = ()  # one cluster each, all into the one lake
    out: Path | None = None
    docs: Path | None = None
    run_name: str = "validate"
    as_of_ms: int | None = None
    max_send_count: int = DEFAULT_MAX_SEND_COUNT
    half_stuck_ms: int = HALF_STUCK_AFTER_MS
    ledger_url: str | None = None
    rabbit_api: str | None = None  # RabbitMQ's management API: its topology is ingested too
    rabbit_vhosts: str = "/"  # comma-separated
    spark_master: str | None = None
    progress: bool = True
    # Options of the single commands that `pipeline run` and the DAGs leave at their defaults.
    broker_name: str | None = None
    cluster: str | None = None  # of a single data dir whose cluster.json names none
    broker_confs: tuple[Path, ...] = ()  # Apache RocketMQ brokers' config files
    range_bytes: int | None = None
    lag: LagThresholds | None = field(default=None)

    def __post_init__(self) -> None:
        if self.max_send_count < 1:
            raise ValueError(f"max_send_count must be >= 1, got {self.max_send_count}")
        if self.half_stuck_ms < 0:
            raise ValueError(f"half_stuck_ms must be >= 0, got {self.half_stuck_ms}")


# RunInputs field -> the option of `mqaudit pipeline <command>` that sets it.
OPTIONS: dict[str, str] = {
    "data_dirs": "--data-dir",
    "lake": "--lake",
    "out": "--out",
    "docs": "--docs",
    "run_name": "--run-name",
    "as_of_ms": "--as-of",
    "max_send_count": "--max-send-count",
    "half_stuck_ms": "--half-stuck-ms",
    "ledger_url": "--ledger-url",
    "rabbit_api": "--rabbit-api",
    "rabbit_vhosts": "--rabbit-vhosts",
}


def option_value(inputs: RunInputs, name: str) -> str:
    """The value of a RunInputs field as its option takes it (data dirs joined like PATH)."""
    value = getattr(inputs, name)
    return os.pathsep.join(map(str, value)) if name == "data_dirs" else str(value)


def split_dirs(values: list[str] | None) -> tuple[Path, ...]:
    """`--data-dir` values (repeated, each maybe several dirs joined with os.pathsep, as a
    DAG's template gives them) -> the data dirs, empty parts dropped."""
    return tuple(Path(p) for v in values or () for p in v.split(os.pathsep) if p.strip())


def gate_params(max_send_count: int) -> dict[str, dict[str, Any]]:
    """The ingested tables' gate parameters that follow the run's own settings."""
    return {"message_stub": {"max_send_count": max_send_count}}


@dataclass(frozen=True)
class Step:
    """One step: its name (task id), its command, the inputs it reads, what it does."""

    name: str
    command: str  # `mqaudit pipeline <command>` runs this step alone
    reads: tuple[str, ...]  # RunInputs fields, passed as OPTIONS when submitted
    run: Callable[[RunInputs, SparkSession | None], StepResult]
    gate: bool = False  # its failure (GateFailed) stops the run: retrying cannot help

    def argv(self, values: Mapping[str, str]) -> list[str]:
        """The command line of this step with the given option values (e.g. templates)."""
        args = [self.command]
        for name in self.reads:
            args += [OPTIONS[name], values[name]]
        return args


def _ingest(inputs: RunInputs, spark: SparkSession | None) -> IngestResult:
    from pipeline.jobs.ingest import run_ingest
    from pipeline.readers.commitlog import DEFAULT_RANGE_BYTES

    if not inputs.data_dirs and not inputs.broker_confs:
        raise ValueError("ingest needs a data dir or brokers' config files")
    if inputs.rabbit_api:
        from pipeline.jobs.rabbit import api_credentials

        api_credentials(inputs.rabbit_api)  # a bad URL is refused before anything is read
    result = run_ingest(
        inputs.data_dirs,
        inputs.lake,
        spark,
        master=inputs.spark_master,
        ledger_url=inputs.ledger_url,
        broker_name=inputs.broker_name,
        cluster=inputs.cluster,
        broker_confs=inputs.broker_confs,
        range_bytes=inputs.range_bytes or DEFAULT_RANGE_BYTES,
        progress=inputs.progress,
        allow_no_brokers=inputs.rabbit_api is not None,  # RabbitMQ alone: only its ledgers
    )
    if inputs.rabbit_api:
        result["rabbit_topology"] = _rabbit_topology(inputs, inputs.rabbit_api, spark)
    return result


def _rabbit_topology(inputs: RunInputs, rabbit_api: str, spark: SparkSession | None) -> int:
    """Snapshot RabbitMQ's topology into the lake, as `ingest-rabbit` does: the audit then
    routes this interval's RabbitMQ publishes by the bindings of their time."""
    from pipeline.jobs.rabbit import api_credentials, ingest_topology

    api, user, password = api_credentials(rabbit_api)
    vhosts = [v for v in inputs.rabbit_vhosts.split(",") if v] or ["/"]
    session = _spark(spark, inputs, "ingest")
    return ingest_topology(
        session, inputs.lake, api, vhosts, user=user, password=password, progress=inputs.progress
    )


def _validate(inputs: RunInputs, spark: SparkSession | None) -> dict[str, Any]:
    """Gate every ingested table; raises GateFailed (naming the expectations and sample
    rows) if any fails. Data Docs go to `inputs.docs`."""
    from expectations.gates import run_all_gates
    from expectations.suites import INGESTED_TABLES
    from pipeline.lake import read_tables

    tables = read_tables(inputs.lake, INGESTED_TABLES, _spark(spark, inputs, "validate"))
    summary: dict[str, Any] = run_all_gates(
        tables,
        docs_dir=inputs.docs,
        params=gate_params(inputs.max_send_count),
        run_name=inputs.run_name,
        progress=reporter("gate", inputs.progress),
    )
    return summary


def _audit(inputs: RunInputs, spark: SparkSession | None) -> AuditResult:
    from pipeline.jobs.audit import AuditThresholds, run_audit
    from pipeline.transforms.lag import LagThresholds

    thresholds = AuditThresholds(
        inputs.lag or LagThresholds(), inputs.max_send_count, inputs.half_stuck_ms
    )
    return run_audit(
        inputs.lake,
        spark,
        inputs.as_of_ms,
        thresholds,
        master=inputs.spark_master,
        progress=inputs.progress,
    )


def _report(inputs: RunInputs, spark: SparkSession | None) -> ReportResult:
    """The audit tables' gates into Data Docs (reported, never failing: findings are what an
    audit is for), then the audit report. Without a Data Docs folder, the report alone."""
    from pipeline.reports.audit_report import build_report

    if inputs.out is None:
        raise ValueError("report needs an output folder")
    spark = _spark(spark, inputs, "report")
    gates = _gate_audits(inputs, spark) if inputs.docs is not None else None
    result: ReportResult = {"report": build_report(inputs.lake, inputs.out, docs_dir=inputs.docs)}
    if gates is not None:
        result["audit_gates"] = gates
    return result


def _gate_audits(inputs: RunInputs, spark: SparkSession) -> dict[str, Any]:
    from expectations.gates import run_all_gates
    from pipeline.lake import AUDIT_TABLES, existing, read_tables

    names = existing(inputs.lake, AUDIT_TABLES)
    summary: dict[str, Any] = run_all_gates(
        read_tables(inputs.lake, names, spark),
        docs_dir=inputs.docs,
        run_name=f"{inputs.run_name}-audits",
        raise_on_failure=False,
        progress=None,
    )
    return summary


def _dlq_report(inputs: RunInputs, spark: SparkSession | None) -> dict[str, Any]:
    """Without Spark: the report reads one small table with pyarrow."""
    from pipeline.reports.dlq_report import build_dlq_report

    if inputs.out is None:
        raise ValueError("dlq-report needs an output folder")
    return build_dlq_report(inputs.lake, inputs.out)


def _spark(spark: SparkSession | None, inputs: RunInputs, name: str) -> SparkSession:
    from pipeline.spark_session import build_spark

    return spark or build_spark(f"mqaudit-{name}", inputs.spark_master)


INGEST = Step(
    "ingest", "ingest", ("data_dirs", "lake", "ledger_url", "rabbit_api", "rabbit_vhosts"), _ingest
)
VALIDATE = Step(
    "validate", "validate", ("lake", "docs", "run_name", "max_send_count"), _validate, gate=True
)
AUDIT = Step("audit", "audit", ("lake", "as_of_ms", "max_send_count", "half_stuck_ms"), _audit)
REPORT = Step("report", "report", ("lake", "out", "docs", "run_name"), _report)
DLQ_REPORT = Step("dlq_report", "dlq-report", ("lake", "out"), _dlq_report)

AUDIT_STEPS: tuple[Step, ...] = (INGEST, VALIDATE, AUDIT, REPORT)  # the mq_audit DAG's tasks
STEPS: dict[str, Step] = {s.command: s for s in (*AUDIT_STEPS, DLQ_REPORT)}


def dlq_inputs(inputs: RunInputs) -> RunInputs:
    """`pipeline run`'s inputs for the DLQ report: its own folder under OUT."""
    assert inputs.out is not None
    return replace(inputs, out=inputs.out / DLQ_DIR)
