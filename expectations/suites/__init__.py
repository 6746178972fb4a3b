"""Every table's gate, by table name: ingested tables first, then the audit tables."""

from __future__ import annotations

from expectations.suites import (
    audits,
    filters,
    ledgers,
    messages,
    quarantine,
    queues,
    transactions,
)
from expectations.suites.common import SuiteSpec, suite_parameters

SPECS: dict[str, SuiteSpec] = {
    spec.table: spec
    for spec in [
        messages.SPEC,
        queues.CONSUME_QUEUE_SPEC,
        queues.CONSUMER_OFFSETS_SPEC,
        ledgers.STUB_SPEC,
        ledgers.LOG_SPEC,
        quarantine.SPEC,
        transactions.SPEC,
        filters.SPEC,
        *audits.SPECS,
    ]
}

INGESTED_TABLES = (
    "messages",
    "consume_queue",
    "consumer_offsets",
    "message_stub",
    "message_log",
    "quarantine",
    "transactions",
    "consumer_filters",
)
AUDIT_TABLES = tuple(t for t in SPECS if t not in INGESTED_TABLES)


def spec_for(table: str) -> SuiteSpec:
    """The gate of `table`; KeyError names the tables that have one."""
    try:
        return SPECS[table]
    except KeyError:
        known = ", ".join(sorted(SPECS))
        raise KeyError(f"no expectation suite for table {table!r}; known: {known}") from None


__all__ = ["AUDIT_TABLES", "INGESTED_TABLES", "SPECS", "SuiteSpec", "spec_for", "suite_parameters"]
