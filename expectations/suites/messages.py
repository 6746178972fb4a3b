"""Suite for `messages`: one row per message unit stored in a broker's commitlog.

UNIQ_KEY is deliberately not expected unique: a producer resend stores the same UNIQ_KEY
twice, and finding those is the duplicates audit's job, not a reason to stop the pipeline.
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe

from broker_runtime.common.constants import MAX_RECONSUME_TIMES
from expectations.derived import with_message_checks
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

TABLE = "messages"

DEFAULTS = {
    # store_ts may lie this far before born_ts: born_ts comes from the producer's clock.
    "clock_skew_ms": 1_000,
    # Share of rows whose BODYCRC matches the body; 1.0 = any corrupt body fails the gate.
    "min_crc_ok_ratio": 1.0,
    # maxReconsumeTimes (RocketMQ's default 16): retries and DLQ copies never count higher.
    "max_reconsume_times": MAX_RECONSUME_TIMES,
    "min_timestamp_ms": MIN_TIMESTAMP_MS,
}

DOC = {
    "clock_skew_ms": "store_ts >= born_ts - clock_skew_ms (producer vs broker clock)",
    "min_crc_ok_ratio": "mean of crc_ok must be at least this",
    "max_reconsume_times": "reconsume_times in [0, max_reconsume_times]",
    "min_timestamp_ms": "born_ts and store_ts are epoch milliseconds at least this large",
}

ROW_ID = (
    *("cluster", "broker", "broker_id", "topic", "queue_id", "queue_offset", "phys_offset"),
    "uniq_key",
)


def messages_suite() -> gx.ExpectationSuite:
    """Keys unique, offsets sane and ordered per queue, times consistent, CRCs good."""
    return gx.ExpectationSuite(
        name=TABLE,
        expectations=[
            *not_null(
                [
                    "cluster",
                    "broker",
                    "broker_id",
                    "phys_offset",
                    "topic",
                    "queue_id",
                    "queue_offset",
                    "born_ts",
                    "store_ts",
                    "reconsume_times",
                    "crc_ok",
                    "is_retry",
                    "is_dlq",
                ]
            ),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TABLES["messages"].key)),
            *at_least(0, ["broker_id", "phys_offset", "queue_id", "queue_offset"]),
            *legal_names(["topic"]),
            # Within one queue of one store, the later a message sits in the commitlog the
            # higher its queue offset (see expectations.derived).
            increasing("queue_offset", "prev_queue_offset"),
            gxe.ExpectColumnValuesToBeBetween(
                column="store_before_born_ms", max_value=param("clock_skew_ms")
            ),
            gxe.ExpectColumnValuesToBeBetween(
                column="born_ts", min_value=param("min_timestamp_ms")
            ),
            gxe.ExpectColumnValuesToBeBetween(
                column="store_ts", min_value=param("min_timestamp_ms")
            ),
            gxe.ExpectColumnValuesToBeBetween(
                column="reconsume_times", min_value=0, max_value=param("max_reconsume_times")
            ),
            # The CRC ratio as a mostly-threshold rather than a mean: same test, and the
            # rows with a bad CRC are listed instead of one number.
            gxe.ExpectColumnValuesToBeInSet(
                column="crc_ok", value_set=[True], mostly=param("min_crc_ok_ratio")
            ),
        ],
    )


SPEC = SuiteSpec(TABLE, messages_suite, DEFAULTS, ROW_ID, with_message_checks, DOC)
