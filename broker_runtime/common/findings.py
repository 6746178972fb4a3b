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
# RabbitMQ's losses the broker does not report (audit_losses; `group` is the queue there).
UNROUTABLE = "unroutable"  # a mandatory publish returned: no queue was bound for it
EXPIRED = "expired"  # its message TTL passed in a queue without a dead-letter exchange
DROPPED_MAXLEN = "dropped_maxlen"  # pushed out of a full queue without a dead-letter exchange
# Transactions (audit_transactions): found in the `transactions` table.
HALF_STUCK = "half_stuck"  # a half message with no op, commit or give-up, past the bound
CHECK_GAVE_UP = "check_gave_up"  # moved to TRANS_CHECK_MAX_TIME_TOPIC after the last check
ROLLED_BACK_BUT_DELIVERED = "rolled_back_but_delivered"
COMMITTED_TWICE = "committed_twice"
COMMITTED_NEVER_CONSUMED = "committed_never_consumed"
# SQL92 subscriptions (audit_filters): the group's expression, from consumerFilter.json.
FILTERED_WRONGLY = "filtered_wrongly"

# Why a message reached one group more than once (audit_duplicates.cause).
RETRY_AFTER_FAILURE = "retry_after_failure"
PRODUCER_RESEND = "producer_resend"
REBALANCE_OVERLAP = "rebalance_overlap"
REDELIVERY_AFTER_RESTART = "redelivery_after_restart"
OFFSET_NOT_COMMITTED = "offset_not_committed"
REQUEUED = "requeued"  # RabbitMQ: nacked or rejected with requeue

# Why a message is lost (audit_losses.cause) or dead-lettered (audit_dead_letters.cause).
ABSENT_FROM_COMMITLOG = "absent_from_commitlog"
ABSENT_AFTER_DELIVERY = "absent_from_commitlog_after_delivery"
OFFSET_PASSED_WITHOUT_DELIVERY = "offset_passed_without_delivery"
FILE_DELETED_BEFORE_DELIVERY = "file_deleted_before_delivery"
MAX_RECONSUME_TIMES = "max_reconsume_times"
SENT_TO_DLQ_DIRECTLY = "sent_to_dlq_directly"
NO_ROUTE = "no_route"  # RabbitMQ: the broker's reply to a returned mandatory publish
NOT_CONSUMED = "not_consumed"  # RabbitMQ: routed to the queue, no delivery logged there
MESSAGE_TTL = "message_ttl"
MAX_LENGTH = "max_length"
# RabbitMQ's dead-letter reasons (x-death), the causes of its dead_lettered findings.
DEATH_REASONS = ("rejected", "expired", "maxlen", "delivery_limit")

# Why a producer stub is due for a resend (resend_candidates.cause).
NEVER_ACKNOWLEDGED = "never_acknowledged"  # no SEND_OK came back: no queue offset known
OFFSET_PASSED_BY_CONSUMERS = "offset_passed_by_consumers"  # acked late; consumers went past

# Whose finding a row is (every audit table's `system`; a row without one is RocketMQ's).
ROCKETMQ = "rocketmq"
RABBITMQ = "rabbitmq"
SYSTEMS = (ROCKETMQ, RABBITMQ)

# Why a transaction is a finding (audit_transactions.cause).
NEVER_CHECKED = "never_checked"  # no check-back re-appended it: no producer of its group
CHECK_UNRESOLVED = "check_unresolved"  # checked, still neither committed nor rolled back
TRANSACTION_CHECK_MAX = "transaction_check_max"  # checked transactionCheckMax times
SENT_OUTSIDE_TRANSACTION = "sent_outside_transaction"  # a copy no commit wrote
NO_COMMITTED_COPY = "no_committed_copy"  # delivered, yet the store holds no copy of it
END_TRANSACTION_REPEATED = "end_transaction_repeated"  # two commits of one half unit
COMMIT_OF_RECHECKED_HALF = "commit_of_rechecked_half"  # commits of the half and its re-append
OFFSET_NOT_REACHED = "offset_not_reached"  # the group's offset stopped before the message

# Why a message was filtered wrongly (audit_filters.cause).
DELIVERED_BUT_EXCLUDED = "delivered_but_excluded"  # the group got it; its expression says no
MATCHED_BUT_SKIPPED = "matched_but_skipped"  # matches; the group's offset passed it, undelivered

