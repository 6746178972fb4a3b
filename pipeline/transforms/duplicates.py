"""`audit_duplicates`: messages stored twice, and messages delivered to one group more than once
with the reason each extra delivery happened.

Each delivery after a group's first of a message is explained by the one before it:
1. the one before failed (RECONSUME_LATER / FAILED): `retry_after_failure`, as designed;
2. it came from another stored copy (another queue position): `producer_resend`;
3. another client delivered the one before, and both clients were taking messages from that
   queue at overlapping times: `rebalance_overlap` (two owners of one queue, seed 000);
4. the one before never finished (the consumer died holding it): `redelivery_after_restart`;
5. the one before was CONSUMED but its offset was not committed: `offset_not_committed`.
A group's row is `delivered_twice` when any extra delivery is not a retry, with the cause of
the first such; `retried_then_ok` when all extras were retries and the last one was CONSUMED.
Two or more CONSUMED outcomes add a `duplicate_effect` row: the work was done twice, where a
duplicate delivery alone may have been harmless (an idempotent consumer).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline import audit_schemas as A
from pipeline.transforms.audit_common import (
    CONSUMED,
    FAILURES,
    conform,
    is_retry_topic,
    position_text,
    stored_copies,
)

_GROUP_MSG = ["group", "msg_id"]
_ACTIVITY = ["group", "broker", "topic", "queue_id", "client_id"]


def stored_twice(messages: DataFrame) -> DataFrame:
    """UNIQ_KEYs with two or more stored copies in their topic (producer resend)."""
    copies = stored_copies(messages)
    where = position_text(F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("queue_offset"))
    grouped = copies.groupBy("topic", "uniq_key").agg(
        F.count(F.lit(1)).alias("count"),
        F.array_join(F.array_sort(F.collect_set("broker")), ",").alias("broker"),
        F.min_by(F.struct("queue_id", "queue_offset"), F.struct("store_ts", "phys_offset")).alias(
            "first"
        ),
        F.min("store_ts").alias("first_ts"),
        F.max("store_ts").alias("last_ts"),
        F.array_join(F.array_sort(F.collect_list(where)), ", ").alias("detail"),
    )
    return grouped.filter(F.col("count") >= 2).select(
        F.col("uniq_key").alias("msg_id"),
        F.lit(None).cast("string").alias("group"),
        F.lit(A.STORED_TWICE).alias("kind"),
        F.lit(A.PRODUCER_RESEND).alias("cause"),
        F.col("count"),
        F.col("topic"),
        F.col("broker"),
        F.col("first.queue_id").alias("queue_id"),
        F.col("first.queue_offset").alias("queue_offset"),
        F.col("first_ts"),
        F.col("last_ts"),
        F.lit(None).cast("string").alias("clients"),
        F.lit(None).cast("long").alias("consumed"),
        F.concat(F.lit("copies at "), F.col("detail")).alias("detail"),
    )


def _client_activity(log: DataFrame) -> DataFrame:
    """When each client took messages of a group from a queue: [first receipt, last finish]."""
    return log.groupBy(*_ACTIVITY).agg(
        F.min("received_at").alias("active_from"),
        F.max(F.coalesce("finished_at", "received_at")).alias("active_to"),
    )


def explain_deliveries(log: DataFrame) -> DataFrame:
    """Every delivery with its number within (group, msg_id) and, from the 2nd on, its cause."""
    order = Window.partitionBy(*_GROUP_MSG).orderBy(F.col("received_at"), F.col("id"))
    prev = {f"p_{c}": F.lag(c).over(order) for c in ("outcome", "client_id", "topic")}
    prev["p_position"] = F.lag(F.struct("broker", "topic", "queue_id", "queue_offset")).over(order)
    steps = log.withColumns({"seq": F.row_number().over(order), **prev})
    activity = _client_activity(log)
    mine = activity.select(
        *_ACTIVITY, F.col("active_from").alias("d_from"), F.col("active_to").alias("d_to")
    )
    theirs = activity.select(
        *[F.col(c).alias(f"o_{c}") for c in _ACTIVITY],
        F.col("active_from").alias("o_from"),
        F.col("active_to").alias("o_to"),
    )
    steps = steps.join(mine, on=_ACTIVITY, how="left")
    same_queue_other_client = (
        (F.col("o_group") == F.col("group"))
        & (F.col("o_broker") == F.col("broker"))
        & (F.col("o_topic") == F.col("topic"))
        & (F.col("o_queue_id") == F.col("queue_id"))
        & (F.col("o_client_id") == F.col("p_client_id"))
    )
    steps = steps.join(theirs, on=same_queue_other_client, how="left")
    position = F.struct("broker", "topic", "queue_id", "queue_offset")
    other_copy = (
        ~is_retry_topic(F.col("topic"))
        & ~is_retry_topic(F.col("p_topic"))
        & (position != F.col("p_position"))
    )
    overlap = (
        (F.col("p_client_id") != F.col("client_id"))
        & (F.col("o_from") <= F.col("d_to"))
        & (F.col("d_from") <= F.col("o_to"))
    )
    cause = (
        F.when(F.col("seq") == 1, F.lit(None).cast("string"))
        .when(F.col("p_outcome").isin(FAILURES), A.RETRY_AFTER_FAILURE)
        .when(other_copy, A.PRODUCER_RESEND)
        .when(overlap, A.REBALANCE_OVERLAP)
        .when(F.col("p_outcome").isNull(), A.REDELIVERY_AFTER_RESTART)
        .otherwise(A.OFFSET_NOT_COMMITTED)
    )
    return steps.withColumn("cause", cause).select(*log.columns, "seq", "cause")


def delivered_twice(log: DataFrame) -> DataFrame:
    """Per (group, msg_id) delivered more than once: delivered_twice / retried_then_ok rows,
    plus duplicate_effect rows where two or more deliveries were CONSUMED."""
    steps = explain_deliveries(log)
    extra = F.col("seq") > 1
    not_retry = extra & (F.col("cause") != A.RETRY_AFTER_FAILURE)
    per_msg = steps.groupBy(*_GROUP_MSG).agg(
        F.count(F.lit(1)).alias("count"),
        F.sum(F.when(F.col("outcome") == CONSUMED, 1).otherwise(0)).cast("long").alias("consumed"),
        F.min_by(F.struct("topic", "broker", "queue_id", "queue_offset"), F.col("seq")).alias(
            "first"
        ),
        F.min("received_at").alias("first_ts"),
        F.max("received_at").alias("last_ts"),
        F.array_join(F.array_sort(F.collect_set("client_id")), ",").alias("clients"),
        F.sort_array(F.collect_list(F.when(not_retry, F.struct("seq", "cause")))).alias("causes"),
        F.max(extra & (F.col("cause") == A.RETRY_AFTER_FAILURE)).alias("retried"),
        F.max_by("outcome", "seq").alias("last_outcome"),
        F.array_join(
            F.transform(
                F.sort_array(F.collect_list(F.when(extra, F.struct("seq", "cause")))),
                lambda s: F.format_string("#%d %s", s["seq"], s["cause"]),
            ),
            ", ",
        ).alias("steps"),
    )
    kind = (
        F.when(F.size("causes") > 0, A.DELIVERED_TWICE)
        .when(F.col("retried") & (F.col("last_outcome") == CONSUMED), A.RETRIED_THEN_OK)
        .otherwise(F.lit(None).cast("string"))
    )
    cause = F.when(F.size("causes") > 0, F.col("causes")[0]["cause"]).otherwise(
        A.RETRY_AFTER_FAILURE
    )
    rows = (
        per_msg.filter(F.col("count") >= 2)
        .withColumns({"kind": kind, "cause": cause})
        .filter(F.col("kind").isNotNull())
        .select(
            "msg_id",
            "group",
            "kind",
            "cause",
            F.col("count").cast("long").alias("count"),
            F.col("first.topic").alias("topic"),
            F.col("first.broker").alias("broker"),
            F.col("first.queue_id").alias("queue_id"),
            F.col("first.queue_offset").alias("queue_offset"),
            "first_ts",
            "last_ts",
            "clients",
            "consumed",
            F.format_string("%d deliveries: %s", F.col("count"), F.col("steps")).alias("detail"),
        )
    )
    effects = rows.filter(F.col("consumed") >= 2).withColumns(
        {
            "kind": F.lit(A.DUPLICATE_EFFECT),
            "count": F.col("consumed"),
            "detail": F.format_string("CONSUMED %d times; %s", F.col("consumed"), F.col("detail")),
        }
    )
    return rows.unionByName(effects)


def audit_duplicates(messages: DataFrame, log: DataFrame, as_of_ms: int) -> DataFrame:
    """The `audit_duplicates` table."""
    return (
        stored_twice(messages)
        .unionByName(delivered_twice(log))
        .transform(conform(A.AUDIT_DUPLICATES, as_of_ms))
    )
