"""Suites for `consume_queue` (index entries) and `consumer_offsets` (offset snapshots).

Whether an entry points at a matching message, and whether a committed offset went back
between snapshots, are findings of the consistency audit; these gates only make sure the
ingested rows are well formed enough for that audit to mean something.
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe

from expectations.derived import with_consume_queue_checks
from expectations.suites.common import (
    MIN_TIMESTAMP_MS,
    SuiteSpec,
    at_least,
    increasing,
    legal_names,
    not_null,
    param,
)
from pipeline.lake import TABLES

CONSUME_QUEUE = "consume_queue"
CONSUMER_OFFSETS = "consumer_offsets"


def consume_queue_suite() -> gx.ExpectationSuite:
    """One entry per (store, topic, queue, offset), pointing forward in the commitlog."""
    return gx.ExpectationSuite(
        name=CONSUME_QUEUE,
        expectations=[
            *not_null(
                [
                    *("cluster", "broker", "broker_id", "topic", "queue_id", "queue_offset"),
                    *("phys_offset", "size"),
                ]
            ),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TABLES["consume_queue"].key)),
            *at_least(0, ["broker_id", "queue_id", "queue_offset", "phys_offset"]),
            *at_least(1, ["size"]),
            *legal_names(["topic"]),
            # Entries are appended in commitlog order: a later queue offset never points
            # back (see expectations.derived).
            increasing("phys_offset", "prev_phys_offset"),
        ],
    )


CONSUMER_OFFSETS_DEFAULTS = {"min_timestamp_ms": MIN_TIMESTAMP_MS}


def consumer_offsets_suite() -> gx.ExpectationSuite:
    """One committed offset per snapshot, store, group, topic and queue; none negative."""
    return gx.ExpectationSuite(
        name=CONSUMER_OFFSETS,
        expectations=[
            *not_null([*TABLES["consumer_offsets"].key, "committed_offset"]),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TABLES["consumer_offsets"].key)),
            *at_least(0, ["broker_id", "queue_id", "committed_offset", "max_offset"]),
            *legal_names(["topic", "consumer_group"]),
            gxe.ExpectColumnValuesToBeBetween(
                column="snapshot_ts", min_value=param("min_timestamp_ms")
            ),
        ],
    )


CONSUME_QUEUE_SPEC = SuiteSpec(
    CONSUME_QUEUE,
    consume_queue_suite,
    {},
    ("cluster", "broker", "broker_id", "topic", "queue_id", "queue_offset", "phys_offset"),
    with_consume_queue_checks,
)
CONSUMER_OFFSETS_SPEC = SuiteSpec(
    CONSUMER_OFFSETS,
    consumer_offsets_suite,
    CONSUMER_OFFSETS_DEFAULTS,
    ("cluster", "broker", "broker_id", "snapshot_ts", "consumer_group", "topic", "queue_id"),
    doc={"min_timestamp_ms": "snapshot_ts is epoch milliseconds at least this large"},
)
