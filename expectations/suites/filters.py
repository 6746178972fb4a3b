"""Suite for `consumer_filters`: the SQL92 subscriptions each broker kept
(STORE/config/consumerFilter.json), one row per topic and group per snapshot.

Whether a group's messages were filtered by its expression is the filter audit's business
(audit_filters); this gate makes sure the rows are well formed enough for that audit to
mean something: each (topic, group) once per snapshot, its expression and type given, its
times epoch milliseconds.
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe

from broker_runtime.common.constants import SQL92
from expectations.suites.common import (
    MIN_TIMESTAMP_MS,
    SuiteSpec,
    at_least,
    legal_names,
    not_before,
    not_null,
    param,
)
from pipeline.lake import TABLES

TABLE = "consumer_filters"

DEFAULTS = {"min_timestamp_ms": MIN_TIMESTAMP_MS, "expression_types": [SQL92]}
DOC = {
    "min_timestamp_ms": "snapshot_ts and born_ts are epoch milliseconds at least this large",
    "expression_types": "the expression types a broker keeps (RocketMQ: SQL92 only)",
}


def consumer_filters_suite() -> gx.ExpectationSuite:
    return gx.ExpectationSuite(
        name=TABLE,
        expectations=[
            *not_null([*TABLES[TABLE].key, "expression_type", "expression", "born_ts"]),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TABLES[TABLE].key)),
            gxe.ExpectColumnValuesToBeInSet(
                column="expression_type", value_set=param("expression_types")
            ),
            *at_least(0, ["broker_id", "client_version"]),
            *legal_names(["topic", "consumer_group"]),
            gxe.ExpectColumnValuesToBeBetween(
                column="snapshot_ts", min_value=param("min_timestamp_ms")
            ),
            gxe.ExpectColumnValuesToBeBetween(
                column="born_ts", min_value=param("min_timestamp_ms")
            ),
            # RocketMQ's ConsumerFilterData is dead when deadTime >= bornTime.
            not_before("dead_ts", "born_ts"),
        ],
    )


SPEC = SuiteSpec(
    TABLE,
    consumer_filters_suite,
    DEFAULTS,
    ("cluster", "broker", "broker_id", "snapshot_ts", "topic", "consumer_group", "expression"),
    doc=DOC,
)
