"""Suite for `transactions`: one row per transaction, derived from the half, op, check-max and
committed units of `messages` (pipeline.transforms.transactions).

Whether a transaction is stuck, given up, committed twice or rolled back but delivered is the
transaction audit's business (audit_transactions); this gate makes sure the derived rows are
well formed enough for that audit to mean something: each transaction once, its half message
located, its state known, its times in order.
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe

from broker_runtime.common.findings import TX_STATES
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

TABLE = "transactions"

DEFAULTS = {"min_timestamp_ms": MIN_TIMESTAMP_MS, "transaction_states": list(TX_STATES)}
DOC = {
    "min_timestamp_ms": "half_ts is epoch milliseconds at least this large",
    "transaction_states": "the states a transaction may be in",
}


def transactions_suite() -> gx.ExpectationSuite:
    return gx.ExpectationSuite(
        name=TABLE,
        expectations=[
            *not_null(
                [
                    "cluster",
                    "broker",
                    "producer_group",
                    "uniq_key",
                    "topic",
                    "half_queue_offset",
                    "half_phys_offset",
                    "half_units",
                    "checks",
                    "half_ts",
                    "state",
                ]
            ),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TABLES[TABLE].key)),
            gxe.ExpectColumnValuesToBeInSet(column="state", value_set=param("transaction_states")),
            *at_least(1, ["half_units"]),
            *at_least(0, ["checks", "ops", "commits", "half_queue_offset", "half_phys_offset"]),
            *legal_names(["topic"]),
            gxe.ExpectColumnValuesToBeBetween(
                column="half_ts", min_value=param("min_timestamp_ms")
            ),
            # One clock (the broker's) stored every unit: nothing ends before it began.
            not_before("last_half_ts", "half_ts"),
            not_before("op_ts", "half_ts"),
            not_before("commit_ts", "half_ts"),
            not_before("gave_up_ts", "half_ts"),
        ],
    )


SPEC = SuiteSpec(
    TABLE,
    transactions_suite,
    DEFAULTS,
    ("cluster", "broker", "producer_group", "uniq_key", "topic", "half_queue_offset", "state"),
    doc=DOC,
)
