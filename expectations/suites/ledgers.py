"""Suites for the ledgers: `message_stub` (producer side) and `message_log` (consumer side).

Value sets are the ledger schema's own enums; the send count bound is the resend job's max
send count, a parameter because deployments set it.
"""

from __future__ import annotations

from collections.abc import Sequence

import great_expectations as gx
import great_expectations.expectations as gxe
from great_expectations.expectations.row_conditions import Column

from broker_runtime.common.constants import DEFAULT_MAX_SEND_COUNT, MAX_RECONSUME_TIMES
from broker_runtime.ledger.schema import Outcome, Settle, StubStatus, System
from expectations.suites.common import (
    END,
    MIN_TIMESTAMP_MS,
    SuiteSpec,
    at_least,
    legal_names,
    not_before,
    not_null,
    param,
)
from pipeline.lake import TABLES

MESSAGE_STUB = "message_stub"
MESSAGE_LOG = "message_log"

STUB_STATUSES = [s.value for s in StubStatus]
LOG_OUTCOMES = [o.value for o in Outcome]  # NULL while in progress
SYSTEMS = [s.value for s in System]
# RocketMQ's rows: its names and queue coordinates (a RabbitMQ exchange or queue is named
# more freely, "" being the default exchange, and a confirm names no queue).
# Rows ingested before `system` existed have none: they are RocketMQ's.
ROCKETMQ_ROWS = Column("system").is_null() | (Column("system") != System.RABBITMQ.value)
_CONFIRMED = Column("status") == StubStatus.CONFIRMED.value
ROCKETMQ_CONFIRMED = (_CONFIRMED & Column("system").is_null()) | (
    _CONFIRMED & (Column("system") != System.RABBITMQ.value)
)

STUB_DEFAULTS = {
    # The resend job's max send count: a stub never goes past it.
    "max_send_count": DEFAULT_MAX_SEND_COUNT,
    "min_timestamp_ms": MIN_TIMESTAMP_MS,
}
LOG_DEFAULTS = {
    "max_reconsume_times": MAX_RECONSUME_TIMES,
    "min_timestamp_ms": MIN_TIMESTAMP_MS,
}


def _unique(key: Sequence[str]) -> list[gxe.Expectation]:
    """A ledger's key is its own (msg_id, id) within its cluster."""
    return [gxe.ExpectCompoundColumnsToBeUnique(column_list=list(key))]


def message_stub_suite() -> gx.ExpectationSuite:
    """One stub per msg id, a known status, a sha256 body hash, times in order."""
    return gx.ExpectationSuite(
        name=MESSAGE_STUB,
        expectations=[
            *not_null(
                [
                    *("cluster", "msg_id", "topic", "body_hash", "status", "send_count"),
                    *("created_at", "updated_at"),
                ]
            ),
            *_unique(TABLES["message_stub"].key),
            gxe.ExpectColumnValuesToBeInSet(column="status", value_set=STUB_STATUSES),
            gxe.ExpectColumnValuesToBeInSet(column="system", value_set=SYSTEMS),
            *legal_names(["topic"], ROCKETMQ_ROWS),
            gxe.ExpectColumnValuesToMatchRegex(column="body_hash", regex=rf"^[0-9a-f]{{64}}{END}"),
            gxe.ExpectColumnValuesToBeBetween(
                column="send_count", min_value=0, max_value=param("max_send_count")
            ),
            *at_least(0, ["queue_id", "queue_offset"]),
            # Confirming a stub writes where the broker stored it, in the same update (for
            # RabbitMQ only the virtual host).
            gxe.ExpectColumnValuesToNotBeNull(
                column="broker", row_condition=Column("status") == StubStatus.CONFIRMED.value
            ),
            *[
                gxe.ExpectColumnValuesToNotBeNull(column=c, row_condition=ROCKETMQ_CONFIRMED)
                for c in ("queue_id", "queue_offset")
            ],
            gxe.ExpectColumnValuesToBeBetween(
                column="created_at", min_value=param("min_timestamp_ms")
            ),
            not_before("updated_at", "created_at"),
        ],
    )


def message_log_suite() -> gx.ExpectationSuite:
    """One row per delivery; a known outcome, finished after received when finished."""
    return gx.ExpectationSuite(
        name=MESSAGE_LOG,
        expectations=[
            *not_null(["cluster", "id", "msg_id", "topic", "group", "client_id", "received_at"]),
            *_unique(TABLES["message_log"].key),
            *legal_names(["topic", "group"], ROCKETMQ_ROWS),
            gxe.ExpectColumnValuesToBeInSet(column="outcome", value_set=LOG_OUTCOMES),
            gxe.ExpectColumnValuesToBeInSet(column="system", value_set=SYSTEMS),
            gxe.ExpectColumnValuesToBeInSet(column="settle", value_set=[s.value for s in Settle]),
            # A delivery with an outcome has finished: the two are written together.
            gxe.ExpectColumnValuesToNotBeNull(
                column="finished_at", row_condition=Column("outcome").is_not_null()
            ),
            not_before("finished_at", "received_at"),
            # RocketMQ's retry bound (a RabbitMQ queue counts deliveries without one).
            gxe.ExpectColumnValuesToBeBetween(
                column="reconsume_times",
                min_value=0,
                max_value=param("max_reconsume_times"),
                row_condition=ROCKETMQ_ROWS,
            ),
            *at_least(0, ["queue_id", "queue_offset"]),
            gxe.ExpectColumnValuesToBeBetween(
                column="received_at", min_value=param("min_timestamp_ms")
            ),
        ],
    )


_TIMESTAMP_DOC = "timestamps are epoch milliseconds at least this large"
STUB_SPEC = SuiteSpec(
    MESSAGE_STUB,
    message_stub_suite,
    STUB_DEFAULTS,
    (
        *("cluster", "msg_id", "topic", "status", "send_count", "broker", "queue_id"),
        *("queue_offset", "system"),
    ),
    doc={
        "max_send_count": "send_count in [0, max_send_count]",
        "min_timestamp_ms": _TIMESTAMP_DOC,
    },
)
LOG_SPEC = SuiteSpec(
    MESSAGE_LOG,
    message_log_suite,
    LOG_DEFAULTS,
    (
        "cluster",
        "id",
        "msg_id",
        "group",
        "client_id",
        "broker",
        "queue_id",
        "queue_offset",
        "outcome",
        "system",
    ),
    doc={
        "max_reconsume_times": "reconsume_times in [0, max_reconsume_times]",
        "min_timestamp_ms": _TIMESTAMP_DOC,
    },
)
