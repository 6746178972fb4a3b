"""One explicit StructType per audit table (the audits' side of pipeline.schemas).

Every audit table starts with the finding columns `msg_id` (UNIQ_KEY; null where a row is not
about one message), `group` (null where not per consumer group), `kind`, `cause` and `count`,
and ends with `as_of_ms`, the run's clock. Each table is rewritten whole by every audit run.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pipeline.schemas import struct_of

FINDING = "msg_id:str, group:str, kind:str, cause:str, count:long"

AUDIT_DUPLICATES = struct_of(
    f"{FINDING}, topic:str, broker:str, queue_id:int, queue_offset:long, first_ts:long,"
    " last_ts:long, clients:str, consumed:long, detail:str, as_of_ms:long"
)

AUDIT_LOSSES = struct_of(
    f"{FINDING}, topic:str, broker:str, queue_id:int, queue_offset:long, first_ts:long,"
    " last_ts:long, committed_offset:long, min_offset:long, detail:str, as_of_ms:long"
)

AUDIT_LAG = struct_of(
    f"{FINDING}, topic:str, broker:str, broker_id:int, queue_id:int, snapshot_ts:long,"
    " committed_offset:long, max_offset:long, lag_messages:long, lag_ms:long, stuck_ms:long,"
    " status:str, first_ts:long, as_of_ms:long"
)

# One element per retry copy the broker stored in %RETRY%{group}, oldest first.
RETRY_STEP = StructType(
    [
        StructField("reconsume_times", IntegerType(), True),
        StructField("store_ts", LongType(), True),
        StructField("broker", StringType(), True),
        StructField("queue_offset", LongType(), True),
    ]
)
_DEAD_LETTER_HEAD = struct_of(
    f"{FINDING}, topic:str, broker:str, queue_id:int, queue_offset:long, original_topic:str,"
    " origin_msg_id:str, first_ts:long, last_ts:long, age_ms:long, retries:int"
)
_DEAD_LETTER_TAIL = struct_of(
    "deliveries:long, last_outcome:str, replayed:bool, replay_status:str, replayed_at:long,"
    " as_of_ms:long"
)
AUDIT_DEAD_LETTERS = StructType(
    [
        *_DEAD_LETTER_HEAD.fields,
        StructField("retry_chain", ArrayType(RETRY_STEP, True), True),
        *_DEAD_LETTER_TAIL.fields,
    ]
)

_STUB_COLUMNS = (
    "topic:str, tags:str, keys:str, body_hash:str, broker:str, queue_id:int, queue_offset:long,"
    " send_count:int, next_resend_at:long, created_at:long, updated_at:long"
)
RESEND_CANDIDATES = struct_of(f"{FINDING}, {_STUB_COLUMNS}, max_log_offset:long, as_of_ms:long")
MANUAL_HANDLING = struct_of(f"{FINDING}, {_STUB_COLUMNS}, in_message_log:bool, as_of_ms:long")

CONSISTENCY = struct_of(
    f"{FINDING}, topic:str, broker:str, broker_id:int, queue_id:int, queue_offset:long,"
    " phys_offset:long, first_ts:long, last_ts:long, detail:str, as_of_ms:long"
)

# The replay ledger of the DLQ replay DAG (built in a later issue): read when present.
DLQ_REPLAY_LOG = struct_of(
    "replay_id:str, msg_id:str, group:str, topic:str, status:str, reason:str,"
    " new_offset:long, ts:long"
)

AUDIT_TABLES: dict[str, StructType] = {
    "audit_duplicates": AUDIT_DUPLICATES,
    "audit_losses": AUDIT_LOSSES,
    "audit_lag": AUDIT_LAG,
    "audit_dead_letters": AUDIT_DEAD_LETTERS,
    "resend_candidates": RESEND_CANDIDATES,
    "manual_handling": MANUAL_HANDLING,
    "consistency": CONSISTENCY,
}

# Kinds per table. Where the workload's truth.json has a kind, the audit uses its name.
STORED_TWICE = "stored_twice"
DELIVERED_TWICE = "delivered_twice"
DUPLICATE_EFFECT = "duplicate_effect"  # two CONSUMED outcomes: processed twice, not just seen
RETRIED_THEN_OK = "retried_then_ok"
LOST_AFTER_ACK = "lost_after_ack"
NEVER_DELIVERED = "never_delivered"
EXPIRED_BEFORE_CONSUMED = "expired_before_consumed"
DEAD_LETTERED = "dead_lettered"
LAG = "lag"
RESEND_DUE = "resend_due"
MAX_SEND_COUNT = "max_send_count"
CQ_WITHOUT_MESSAGE = "cq_without_message"
OFFSET_REGRESSION = "offset_regression"
QUEUE_OFFSET_GAP = "queue_offset_gap"

# Why a message reached one group more than once (audit_duplicates.cause).
RETRY_AFTER_FAILURE = "retry_after_failure"
PRODUCER_RESEND = "producer_resend"
REBALANCE_OVERLAP = "rebalance_overlap"
REDELIVERY_AFTER_RESTART = "redelivery_after_restart"
OFFSET_NOT_COMMITTED = "offset_not_committed"

# Why a message is lost (audit_losses.cause) or dead-lettered (audit_dead_letters.cause).
ABSENT_FROM_COMMITLOG = "absent_from_commitlog"
ABSENT_AFTER_DELIVERY = "absent_from_commitlog_after_delivery"
OFFSET_PASSED_WITHOUT_DELIVERY = "offset_passed_without_delivery"
FILE_DELETED_BEFORE_DELIVERY = "file_deleted_before_delivery"
MAX_RECONSUME_TIMES = "max_reconsume_times"
SENT_TO_DLQ_DIRECTLY = "sent_to_dlq_directly"

LAG_STATUSES = ("OK", "WARN", "STALLED", "STOPPED")

KINDS: dict[str, tuple[str, ...]] = {
    "audit_duplicates": (STORED_TWICE, DELIVERED_TWICE, DUPLICATE_EFFECT, RETRIED_THEN_OK),
    "audit_losses": (LOST_AFTER_ACK, NEVER_DELIVERED, EXPIRED_BEFORE_CONSUMED),
    "audit_lag": (LAG,),
    "audit_dead_letters": (DEAD_LETTERED,),
    "resend_candidates": (RESEND_DUE,),
    "manual_handling": (MAX_SEND_COUNT,),
    "consistency": (CQ_WITHOUT_MESSAGE, OFFSET_REGRESSION, QUEUE_OFFSET_GAP),
}
