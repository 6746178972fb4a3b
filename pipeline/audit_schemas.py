"""One explicit StructType per audit and remediation table (the catalog: pipeline.lake).

Every audit table starts with the finding columns `msg_id` (UNIQ_KEY; null where a row is not
about one message), `group` (null where not per consumer group), `kind`, `cause` and `count`,
and ends with `as_of_ms`, the run's clock, then the columns added later: `system`, whose
finding it is (rocketmq or rabbitmq; for RabbitMQ `group` is the queue and `topic` the
exchange), and `cluster`, the cluster the finding is about (see pipeline.schemas). Each table
is rewritten whole by every audit run.
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
    " last_ts:long, clients:str, consumed:long, detail:str, as_of_ms:long, system:str,"
    " cluster:str"
)

AUDIT_LOSSES = struct_of(
    f"{FINDING}, topic:str, broker:str, queue_id:int, queue_offset:long, first_ts:long,"
    " last_ts:long, committed_offset:long, min_offset:long, detail:str, as_of_ms:long,"
    " system:str, cluster:str"
)

AUDIT_LAG = struct_of(
    f"{FINDING}, topic:str, broker:str, broker_id:int, queue_id:int, snapshot_ts:long,"
    " committed_offset:long, max_offset:long, lag_messages:long, lag_ms:long, stuck_ms:long,"
    " status:str, first_ts:long, as_of_ms:long, system:str, cluster:str"
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
    " as_of_ms:long, system:str, death:str, cluster:str"
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
RESEND_CANDIDATES = struct_of(
    f"{FINDING}, {_STUB_COLUMNS}, max_log_offset:long, as_of_ms:long, system:str, cluster:str"
)
MANUAL_HANDLING = struct_of(
    f"{FINDING}, {_STUB_COLUMNS}, in_message_log:bool, as_of_ms:long, system:str, cluster:str"
)

CONSISTENCY = struct_of(
    f"{FINDING}, topic:str, broker:str, broker_id:int, queue_id:int, queue_offset:long,"
    " phys_offset:long, first_ts:long, last_ts:long, detail:str, as_of_ms:long, system:str,"
    " cluster:str"
)

# One row per stub a resend run acted on (see pipeline.remediation.resend_plan); `system`
# (added later, null: rocketmq) whose stub it is; a RabbitMQ row's `broker` is the vhost.
RESEND_LOG = struct_of(
    "run_id:str, msg_id:str, topic:str, action:str, reason:str, send_count:int,"
    " next_resend_at:long, broker:str, queue_id:int, new_offset:long, ts:long, system:str,"
    " cluster:str"
)

# One row per replay event of the DLQ replay (see pipeline.remediation.replay_plan); the
# audit reads it to mark dead letters replayed. Added later: `system` (null: rocketmq); for
# RabbitMQ `group` is the queue the message died in, `topic` the exchange it goes back to.
DLQ_REPLAY_LOG = struct_of(
    "replay_id:str, msg_id:str, group:str, topic:str, status:str, reason:str,"
    " new_offset:long, ts:long, system:str, cluster:str"
)

# One row per repair event of a lost_after_ack loss (pipeline.jobs.repair), as the replay
# log: planned, sent (where the broker stored the copy), skipped or failed and why.
REPAIR_LOG = struct_of(
    "repair_id:str, msg_id:str, topic:str, status:str, reason:str, broker:str, queue_id:int,"
    " new_offset:long, ts:long, cluster:str"
)

# One row per transaction finding (pipeline.transforms.transaction_audit); `group` is the
# consumer group for the per-group kinds, null for the others.
AUDIT_TRANSACTIONS = struct_of(
    f"{FINDING}, producer_group:str, topic:str, broker:str, queue_id:int, queue_offset:long,"
    " half_queue_offset:long, checks:int, state:str, first_ts:long, last_ts:long, age_ms:long,"
    " detail:str, as_of_ms:long, system:str, cluster:str"
)

# One row per (message, group) a group's SQL92 expression was applied to wrongly
# (pipeline.transforms.filter_audit); `expression` is the group's, from consumer_filters.
AUDIT_FILTERS = struct_of(
    f"{FINDING}, topic:str, broker:str, queue_id:int, queue_offset:long, expression:str,"
    " first_ts:long, last_ts:long, committed_offset:long, detail:str, as_of_ms:long, system:str,"
    " cluster:str"
)
