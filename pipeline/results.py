"""What the audit's jobs and steps return: typed records, plain JSON-able dicts at run time
(they travel as Airflow XComs and are printed as JSON by the commands)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class IngestResult(TypedDict):
    run: int | None  # None: nothing new to ingest
    resumed: bool
    backend: str  # the Delta backend: "delta-rs" or "delta-spark"
    lake: str
    brokers: list[dict[str, Any]]  # per broker and source: offsets planned and read
    messages: int
    readers: list[str]  # the CommitLog decoders the workers loaded: "c", "python"
    appended: dict[str, int]  # rows per table
    quarantine: dict[str, int]  # damaged ranges per reason
    warnings: list[str]
    seconds: float
    rabbit_topology: NotRequired[int]  # topology rows appended (a RabbitMQ API was given)


class AuditTable(TypedDict):
    rows: int
    written: bool  # False: the table already held the same rows
    kinds: dict[str, dict[str, int]]  # kind -> cause -> findings
    latest_status: NotRequired[dict[str, int]]  # audit_lag: queues per lag status


class AuditResult(TypedDict):
    lake: str
    as_of_ms: int
    backend: str
    thresholds: dict[str, Any]
    tables: dict[str, AuditTable]
    seconds: float


class ReportResult(TypedDict):
    report: dict[str, Any]  # the audit report's paths and summary
    audit_gates: NotRequired[dict[str, Any]]  # the audit tables' gates, when Data Docs are kept
