"""`audit_transactions`: the `transactions` table's faults as of the audit's time.

A transaction's state as of T comes from its times (committed by T, else an op by T: rolled
back, else moved to TRANS_CHECK_MAX_TIME_TOPIC by T and not resumed since: gave up, else
pending; its check count and half units are the ingest's):
- `half_stuck`: pending, its first half unit stored `stuck_ms` or more before T; cause
  `never_checked` (no check-back re-appended it: no producer of its group was connected) or
  `check_unresolved` (checked, still unknown). count: half units stored.
- `check_gave_up`: gave up; cause `transaction_check_max`. count: checks made.
- `committed_twice`: two or more committed units; cause `end_transaction_repeated` (both
  commit one half unit: END_TRANSACTION arrived twice) or `commit_of_rechecked_half` (the
  half and its check-back re-append were committed each). count: committed units.
- `rolled_back_but_delivered`, per consumer group: rolled back, yet the group received its
  UNIQ_KEY; cause `sent_outside_transaction` when the real topic holds a copy no commit
  wrote, else `no_committed_copy`. count: deliveries to the group.
- `committed_never_consumed`, per consumer group that takes the real topic (received any
  message of it) and whose SQL92 expression, if it has one, selects the message
  (`filter_audit.not_selected`): committed, never delivered to the group; cause
  `offset_passed_without_delivery` when the group's committed offset (latest snapshot) is
  past the committed unit, else `offset_not_reached`. count 1.

Both `rolled_back_but_delivered` and `committed_twice` must be zero on a healthy broker.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker_runtime.common import findings
from pipeline import audit_schemas
from pipeline.transforms.audit_common import conform, latest_offsets, position_text
from pipeline.transforms.transactions import tx_state


def _as_of(transactions: DataFrame, as_of_ms: int) -> DataFrame:
    """Transactions begun by T, with their state at T."""

    def by(col: str) -> Column:
        return F.col(col).isNotNull() & (F.col(col) <= as_of_ms)

    return transactions.filter(F.col("half_ts") <= as_of_ms).withColumns(
        {
            "state": tx_state(
                by("commit_ts"),
                by("op_ts"),
                by("gave_up_ts") & (F.col("gave_up_ts") >= F.col("last_half_ts")),
            ),
            "age_ms": F.greatest(F.lit(as_of_ms) - F.col("half_ts"), F.lit(0)),
            "last_ts": F.greatest("last_half_ts", "op_ts", "commit_ts", "gave_up_ts"),
            "msg_id": F.col("uniq_key"),
        }
    )


def _row(kind: str, cause: Column, count: Column, group: Column, detail: Column) -> list[Column]:
    return [
        F.lit(kind).alias("kind"),
        cause.alias("cause"),
        count.cast("long").alias("count"),
        group.alias("group"),
        detail.alias("detail"),
    ]


def _common() -> list[Column | str]:
    """The columns every finding takes from its transaction."""
    names = ["msg_id", "producer_group", "topic", "cluster", "broker", "queue_id"]
    names.append("half_queue_offset")
    return [*names, "checks", "state", F.col("half_ts").alias("first_ts"), "last_ts", "age_ms"]


def _no_group() -> Column:
    return F.lit(None).cast("string")


def _without_group(tx: DataFrame, stuck_ms: int) -> DataFrame:
    stuck = tx.filter((F.col("state") == findings.TX_PENDING) & (F.col("age_ms") >= stuck_ms))
    stuck = stuck.select(
        *_common(),
        F.lit(None).cast("long").alias("queue_offset"),
        *_row(
            findings.HALF_STUCK,
            F.when(F.col("checks") == 0, findings.NEVER_CHECKED).otherwise(
                findings.CHECK_UNRESOLVED
            ),
            F.col("half_units"),
            _no_group(),
            F.format_string(
                "half message of %s pending for %d ms after %d check(s): no op, no commit",
                F.col("producer_group"),
                F.col("age_ms"),
                F.col("checks"),
            ),
        ),
    )
    gave_up = tx.filter(F.col("state") == findings.TX_GAVE_UP).select(
        *_common(),
        F.lit(None).cast("long").alias("queue_offset"),
        *_row(
            findings.CHECK_GAVE_UP,
            F.lit(findings.TRANSACTION_CHECK_MAX),
            F.greatest(F.col("checks"), F.lit(1)),
            _no_group(),
            F.format_string(
                "moved to TRANS_CHECK_MAX_TIME_TOPIC after %d check(s) of %s",
                F.col("checks"),
                F.col("producer_group"),
            ),
        ),
    )
    twice = tx.filter((F.col("state") == findings.TX_COMMITTED) & (F.col("commits") >= 2))
    twice = twice.select(
        *_common(),
        F.col("commit_queue_offset").alias("queue_offset"),
        *_row(
            findings.COMMITTED_TWICE,
            F.when(F.col("commit_offsets") > 1, findings.COMMIT_OF_RECHECKED_HALF).otherwise(
                findings.END_TRANSACTION_REPEATED
            ),
            F.col("commits"),
            _no_group(),
            F.format_string(
                "%d committed units of %d half unit(s)", F.col("commits"), F.col("commit_offsets")
            ),
        ),
    )
    return stuck.unionByName(gave_up).unionByName(twice)


def _per_group(
    tx: DataFrame,
    messages: DataFrame,
    log: DataFrame,
    offsets: DataFrame,
    unselected: DataFrame,
    as_of_ms: int,
) -> DataFrame:
    # Only the transactions' messages and topics are looked up: most of a lake is neither.
    keys = tx.select("cluster", "msg_id").distinct()
    seen = log.filter(F.col("received_at") <= as_of_ms)
    deliveries = (
        seen.join(keys, on=["cluster", "msg_id"], how="left_semi")
        .groupBy("cluster", "group", "msg_id")
        .agg(F.count(F.lit(1)).alias("deliveries"))
    )
    outside = (
        messages.filter(F.col("uniq_key").isNotNull() & (F.col("store_ts") <= as_of_ms))
        .select("cluster", F.col("uniq_key").alias("msg_id"), "topic")
        .join(keys, on=["cluster", "msg_id"], how="left_semi")
        .distinct()
        .withColumn("outside", F.lit(True))
    )
    rolled = (
        tx.filter(F.col("state") == findings.TX_ROLLED_BACK)
        .join(deliveries, on=["cluster", "msg_id"], how="inner")
        .join(outside, on=["cluster", "msg_id", "topic"], how="left")
        .select(
            *_common(),
            F.lit(None).cast("long").alias("queue_offset"),
            *_row(
                findings.ROLLED_BACK_BUT_DELIVERED,
                F.when(F.col("outside"), findings.SENT_OUTSIDE_TRANSACTION).otherwise(
                    findings.NO_COMMITTED_COPY
                ),
                F.col("deliveries"),
                F.col("group"),
                F.format_string(
                    "rolled back, delivered %d time(s) to the group", F.col("deliveries")
                ),
            ),
        )
    )
    topics = tx.select("cluster", "topic").distinct()
    takers = (
        seen.join(topics, on=["cluster", "topic"], how="left_semi")
        .select("cluster", "group", "topic")
        .distinct()
    )
    latest = latest_offsets(offsets).select(
        "group", "cluster", "broker", "topic", "queue_id", "committed_offset"
    )
    where = position_text(
        F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("commit_queue_offset")
    )
    never = (
        tx.filter(F.col("state") == findings.TX_COMMITTED)
        .join(takers, on=["cluster", "topic"], how="inner")
        .join(deliveries, on=["cluster", "group", "msg_id"], how="left_anti")
        .join(unselected, on=["cluster", "group", "msg_id"], how="left_anti")
        .join(latest, on=["group", "cluster", "broker", "topic", "queue_id"], how="left")
        .select(
            *_common(),
            F.col("commit_queue_offset").alias("queue_offset"),
            *_row(
                findings.COMMITTED_NEVER_CONSUMED,
                F.when(
                    F.col("committed_offset") > F.col("commit_queue_offset"),
                    findings.OFFSET_PASSED_WITHOUT_DELIVERY,
                ).otherwise(findings.OFFSET_NOT_REACHED),
                F.lit(1),
                F.col("group"),
                F.format_string(
                    "committed at %s, never delivered; the group's offset there is %s",
                    where,
                    F.coalesce(F.col("committed_offset").cast("string"), F.lit("none")),
                ),
            ),
        )
    )
    return rolled.unionByName(never)


def audit_transactions(
    transactions: DataFrame,
    messages: DataFrame,
    log: DataFrame,
    offsets: DataFrame,
    unselected: DataFrame,
    as_of_ms: int,
    stuck_ms: int,
) -> DataFrame:
    """The `audit_transactions` table; `unselected`: `filter_audit.not_selected`."""
    tx = _as_of(transactions, as_of_ms)
    return (
        _without_group(tx, stuck_ms)
        .unionByName(_per_group(tx, messages, log, offsets, unselected, as_of_ms))
        .transform(conform(audit_schemas.AUDIT_TRANSACTIONS, as_of_ms))
    )
