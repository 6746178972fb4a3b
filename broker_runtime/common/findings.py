"""The audit's findings vocabulary: each finding kind and cause has its name here, once.

The audit tables' `kind` and `cause` columns hold these names, the workload's truth.json
uses them for what it injected, and reports and demos count by them.
"""

from __future__ import annotations

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

# The kinds the workload's truth.json records (what it injected and can tell from its
# journals); the audit finds these and more.
TRUTH_KINDS = (STORED_TWICE, DELIVERED_TWICE, RETRIED_THEN_OK, DEAD_LETTERED, LOST_AFTER_ACK)

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