# The kinds the workload's truth.json records (what it injected and can tell from its
# journals); the audit finds these and more.
TRUTH_KINDS = (
    STORED_TWICE,
    DELIVERED_TWICE,
    RETRIED_THEN_OK,
    DEAD_LETTERED,
    LOST_AFTER_ACK,
    RESEND_DUE,
    HALF_STUCK,
    CHECK_GAVE_UP,
    ROLLED_BACK_BUT_DELIVERED,
    COMMITTED_TWICE,
    COMMITTED_NEVER_CONSUMED,
    FILTERED_WRONGLY,
)
# Transaction kinds that name no consumer group (the others are per group).
TRANSACTION_KINDS_WITHOUT_GROUP = (HALF_STUCK, CHECK_GAVE_UP, COMMITTED_TWICE)

LAG_STATUSES = ("OK", "WARN", "STALLED", "STOPPED")

KINDS: dict[str, tuple[str, ...]] = {
    "audit_duplicates": (STORED_TWICE, DELIVERED_TWICE, DUPLICATE_EFFECT, RETRIED_THEN_OK),
    "audit_losses": (
        LOST_AFTER_ACK,
        NEVER_DELIVERED,
        EXPIRED_BEFORE_CONSUMED,
        UNROUTABLE,
        EXPIRED,
        DROPPED_MAXLEN,
    ),
    "audit_lag": (LAG,),
    "audit_dead_letters": (DEAD_LETTERED,),
    "resend_candidates": (RESEND_DUE,),
    "manual_handling": (MAX_SEND_COUNT,),
    "consistency": (CQ_WITHOUT_MESSAGE, OFFSET_REGRESSION, QUEUE_OFFSET_GAP),
    "audit_transactions": (
        HALF_STUCK,
        CHECK_GAVE_UP,
        ROLLED_BACK_BUT_DELIVERED,
        COMMITTED_TWICE,
        COMMITTED_NEVER_CONSUMED,
    ),
    "audit_filters": (FILTERED_WRONGLY,),
}

# A transaction's state in the `transactions` table.
TX_COMMITTED = "committed"
TX_ROLLED_BACK = "rolled_back"
TX_GAVE_UP = "gave_up"
TX_PENDING = "pending"
TX_STATES = (TX_COMMITTED, TX_ROLLED_BACK, TX_GAVE_UP, TX_PENDING)
# What one counted finding of each kind is, as the reports and the demo's summary say it.
COUNTS: dict[str, str] = {
    STORED_TWICE: "messages with two or more stored copies (one UNIQ_KEY, several positions)",
    DELIVERED_TWICE: "(message, group) pairs: a group got the message again, not as a retry",
    DUPLICATE_EFFECT: "(message, group) pairs: the group consumed the message successfully "
    "twice or more (the work was done twice)",
    RETRIED_THEN_OK: "(message, group) pairs: failed, retried as designed, then consumed",
    LOST_AFTER_ACK: "messages the broker acknowledged to the producer that no commitlog holds",
    NEVER_DELIVERED: "(message, group) pairs: the group's offset passed the message, "
    "which it never received",
    EXPIRED_BEFORE_CONSUMED: "(message, group) pairs: the message's file was deleted "
    "before the group received it",
    DEAD_LETTERED: "(message, group) pairs in the group's %DLQ% topic",
    RESEND_DUE: "producer stubs due for a resend (sent, never confirmed)",
    MAX_SEND_COUNT: "producer stubs at the max send count: a person decides",
    LAG: "(group, queue) pairs at their latest snapshot",
    UNROUTABLE: "RabbitMQ publishes returned by the broker: no queue was bound for them",
    EXPIRED: "(message, queue) pairs: the message's TTL passed in a queue without a DLX",
    DROPPED_MAXLEN: "(message, queue) pairs: pushed out of a full queue without a DLX",
    HALF_STUCK: "half messages past the bound with no commit, rollback or give-up",
    CHECK_GAVE_UP: "transactions the check-back gave up on (TRANS_CHECK_MAX_TIME_TOPIC)",
    ROLLED_BACK_BUT_DELIVERED: "(message, group) pairs: rolled back, yet the group got it",
    COMMITTED_TWICE: "transactions whose half message was committed more than once",
    COMMITTED_NEVER_CONSUMED: "(message, group) pairs: committed, never received by the group",
    FILTERED_WRONGLY: "(message, group) pairs: delivered though the group's SQL92 expression "
    "excludes it, or matching it and passed by the group's offset without delivery",
}
