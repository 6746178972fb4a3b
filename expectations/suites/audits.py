"""Suites for the audit tables: the rows are findings, the gates hold them to thresholds.

Every audit table has `msg_id`, `group` (null where not per group), `kind`, `cause` and
`count`; kinds and the other columns read here are those of pipeline.audit_schemas. Each
suite checks the findings are well formed (kind known, cause given, counts that make sense)
and, through parameters, how many findings a run may have before its gate fails. Thresholds
default to a healthy cluster; a DAG that wants the report regardless runs these gates with
`raise_on_failure=False` and shows the outcome in the report.
"""

from __future__ import annotations

from typing import Any

import great_expectations as gx
import great_expectations.expectations as gxe
from great_expectations.expectations.row_conditions import Column

from broker_runtime.common import findings
from expectations.derived import LAG_QUEUE, with_latest_snapshot
from expectations.suites.common import SuiteSpec, at_least, not_null, param

DUPLICATE_KINDS = [
    findings.STORED_TWICE,
    findings.DELIVERED_TWICE,
    findings.DUPLICATE_EFFECT,
    findings.RETRIED_THEN_OK,
]
LOSS_KINDS = list(findings.KINDS["audit_losses"])
CONSISTENCY_KINDS = [
    findings.CQ_WITHOUT_MESSAGE,
    findings.OFFSET_REGRESSION,
    findings.QUEUE_OFFSET_GAP,
]

TRANSACTION_KINDS = list(findings.KINDS["audit_transactions"])
FILTER_KINDS = list(findings.KINDS["audit_filters"])
FILTER_CAUSES = [findings.DELIVERED_BUT_EXCLUDED, findings.MATCHED_BUT_SKIPPED]

_FINDING_ID = ("kind", "cause", "group", "msg_id", "count")


def _finding(table: str, kinds: str, min_count: int, *more: gxe.Expectation) -> gx.ExpectationSuite:
    """The shared shape: kind in the `kinds` parameter's set, cause given, count >= min_count."""
    return gx.ExpectationSuite(
        name=table,
        expectations=[
            gxe.ExpectColumnToExist(column="msg_id"),
            gxe.ExpectColumnToExist(column="group"),
            *not_null(["kind", "cause", "count"]),
            gxe.ExpectColumnValuesToBeInSet(column="kind", value_set=param(kinds)),
            *at_least(min_count, ["count"]),
            *more,
        ],
    )


def _at_most(name: str, **condition: Any) -> gxe.Expectation:
    return gxe.ExpectTableRowCountToBeBetween(min_value=0, max_value=param(name), **condition)


def audit_duplicates_suite() -> gx.ExpectationSuite:
    """Duplicates name the message and happened at least twice; effects are bounded."""
    return _finding(
        "audit_duplicates",
        "duplicate_kinds",
        2,
        *not_null(["msg_id"]),
        _at_most(
            "max_duplicate_effects", row_condition=Column("kind") == findings.DUPLICATE_EFFECT
        ),
    )


def audit_losses_suite() -> gx.ExpectationSuite:
    return _finding("audit_losses", "loss_kinds", 1, *not_null(["msg_id"]), _at_most("max_losses"))


def audit_lag_suite() -> gx.ExpectationSuite:
    """One row per group, queue and snapshot; today's lag within the thresholds."""
    latest = Column("is_latest") == True  # noqa: E712 (a GX condition, not a test)
    return _finding(
        "audit_lag",
        "lag_kinds",
        0,
        *not_null([*LAG_QUEUE, "snapshot_ts", "lag_messages"]),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=[*LAG_QUEUE, "snapshot_ts"]),
        gxe.ExpectColumnValuesToBeInSet(column="status", value_set=list(findings.LAG_STATUSES)),
        *at_least(0, ["lag_messages", "lag_ms"]),
        gxe.ExpectColumnValuesToBeBetween(
            column="lag_messages", max_value=param("max_lag_messages"), row_condition=latest
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="lag_ms", max_value=param("max_lag_ms"), row_condition=latest
        ),
        gxe.ExpectColumnValuesToNotBeInSet(
            column="status", value_set=param("failing_lag_statuses"), row_condition=latest
        ),
    )


def audit_dead_letters_suite() -> gx.ExpectationSuite:
    """Every dead letter named per group; how many and how old ones may wait unreplayed."""
    waiting = Column("replayed") == False  # noqa: E712
    return _finding(
        "audit_dead_letters",
        "dead_letter_kinds",
        1,
        *not_null(["msg_id", "group", "age_ms", "replayed"]),
        # Each DLQ copy once, by where it is stored (one UNIQ_KEY may be dead-lettered twice
        # when the producer stored it twice); RabbitMQ's once per message and queue.
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["cluster", "broker", "topic", "queue_id", "queue_offset"],
            row_condition=Column("system").is_null() | (Column("system") != "rabbitmq"),
        ),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["cluster", "msg_id", "group"],
            row_condition=Column("system") == "rabbitmq",
        ),
        *at_least(0, ["age_ms"]),
        _at_most("max_dead_letters", row_condition=waiting),
        gxe.ExpectColumnValuesToBeBetween(
            column="age_ms", max_value=param("max_dead_letter_age_ms"), row_condition=waiting
        ),
    )


