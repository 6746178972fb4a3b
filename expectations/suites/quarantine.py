"""Suite for `quarantine`: byte ranges of broker files that could not be parsed.

A range is `final` once the reader knows it is damage; a non-final range is the log's last
unit, possibly a write in flight, and is looked at again by the next ingest.
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe
from great_expectations.expectations.row_conditions import Column

from broker_runtime.store.segment_scan import REASONS
from expectations.suites.common import SuiteSpec, at_least, not_null, param
from pipeline.lake import TABLES

TABLE = "quarantine"

DEFAULTS = {
    # Final (certainly damaged) ranges allowed: 0 = the quarantine must be empty.
    "max_quarantine_rows": 0,
    # Non-final tails allowed; None = any number (one per store is normal while writing).
    "max_pending_quarantine_rows": None,
    # The reasons the CommitLog reader reports damaged ranges with.
    "quarantine_reasons": list(REASONS),
}

DOC = {
    "max_quarantine_rows": "at most this many final (certainly damaged) ranges",
    "max_pending_quarantine_rows": "at most this many non-final tail ranges (None: no limit)",
    "quarantine_reasons": "the reasons a range may carry",
}


def quarantine_suite() -> gx.ExpectationSuite:
    """Empty or below a threshold; every range located, sized and explained."""
    return gx.ExpectationSuite(
        name=TABLE,
        expectations=[
            gxe.ExpectTableRowCountToBeBetween(
                min_value=0,
                max_value=param("max_quarantine_rows"),
                row_condition=Column("final") == True,  # noqa: E712 (a GX condition, not a test)
            ),
            gxe.ExpectTableRowCountToBeBetween(
                min_value=0,
                max_value=param("max_pending_quarantine_rows"),
                row_condition=Column("final") == False,  # noqa: E712
            ),
            *not_null(
                ["cluster", "broker", "broker_id", "file", "position", "length", "reason", "final"]
            ),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TABLES["quarantine"].key)),
            *at_least(0, ["position", "log_offset"]),
            *at_least(1, ["length"]),
            gxe.ExpectColumnValuesToBeInSet(column="reason", value_set=param("quarantine_reasons")),
        ],
    )


SPEC = SuiteSpec(
    TABLE,
    quarantine_suite,
    DEFAULTS,
    ("cluster", "broker", "broker_id", "file", "position", "length", "reason", "final"),
    doc=DOC,
)