def resend_candidates_suite() -> gx.ExpectationSuite:
    """One candidate per stub; how many may be due at once."""
    return _finding(
        "resend_candidates",
        "resend_kinds",
        1,
        *not_null(["msg_id"]),
        gxe.ExpectColumnValuesToBeUnique(column="msg_id"),
        _at_most("max_resend_candidates"),
    )


def manual_handling_suite() -> gx.ExpectationSuite:
    """Stubs at max send count: each once; a person must look at them."""
    return _finding(
        "manual_handling",
        "manual_kinds",
        1,
        *not_null(["msg_id"]),
        gxe.ExpectColumnValuesToBeUnique(column="msg_id"),
        _at_most("max_manual_handling"),
    )


def consistency_suite() -> gx.ExpectationSuite:
    return _finding("consistency", "consistency_kinds", 1, _at_most("max_consistency_rows"))


def audit_transactions_suite() -> gx.ExpectationSuite:
    """Transaction findings name the transaction; each kind bounded (a healthy broker: none)."""
    bounds = [
        _at_most(f"max_{kind}", row_condition=Column("kind") == kind) for kind in TRANSACTION_KINDS
    ]
    return _finding(
        "audit_transactions",
        "transaction_kinds",
        1,
        *not_null(["msg_id", "producer_group", "state"]),
        *bounds,
    )


def audit_filters_suite() -> gx.ExpectationSuite:
    """A filter finding names its message, group, expression and cause; bounded (a broker
    that filters as its consumers subscribed: none)."""
    return _finding(
        "audit_filters",
        "filter_kinds",
        1,
        *not_null(["msg_id", "group", "expression", "topic", "queue_offset"]),
        gxe.ExpectColumnValuesToBeInSet(column="cause", value_set=FILTER_CAUSES),
        _at_most("max_filtered_wrongly"),
    )


_DAY_MS = 86_400_000
SPECS = [
    SuiteSpec(
        "audit_duplicates",
        audit_duplicates_suite,
        {"duplicate_kinds": DUPLICATE_KINDS, "max_duplicate_effects": 0},
        _FINDING_ID,
        doc={"max_duplicate_effects": f"at most this many `{findings.DUPLICATE_EFFECT}` rows"},
    ),
    SuiteSpec(
        "audit_losses",
        audit_losses_suite,
        {"loss_kinds": LOSS_KINDS, "max_losses": 0},
        _FINDING_ID,
        doc={"max_losses": "at most this many lost messages"},
    ),
    SuiteSpec(
        "audit_lag",
        audit_lag_suite,
        {
            "lag_kinds": [findings.LAG],
            "max_lag_messages": 10_000,
            "max_lag_ms": 15 * 60_000,
            "failing_lag_statuses": ["STALLED", "STOPPED"],
        },
        (*LAG_QUEUE, "snapshot_ts", "lag_messages", "lag_ms", "status"),
        with_latest_snapshot,
        doc={
            "max_lag_messages": "latest snapshot: lag in messages per group and queue",
            "max_lag_ms": "latest snapshot: age of the oldest unconsumed message",
            "failing_lag_statuses": "latest snapshot: statuses that fail the gate",
        },
    ),
    SuiteSpec(
        "audit_dead_letters",
        audit_dead_letters_suite,
        {
            "dead_letter_kinds": [findings.DEAD_LETTERED],
            "max_dead_letters": 100,
            "max_dead_letter_age_ms": 7 * _DAY_MS,
        },
        ("group", "msg_id", "broker", "topic", "queue_id", "queue_offset", "age_ms", "replayed"),
        doc={
            "max_dead_letters": "at most this many dead letters not yet replayed",
            "max_dead_letter_age_ms": "no unreplayed dead letter older than this",
        },
    ),
    SuiteSpec(
        "resend_candidates",
        resend_candidates_suite,
        {"resend_kinds": [findings.RESEND_DUE], "max_resend_candidates": None},
        _FINDING_ID,
        doc={"max_resend_candidates": "at most this many candidates (None: no limit)"},
    ),
    SuiteSpec(
        "manual_handling",
        manual_handling_suite,
        {"manual_kinds": [findings.MAX_SEND_COUNT], "max_manual_handling": 0},
        _FINDING_ID,
        doc={"max_manual_handling": "at most this many stubs waiting for a person"},
    ),
    SuiteSpec(
        "consistency",
        consistency_suite,
        {"consistency_kinds": CONSISTENCY_KINDS, "max_consistency_rows": 0},
        _FINDING_ID,
        doc={"max_consistency_rows": "at most this many consistency findings"},
    ),
    SuiteSpec(
        "audit_transactions",
        audit_transactions_suite,
        {"transaction_kinds": TRANSACTION_KINDS, **{f"max_{k}": 0 for k in TRANSACTION_KINDS}},
        _FINDING_ID,
        doc={f"max_{k}": f"at most this many `{k}` rows" for k in TRANSACTION_KINDS},
    ),
    SuiteSpec(
        "audit_filters",
        audit_filters_suite,
        {"filter_kinds": FILTER_KINDS, "max_filtered_wrongly": 0},
        (*_FINDING_ID, "topic", "queue_offset"),
        doc={"max_filtered_wrongly": f"at most this many `{findings.FILTERED_WRONGLY}` rows"},
    ),
]
